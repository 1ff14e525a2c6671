"""The rate limiter without a server: the `--rate-limit-resource` syntax (Triton's texts), how many
of a resource there are, the load-time capacity check, and who gets freed resources first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.scheduling.rate_limiter import (
    RateLimitedInstance,
    RateLimiter,
    RateLimitError,
    ResourceLimit,
    parse_resource_limit,
    rate_limited,
    unregister,
)

CPU = 0
GLOBAL = -1


def test_resource_flag_forms() -> None:
    assert parse_resource_limit("R:2") == ResourceLimit("R", 2, None)
    assert parse_resource_limit("R:2:0") == ResourceLimit("R", 2, 0)
    for bad, text in (("R", "option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
                            "Got R"),
                      ("R:1:2:3", "Got R:1:2:3"), ("R:x", "Invalid option value. Got x"),
                      ("R:1:gpu", "Invalid option value. Got gpu"), (":1", "Got :1")):
        with pytest.raises(ValueError, match=text):
            parse_resource_limit(bad)


def test_undeclared_resources_are_the_largest_single_need_of_the_loaded_instances() -> None:
    limiter = RateLimiter([])
    small, big = [{("R", CPU): 1}, {("R", CPU): 2}], [{("R", CPU): 3}]
    limiter.register(small)
    limiter.register(big)
    assert limiter.available(("R", CPU)) == 3
    limiter.unregister(big)  # that model unloaded
    assert limiter.available(("R", CPU)) == 2


def test_declared_resources_and_the_capacity_check() -> None:
    limiter = RateLimiter([ResourceLimit("R", 1), ResourceLimit("S", 4, 0), ResourceLimit("T", 4, 1)])
    assert limiter.available(("R", CPU)) == 1 and limiter.available(("R", GLOBAL)) == 1
    assert limiter.available(("S", CPU)) == 4
    assert limiter.available(("T", CPU)) == 0  # device 1: no such device in pystub
    with pytest.raises(RateLimitError, match='Resource count for "R" is limited to 1 which will prevent scheduling '
                                             'of one or more model instances, the minimum required count is 2'):
        limiter.register([{("S", CPU): 1}, {("R", CPU): 2}])
    assert limiter.available(("S", GLOBAL)) == 0  # all or nothing: S was not registered either


def test_freed_resources_go_to_the_best_priority_then_the_oldest() -> None:
    async def script() -> list[str]:
        limiter = RateLimiter([ResourceLimit("R", 1)])
        needs = {("R", CPU): 1}
        order: list[str] = []
        await limiter.acquire(needs, 1)  # held by "first"

        async def wait(name: str, priority: int) -> None:
            await limiter.acquire(needs, priority)
            order.append(name)
            await asyncio.sleep(0)
            limiter.release(needs)

        tasks = [asyncio.ensure_future(wait(name, priority))
                 for name, priority in (("low-a", 2), ("high-a", 1), ("low-b", 2), ("high-b", 1))]
        await asyncio.sleep(0.01)
        assert order == []  # all wait while "first" holds R
        limiter.release(needs)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(script()) == ["high-a", "high-b", "low-a", "low-b"]


def test_a_waiter_that_does_not_fit_does_not_block_one_that_does() -> None:
    async def script() -> bool:
        limiter = RateLimiter([ResourceLimit("R", 2), ResourceLimit("S", 1)])
        await limiter.acquire({("R", CPU): 1}, 1)
        await limiter.acquire({("S", CPU): 1}, 1)
        big = asyncio.ensure_future(limiter.acquire({("R", CPU): 2}, 1))
        small = asyncio.ensure_future(limiter.acquire({("S", CPU): 1}, 2))
        await asyncio.sleep(0.01)
        limiter.release({("S", CPU): 1})  # small fits now; big still needs the first R back
        await asyncio.wait_for(small, 5)
        done = big.done()
        big.cancel()
        await asyncio.gather(big, return_exceptions=True)
        return done

    assert asyncio.run(script()) is False


def test_a_cancelled_waiter_takes_nothing() -> None:
    async def script() -> int:
        limiter = RateLimiter([ResourceLimit("R", 1)])
        needs = {("R", CPU): 1}
        await limiter.acquire(needs, 1)
        waiter = asyncio.ensure_future(limiter.acquire(needs, 1))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limiter.release(needs)
        await asyncio.wait_for(limiter.acquire(needs, 1), 5)  # free again: nothing leaked to the cancelled one
        return limiter.available(("R", CPU))

    assert asyncio.run(script()) == 1


class _Instance:
    gate = None

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.healthy = True
        self._log = log


async def _run_batch(instance: Any, log: list[str]) -> None:
    """What a scheduler does with an instance's gate around one batch."""
    gate = instance.gate
    await gate.enter()
    log.append(f"start {instance.name}")
    await asyncio.sleep(0)  # the other batch tries its gate meanwhile
    await asyncio.sleep(0)
    log.append(f"end {instance.name}")
    gate.leave()


def test_wrapped_instances_take_turns_and_keep_their_faces() -> None:
    config = model_config_pb2.ModelConfig(name="m")
    group = config.instance_group.add(count=2)
    group.rate_limiter.resources.add(name="R", count=1)
    config.instance_group.add(count=1)  # no resources: not wrapped
    log: list[str] = []
    instances = [_Instance(name, log) for name in ("a", "b", "c")]
    assert rate_limited(instances, config, None) is instances  # --rate-limit=off
    wrapped = rate_limited(instances, config, RateLimiter([]))
    assert wrapped[2] is instances[2] and wrapped[0].name == "a" and wrapped[0].healthy
    assert wrapped[2].gate is None and wrapped[0].gate is not None

    async def both() -> None:
        await asyncio.gather(_run_batch(wrapped[0], log), _run_batch(wrapped[1], log))

    asyncio.run(both())
    assert log in (["start a", "end a", "start b", "end b"], ["start b", "end b", "start a", "end a"])
    assert isinstance(wrapped[0], RateLimitedInstance)
    unregister(wrapped)
    assert wrapped[0].limiter.available(("R", CPU)) == 0
