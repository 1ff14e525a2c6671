"""Instances added to and removed from a running scheduler (a model update that changes only the
instances): an added instance takes queued work at once; a removed one gets no new work and its
`remove_instance` returns only once the executes it runs have returned, each answered; with the
sequence batcher a removed instance keeps the sequences it holds until they end, starts no new
one, and an added one takes the backlog's oldest sequences.

Against scheduling_fakes.FakeInstance (batches answered on the loop when the test lets them);
tests/integration/test_instance_updates_in_place.py runs the same through real stubs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import scheduling_fakes as fakes
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.backend.scheduling.default import PIPELINE_DEPTH, DefaultScheduler
from pystub_backend.backend.scheduling.dynamic import DynamicBatcher
from pystub_backend.backend.scheduling.sequence import SequenceBatcher
from pystub_backend.backend.telemetry.statistics import ModelStatistics

DEADLINE = 10.0


class Instance(fakes.FakeInstance):
    """Each instance holds its batches until its own `hold` is set (a fresh event per test)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.hold = asyncio.Event()

    def ran(self) -> list[str]:
        return [rid for batch in self.batches for rid in batch]


def request(rid: str, **parameters: Any) -> InferRequest:
    return InferRequest("m", id=rid, inputs=[Tensor("INPUT0", "FP32", (1, 1), bytes(4))], parameters=parameters)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait on the loop until `condition()` holds; fail naming `what` after DEADLINE seconds."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)
    try:
        await asyncio.wait_for(poll(), DEADLINE)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out after {DEADLINE} s waiting for {what}") from None


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def run(make: Callable[[list[Instance], ModelStatistics], Any],
        body: Callable[[Any, list[Instance], ModelStatistics], Awaitable[None]], count: int = 1) -> None:
    async def main() -> None:
        instances = [Instance(f"m_0_{n}") for n in range(count)]
        stats = ModelStatistics("m", "1")
        scheduler = make(instances, stats)
        scheduler.start()
        try:
            await asyncio.wait_for(body(scheduler, instances, stats), DEADLINE * 3)
        finally:
            for instance in instances:
                instance.hold.set()
            await scheduler.stop("stopped by the test")

    asyncio.run(main())


def default(instances: list[Instance], stats: ModelStatistics) -> DefaultScheduler:
    return DefaultScheduler(instances, stats)


def dynamic(instances: list[Instance], stats: ModelStatistics) -> DynamicBatcher:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=1)
    config.dynamic_batching.SetInParent()
    return DynamicBatcher(instances, stats, config)


def sequence(instances: list[Instance], stats: ModelStatistics) -> SequenceBatcher:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=1)  # one slot per instance
    config.sequence_batching.max_sequence_idle_microseconds = 60_000_000
    return SequenceBatcher(instances, stats, config)


# -- the default scheduler ------------------------------------------------------------------------

def test_default_an_added_instance_takes_the_queued_work() -> None:
    async def body(scheduler: DefaultScheduler, instances: list[Instance], stats: ModelStatistics) -> None:
        (first,) = instances
        sent = [asyncio.ensure_future(scheduler.schedule(request(f"r{n}"), 1)) for n in range(PIPELINE_DEPTH + 1)]
        await until(lambda: scheduler.queued == 1, "one request queued behind the busy instance")
        added = Instance("m_0_1")
        instances.append(added)
        scheduler.add_instances([added])
        await until(lambda: added.ran() == [f"r{PIPELINE_DEPTH}"], "the added instance to take the queued request")
        added.hold.set()
        first.hold.set()
        assert [r.id for r in await asyncio.gather(*sent)] == [f"r{n}" for n in range(PIPELINE_DEPTH + 1)]

    run(default, body)


def test_default_a_removed_instance_finishes_its_executes_and_takes_no_new_work() -> None:
    async def body(scheduler: DefaultScheduler, instances: list[Instance], stats: ModelStatistics) -> None:
        removed, kept = instances
        running = asyncio.ensure_future(scheduler.schedule(request("running"), 1))
        await until(lambda: removed.ran() == ["running"], "the first request to run on m_0_0")
        removal = asyncio.ensure_future(scheduler.remove_instance(removed))
        later = [asyncio.ensure_future(scheduler.schedule(request(f"later{n}"), 1)) for n in range(3)]
        await until(lambda: len(kept.ran()) == PIPELINE_DEPTH, "the later requests to go to m_0_1")
        await settle()
        assert not removal.done(), "removal returned while an execute still ran on the instance"
        removed.hold.set()
        await asyncio.wait_for(removal, DEADLINE)
        assert (await running).id == "running"
        kept.hold.set()
        assert [r.id for r in await asyncio.gather(*later)] == ["later0", "later1", "later2"]
        assert removed.ran() == ["running"] and stats.success.count == 4

    run(default, body, count=2)


# -- the dynamic batcher --------------------------------------------------------------------------------

def test_dynamic_a_removed_instance_finishes_its_batch_and_an_added_one_serves() -> None:
    async def body(batcher: DynamicBatcher, instances: list[Instance], stats: ModelStatistics) -> None:
        (removed,) = instances
        running = asyncio.ensure_future(batcher.schedule(request("running"), 1))
        await until(lambda: removed.ran() == ["running"], "the first batch to run on m_0_0")
        added = Instance("m_0_1")
        instances.append(added)
        batcher.add_instances([added])
        removal = asyncio.ensure_future(batcher.remove_instance(removed))
        later = asyncio.ensure_future(batcher.schedule(request("later"), 1))
        await until(lambda: added.ran() == ["later"], "the next batch to go to the added instance")
        await settle()
        assert not removal.done(), "removal returned while a batch still ran on the instance"
        removed.hold.set()
        added.hold.set()
        await asyncio.wait_for(removal, DEADLINE)
        assert [(await running).id, (await later).id] == ["running", "later"]
        after = await batcher.schedule(request("after"), 1)
        assert after.id == "after" and removed.ran() == ["running"] and added.ran() == ["later", "after"]

    run(dynamic, body)


# -- the sequence batcher ----------------------------------------------------------------------------------

def step(batcher: SequenceBatcher, rid: str, sequence_id: int, start: bool = False, end: bool = False
         ) -> asyncio.Future[Any]:
    return asyncio.ensure_future(batcher.schedule(request(rid, sequence_id=sequence_id, sequence_start=start,
                                                          sequence_end=end), 1))


def test_sequence_a_removed_instance_ends_its_sequences_first_and_starts_none() -> None:
    """As Triton 2.51: the removed instance's sequence runs on there to its END; a sequence started
    meanwhile waits for a slot of a kept instance (the removed one's free slot is not given); the
    removal ends with the removed instance's last sequence."""
    async def body(batcher: SequenceBatcher, instances: list[Instance], stats: ModelStatistics) -> None:
        removed, kept = instances
        for instance in instances:
            instance.hold.set()
        await step(batcher, "a0", 1, start=True)
        await step(batcher, "b0", 2, start=True)
        assert (removed.ran(), kept.ran()) == (["a0"], ["b0"])
        removal = asyncio.ensure_future(batcher.remove_instance(removed))
        started_meanwhile = step(batcher, "c0", 3, start=True)
        await step(batcher, "a1", 1)
        await settle()
        assert not removal.done() and not started_meanwhile.done()
        await step(batcher, "a2", 1, end=True)
        await asyncio.wait_for(removal, DEADLINE)
        assert removed.ran() == ["a0", "a1", "a2"]
        await settle()
        assert not started_meanwhile.done(), "a new sequence took the removed instance's slot"
        await step(batcher, "b1", 2, end=True)
        assert (await asyncio.wait_for(started_meanwhile, DEADLINE)).id == "c0"
        assert kept.ran() == ["b0", "b1", "c0"]

    run(sequence, body, count=2)


def test_sequence_an_idle_removed_instance_goes_at_once() -> None:
    async def body(batcher: SequenceBatcher, instances: list[Instance], stats: ModelStatistics) -> None:
        removed, kept = instances
        kept.hold.set()
        await asyncio.wait_for(batcher.remove_instance(removed), DEADLINE)
        await step(batcher, "b0", 2, start=True)  # m_0_0 had the most free slots: it is gone
        await step(batcher, "b1", 2, end=True)
        assert (removed.ran(), kept.ran()) == ([], ["b0", "b1"])

    run(sequence, body, count=2)


def test_sequence_an_added_instance_takes_the_oldest_waiting_sequences() -> None:
    async def body(batcher: SequenceBatcher, instances: list[Instance], stats: ModelStatistics) -> None:
        (first,) = instances
        first.hold.set()
        await step(batcher, "a0", 1, start=True)
        waiting = step(batcher, "b0", 2, start=True)
        await settle()
        assert not waiting.done() and batcher.queued == 1
        added = Instance("m_0_1")
        added.hold.set()
        instances.append(added)
        batcher.add_instances([added])
        assert (await asyncio.wait_for(waiting, DEADLINE)).id == "b0"
        await step(batcher, "b1", 2, end=True)
        await step(batcher, "a1", 1, end=True)
        assert (first.ran(), added.ran()) == (["a0", "a1"], ["b0", "b1"])

    run(sequence, body)
