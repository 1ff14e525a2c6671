"""A load that changes only a model's instances updates it in place, as Triton 2.51 does
(docs/model-repository.md#updating-the-instances-of-a-loaded-model): through the repository API,
with a config override or after config.pbtxt was edited.

What each case compares, besides every load's answer, the config endpoint's instance groups,
readiness, the index row and the statistics: which instances were initialized (with the
`model_config` each was given) and finalized, in the order of each server's own log where it
matters. The instances' names are Triton's, duplicates included; the `__pycache__` difference is
kept out (instance_events.py says how).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from calls import agree, both
from instance_events import ModelCopy, group
from oracle import Pair

PYSTUB_VARIANTS_RUN = ("single-process",)  # model control: the frontends' protocol work is not involved
PAIR_MODELS = ()  # each test loads its own copy of `instance_events`
_COPIES = itertools.count(1)

# Triton creates the instances of one update concurrently and lists them in the order their
# `initialize` returned: which of those a later update removes is Triton's chance. Each case
# removes instances only where the order is known (created by different updates).


@pytest.fixture()
def copies(pair: Pair, request: pytest.FixtureRequest) -> Iterator[Any]:
    """make(sequence=False): a fresh copy of the model (unloaded from both servers afterwards)."""
    made: list[ModelCopy] = []

    def make(sequence: bool = False) -> ModelCopy:
        name = f"upd{next(_COPIES)}_{re.sub(r'[^a-z]', '', request.node.originalname.split('_')[1])}"
        made.append(ModelCopy(pair, name, sequence))
        return made[-1]

    yield make
    for copy in made:
        both(pair, copy.unload)


def step(copy: ModelCopy, groups: list[dict[str, Any]] | None, what: str, **fields: Any) -> None:
    """Load with these groups (None: from config.pbtxt) on both servers; compare the answers, the
    instances' events, the groups shown and the state."""
    agree(*both(copy.pair, copy.load, groups, **fields))
    copy.agree_on_events(f"after {what}")
    agree(*both(copy.pair, copy.groups_shown))
    agree(*both(copy.pair, copy.state))


def in_thread(answers: list[Any], call: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
    """`call(*args, **kwargs)` in a thread of its own (started), its answer appended to `answers`."""
    thread = threading.Thread(target=lambda: answers.append(call(*args, **kwargs)), daemon=True)
    thread.start()
    return thread


def requests(copy: ModelCopy, count: int) -> None:
    for _ in range(count):
        triton, pystub = both(copy.pair, copy.infer)
        assert triton[0] == pystub[0] == 200, (triton, pystub)


def test_counts_up_and_down_keep_the_other_instances(copies: Any) -> None:
    """1 -> 2 adds m_0_1, handed the config of the first load (count 1); 2 -> 1 removes the OLDEST;
    1 -> 2 again names the new instance m_0_1 beside the kept m_0_1; 2 -> 3 adds m_0_2; 3 -> 2
    removes the first of Triton's list; an unchanged load changes nothing; statistics go on."""
    copy = copies()
    name = copy.name
    step(copy, [group(1)], "the first load")
    requests(copy, 2)
    for count in (2, 1, 2, 3, 2, 2):
        step(copy, [group(count)], f"count {count}")
        requests(copy, 1)
    events = copy.agree_on_events()
    assert events == sorted([("init", f"{name}_0_0#1", "1"), ("init", f"{name}_0_1#1", "1"),
                             ("fini", f"{name}_0_0#1"), ("init", f"{name}_0_1#2", "1"),
                             ("init", f"{name}_0_2#1", "1"), ("fini", f"{name}_0_1#2")]), events


def test_groups_renamed_split_and_changed(copies: Any) -> None:
    """Renaming a group keeps its instances (and their names); a second group of the same settings
    shares them; a group whose settings change (`host_policy`, `passive`) gets new instances;
    removing a group removes its instances."""
    copy = copies()
    step(copy, [group(1)], "the first load")
    step(copy, [group(2)], "count 2")
    step(copy, [group(2, "g")], "the group renamed")
    step(copy, [group(1, "g"), group(2, "h")], "a group of the same settings added")
    step(copy, [group(1, "g"), group(1, "h", host_policy="p")], "a group given a host policy")
    step(copy, [group(1, "h", host_policy="p")], "a group removed")
    requests(copy, 2)
    # Triton sends no request to a passive instance (pystub does: docs/model-config.md): none is sent.
    step(copy, [group(1, "h", host_policy="p"), group(1, "k", passive=True)], "a passive group added")
    step(copy, [group(1, "k", passive=True)], "only the passive group left")


@pytest.mark.parametrize("change", ["parameter", "dynamic_batching"])
def test_any_other_change_reloads_every_instance(copies: Any, change: str) -> None:
    copy = copies()
    step(copy, [group(1)], "the first load")
    requests(copy, 2)
    fields = {"parameter": {"parameters": {"P": {"string_value": "1"}}},
              "dynamic_batching": {"dynamic_batching": {}}}[change]
    step(copy, [group(2)], f"a count and a {change} change", **fields)  # statistics start again
    requests(copy, 1)
    agree(*both(copy.pair, copy.state))


def test_config_file_edits_update_in_place_and_model_file_changes_reload(copies: Any) -> None:
    copy = copies()
    step(copy, None, "the first load")
    copy.write_config([group(2)])
    step(copy, None, "config.pbtxt edited to count 2")
    copy.touch("1/model.py")
    step(copy, None, "model.py changed")  # a full reload: new instances, the config of this load
    copy.write_config([group(3)])
    step(copy, None, "config.pbtxt edited to count 3")
    requests(copy, 1)


def test_an_override_after_a_file_load_updates_in_place(copies: Any) -> None:
    copy = copies()
    step(copy, None, "the first load, from config.pbtxt")
    step(copy, [group(3)], "an override with count 3")
    step(copy, [group(3)], "the same override again")


def test_in_flight_requests_finish_on_a_removed_instance(copies: Any) -> None:
    """Two requests run, one on each instance, when the update removes one: both are answered by
    the instance that ran them, the removed instance is finalized after its request ended, and
    the load returns after that."""
    copy = copies()
    step(copy, [group(1)], "the first load")
    step(copy, [group(2)], "count 2")
    name = copy.name
    for server, endpoint in copy.endpoints().items():
        answers: list[Any] = []
        running = [in_thread(answers, copy.infer, endpoint, 2.0) for _ in range(2)]
        copy.events[server].wait_for(lambda lines: sum(1 for e in lines if e[0] == "start") >= 2,
                                     "both requests to run")
        assert copy.load(endpoint, [group(1)]) == [200, None]
        loaded = copy.events[server].lines()
        for thread in running:
            thread.join(60)
        labels = sorted(copy.events[server].label(answer) for status, answer in answers if status == 200)
        assert labels == [f"{name}_0_0#1", f"{name}_0_1#1"], (server, answers)
        removed = f"{name}_0_0#1"  # the oldest
        end, fini = copy.events[server].order(("end", removed), ("fini", removed))
        assert 0 <= end < fini, (server, copy.events[server].lines())
        assert ["fini", removed] in loaded, f"{server}: the load returned before the removed instance stopped"
    copy.agree_on_events("after the removal")
    agree(*both(copy.pair, copy.state))


def test_a_failed_update_keeps_the_version_serving(copies: Any) -> None:
    """One of two new instances refuses to start: the load fails ("version 1 is at READY state"),
    the one that started is finalized, the version serves on with its old instances and config,
    its index row READY with the reason; the next update that succeeds clears it."""
    copy = copies()
    name = copy.name
    step(copy, [group(1)], "the first load")
    copy.marker("fail", f"{name}_0_2")
    triton, pystub = both(copy.pair, copy.load, [group(3)])
    for answer in (triton, pystub):  # the traceback's layout is each server's own
        answer[1]["error"] = re.sub(r"\n\nAt:\n.*?;\n", ";\n", answer[1]["error"], flags=re.S)
    agree(triton, pystub)
    assert triton == [400, {"error": f"load failed for model '{name}': version 1 is at READY state: Internal: "
                                     f"RuntimeError: instance {name}_0_2 refuses to start;\n"}], triton
    copy.agree_on_events("after the failed update")
    agree(*both(copy.pair, copy.groups_shown))
    triton, pystub = both(copy.pair, copy.state)
    for state in (triton, pystub):
        state[1][0]["reason"] = re.sub(r"\n\nAt:\n.*", "", state[1][0]["reason"], flags=re.S)
    agree(triton, pystub)
    requests(copy, 2)
    copy.marker("-fail")
    step(copy, [group(2)], "an update that succeeds")


def test_the_model_serves_while_new_instances_start(copies: Any) -> None:
    """While the update's new instance initializes, the model is ready, the old instances answer,
    and the config endpoint still shows the old groups."""
    copy = copies()
    step(copy, [group(1)], "the first load")
    copy.marker("slow", "4")
    during = {}
    for server, endpoint in copy.endpoints().items():
        done: list[Any] = []
        loading = in_thread(done, copy.load, endpoint, [group(2)])
        copy.events[server].wait_for(lambda lines: any(e[0] == "slow" for e in lines), "the new instance to start")
        # The state before the inference: Triton 2.51's statistics can lag the response it sent
        # (a loaded run read 0 inferences right after the answer, others 1).
        state = copy.state(endpoint)
        answer = copy.infer(endpoint)
        during[server] = [state, copy.groups_shown(endpoint), answer[0], copy.events[server].label(answer[1])]
        loading.join(60)
        assert done == [[200, None]], (server, done)
    agree(during["triton"], during["pystub"])
    copy.marker("-slow")
    copy.agree_on_events("after the slow update")


# -- sequence models -------------------------------------------------------------------------------------

def seq(copy: ModelCopy, endpoint: Any, sequence_id: int, start: bool = False, end: bool = False) -> list:
    return copy.infer(endpoint, sequence={"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end})


def test_a_removed_sequence_instance_ends_its_sequences_first(copies: Any) -> None:
    """Sequences A (on the oldest instance) and B (on the other); 2 -> 1 removes the oldest, busy
    or not: the load returns at once, A runs on there to its END, a sequence C started meanwhile
    waits for a kept instance's slot (not the removed one's), and the removed instance is
    finalized once A ended."""
    copy = copies(sequence=True)
    name = copy.name
    step(copy, [group(1)], "the first load")
    step(copy, [group(2)], "count 2")
    for server, endpoint in copy.endpoints().items():
        events = copy.events[server]
        answers = [seq(copy, endpoint, 11, start=True), seq(copy, endpoint, 12, start=True)]
        assert copy.load(endpoint, [group(1)]) == [200, None]
        assert not any(e[0] == "fini" for e in events.lines()), f"{server}: removed before its sequence ended"
        answers.append(seq(copy, endpoint, 11))
        waiting: list[Any] = []
        started = in_thread(waiting, seq, copy, endpoint, 13, start=True)
        answers.append(seq(copy, endpoint, 11, end=True))
        events.wait_for(lambda lines: ["fini", f"{name}_0_0#1"] in lines, "the removed instance to stop")
        assert not waiting, f"{server}: a new sequence started before a kept instance had a free slot"
        answers.append(seq(copy, endpoint, 12, end=True))
        started.join(60)
        answers.extend(waiting)
        assert [status for status, _ in answers] == [200] * 6, (server, answers)
        assert [events.label(answer) for _, answer in answers] == \
            [f"{name}_0_0#1", f"{name}_0_1#1", f"{name}_0_0#1", f"{name}_0_0#1", f"{name}_0_1#1",
             f"{name}_0_1#1"], server
        assert seq(copy, endpoint, 13, end=True)[0] == 200
    copy.agree_on_events("after the sequences ended")
    agree(*both(copy.pair, copy.groups_shown))


def test_the_oldest_sequence_instance_is_removed_though_another_is_idle(copies: Any) -> None:
    """Triton 2.51 chooses the instances an update removes by their place in its list alone: with
    a live sequence on the oldest instance and none on the other, the oldest is removed (it ends
    the sequence first) and the idle one kept."""
    copy = copies(sequence=True)
    name = copy.name
    step(copy, [group(1)], "the first load")
    step(copy, [group(2)], "count 2")
    for server, endpoint in copy.endpoints().items():
        events = copy.events[server]
        answers = [seq(copy, endpoint, 21, start=True)]
        assert copy.load(endpoint, [group(1)]) == [200, None]
        answers += [seq(copy, endpoint, 21, end=True), seq(copy, endpoint, 22, start=True, end=True)]
        events.wait_for(lambda lines: ["fini", f"{name}_0_0#1"] in lines, "the removed instance to stop")
        assert [(status, events.label(answer)) for status, answer in answers] == \
            [(200, f"{name}_0_0#1"), (200, f"{name}_0_0#1"), (200, f"{name}_0_1#1")], server
    copy.agree_on_events("after the sequence ended")
    agree(*both(copy.pair, copy.state))
