"""The routing rules of a multiplexed model's queue (backend/scheduling/multiplex_queue.py): hits first, ids
nobody holds to the idle instance that loses least, stealing from busy holders, no starvation,
random pinning, abandoned work, and waiting workers woken by new work."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from pystub_backend.backend.scheduling.multiplex_queue import AFFINITY, MAX_PASSES, RANDOM, RoutedQueue


class Instance:
    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True
        self.usable = True

    def __repr__(self) -> str:
        return self.name


class View:
    """Which ids each instance holds (LRU first), the cap, and a fixed patience."""

    def __init__(self, held: dict[Instance, list[str]], cap: int = 2, patience: float = 2.0) -> None:
        self.held = held
        self.cap = cap
        self._patience = patience

    def holds(self, instance: Instance, model_id: str) -> bool:
        return model_id in self.held[instance]

    def victim(self, instance: Instance) -> str | None:
        ids = self.held[instance]
        return None if len(ids) < self.cap else ids[0]

    def patience(self) -> float:
        return self._patience


class Request:
    def __init__(self, model_id: str | None) -> None:
        self.parameters = {} if model_id is None else {"multiplexed_model_id": model_id}


class Work:
    def __init__(self, model_id: str | None) -> None:
        self.request = Request(model_id)
        self.future = _Done(False)
        self.model_id = model_id


class _Done:
    def __init__(self, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


def make(held: dict[str, list[str]], policy: str = AFFINITY, patience: float = 2.0,
         idle: tuple[str, ...] = ()) -> tuple[RoutedQueue, dict[str, Instance]]:
    instances = {name: Instance(name) for name in held}
    view = View({instances[name]: ids for name, ids in held.items()}, patience=patience)
    queue = RoutedQueue(list(instances.values()), view, policy, rng=random.Random(0))
    for name in idle:
        queue._idle[id(instances[name])] += 1  # a worker of it waits in get_for
    return queue, instances


def put(queue: RoutedQueue, *model_ids: str | None) -> None:
    for model_id in model_ids:
        queue.put_nowait(Work(model_id))


def take(queue: RoutedQueue, instance: Instance) -> str | None:
    index = queue.pick(instance)
    return None if index is None else queue._take(index).model_id


def test_a_worker_takes_the_work_its_instance_holds_before_older_work() -> None:
    queue, i = make({"a": ["x"], "b": ["y"]})
    put(queue, "y", "z", "x")
    assert take(queue, i["a"]) == "x"
    assert take(queue, i["b"]) == "y"


def test_an_id_nobody_holds_goes_to_the_idle_instance_that_loses_least() -> None:
    queue, i = make({"a": ["hot1", "hot2"], "b": ["rare", "hot3"], "c": ["hot4", "hot5"]}, idle=("a", "b", "c"))
    for model_id in ["hot1", "hot2", "hot3", "hot4", "hot5"] * 5 + ["rare"]:
        queue._count_request(model_id)  # what earlier requests asked for
    put(queue, "new")
    # b would evict "rare", the least asked for of the three instances' LRU sub-models.
    assert take(queue, i["a"]) is None and take(queue, i["c"]) is None
    assert take(queue, i["b"]) == "new"


def test_an_instance_with_room_loads_new_ids_first_and_busy_instances_do_not_count() -> None:
    queue, i = make({"a": ["p", "q"], "b": ["r"]}, idle=("a", "b"))
    put(queue, "new")
    assert take(queue, i["a"]) is None
    queue._idle.pop(id(i["b"]))  # b got busy: a is the only idle instance now
    assert take(queue, i["a"]) == "new"


def test_work_waits_for_a_busy_holder_until_waiting_would_take_longer_than_a_load() -> None:
    queue, i = make({"a": ["hot"], "b": []}, patience=2.0)
    put(queue, "hot", "hot")
    assert take(queue, i["b"]) is None  # two turns ahead for a: not more than the patience
    put(queue, "hot")
    assert take(queue, i["b"]) == "hot"  # the third would wait three turns: b loads it too


def test_stealing_counts_every_holder() -> None:
    queue, i = make({"a": ["hot"], "b": ["hot"], "c": []}, patience=2.0)
    put(queue, *["hot"] * 4)
    assert take(queue, i["c"]) is None  # 4 entries for 2 holders: 2 turns each
    put(queue, "hot", "hot")
    assert take(queue, i["c"]) == "hot"


def test_work_passed_over_too_often_is_taken_by_the_next_free_worker() -> None:
    queue, i = make({"a": ["x"], "b": ["y"]})
    put(queue, "y")
    for _ in range(MAX_PASSES):
        put(queue, "x")
        assert take(queue, i["a"]) == "x"
    put(queue, "x")
    assert take(queue, i["a"]) == "y"


def test_work_without_an_id_goes_to_any_instance_and_an_unhealthy_one_takes_nothing() -> None:
    queue, i = make({"a": ["x"], "b": []}, idle=("b",))
    put(queue, None, "x")
    i["a"].healthy = False
    assert queue.pick(i["a"]) is None
    assert queue.pick(i["b"]) == 0  # the one without an id, the oldest
    i["a"].healthy = True
    assert queue.pick(i["a"]) == 1  # its hit comes first


def test_random_routing_pins_each_entry_to_one_instance() -> None:
    queue, i = make({"a": [], "b": [], "c": []}, policy=RANDOM)
    put(queue, *[f"m{n}" for n in range(30)])
    taken = {name: [] for name in i}
    for name, instance in i.items():
        while (model_id := take(queue, instance)) is not None:
            taken[name].append(model_id)
    assert sorted(sum(taken.values(), [])) == sorted(f"m{n}" for n in range(30))
    assert all(len(ids) >= 3 for ids in taken.values()), taken


def test_random_routing_frees_entries_pinned_to_an_instance_that_is_gone() -> None:
    queue, i = make({"a": [], "b": []}, policy=RANDOM)
    put(queue, *["x"] * 10)
    i["a"].usable = False
    assert [take(queue, i["b"]) for _ in range(10)] == ["x"] * 10


def test_abandoned_work_is_dropped_and_the_asyncio_queue_calls_work() -> None:
    queue, i = make({"a": []})
    put(queue, "x", "y")
    queue._entries[0].work.future = _Done(True)  # its client went away
    assert take(queue, i["a"]) == "y" and queue.empty()
    put(queue, "z")
    assert queue.qsize() == 1 and queue.get_nowait().model_id == "z"


def test_a_waiting_worker_wakes_when_work_arrives() -> None:
    async def scenario() -> Any:
        queue, i = make({"a": []})
        waiting = asyncio.ensure_future(queue.get_for(i["a"]))
        await asyncio.sleep(0.01)
        assert not waiting.done() and queue._idle[id(i["a"])] == 1
        put(queue, "x")
        work = await asyncio.wait_for(waiting, 1.0)
        return work.model_id, dict(queue._idle)

    assert asyncio.run(scenario()) == ("x", {})
