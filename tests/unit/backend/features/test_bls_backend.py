"""The backend's BLS bookkeeping: the payload registry (pystub_backend/backend/features/bls/payloads.py) and the
deadlock check (pystub_backend/backend/features/bls/deadlock.py), against fake stubs and models."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pystub_backend.backend.features.bls import payloads as payload_registry
from pystub_backend.backend.features.bls.deadlock import deadlock_reason
from pystub_backend.backend.features.bls.payloads import PayloadRegistry


class Payload:
    def __init__(self, caller: Any, request: Any = None, holding: bool = True) -> None:
        self.caller = caller
        self.request = request
        self.holding = holding
        self.died = 0

    def caller_died(self) -> None:
        self.died += 1


def test_registry_add_get_remove_and_duplicates():
    registry = PayloadRegistry()
    stub = SimpleNamespace(alive=True)
    first, second = Payload(stub), Payload(stub)
    registry.add(("s", 1), first)
    registry.add(("s", 2), second)
    with pytest.raises(KeyError, match="BLS call 1 of stub 's' is already in flight"):
        registry.add(("s", 1), second)
    assert registry.get(("s", 1)) is first and len(registry) == 2
    assert list(registry.of_caller(stub)) == [first, second]
    registry.remove(("s", 1), second)  # not the registered payload: stays
    assert registry.get(("s", 1)) is first
    registry.remove(("s", 1))
    registry.remove(("s", 2), second)
    assert len(registry) == 0


def test_the_sweeper_ends_the_calls_of_dead_callers(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(payload_registry, "SWEEP_SECONDS", 0.01)

    async def main() -> None:
        registry = PayloadRegistry()
        dead, alive = SimpleNamespace(alive=False), SimpleNamespace(alive=True)
        gone, staying = Payload(dead), Payload(alive)
        registry.add(("dead", 1), gone)
        registry.add(("alive", 1), staying)
        await asyncio.sleep(0.05)
        assert gone.died >= 1 and staying.died == 0
        registry.remove(("dead", 1))
        registry.remove(("alive", 1))
        await asyncio.sleep(0.05)
        assert registry._sweeper is not None and registry._sweeper.done()  # it stops when empty

    asyncio.run(main())


# -- deadlock ------------------------------------------------------------------------------------------
class Stub:
    def __init__(self, name: str) -> None:
        self.instance_name = name
        self._requests: list[Any] = []

    def runs(self, request: Any) -> None:
        self._requests.append(request)

    def requests_in_flight(self) -> list[Any]:
        return list(self._requests)


class Core:
    """Models with their instances' stubs, as pystub_backend.backend.core.Core.model_versions() shows them."""

    def __init__(self, **models: int) -> None:
        self.stubs = {name: [Stub(f"{name}_0_{i}") for i in range(count)] for name, count in models.items()}

    def model_versions(self) -> list[Any]:
        return [SimpleNamespace(name=name, instances=[SimpleNamespace(healthy=True, stub=s) for s in stubs])
                for name, stubs in self.stubs.items()] + [SimpleNamespace(name="ens", instances=[])]

    def versions_of(self, name: str) -> list[Any]:
        return [version for version in self.model_versions() if version.name == name]


def call(core: Core, caller: Stub, target: str, runner: Stub | None = None, holding: bool = True) -> Payload:
    """A call in flight from `caller` to `target`, running on `runner` (or still queued)."""
    request = SimpleNamespace(model_name=target)
    if runner is not None:
        runner.runs(request)
    return Payload(caller, request, holding)


def test_a_model_calling_itself_with_one_instance():
    core = Core(a=1)
    (a0,) = core.stubs["a"]
    reason = deadlock_reason(core, [], a0, "a", holds=True)
    assert reason is not None and reason.startswith("BLS deadlock: the request to model 'a' can never run: every "
                                                    "instance of 'a' (a_0_0) is inside an execute that waits")
    assert deadlock_reason(core, [], a0, "a", holds=False) is None  # from a decoupled model's thread


def test_a_cycle_through_another_model():
    core = Core(a=1, b=1)
    (a0,), (b0,) = core.stubs["a"], core.stubs["b"]
    a_to_b = call(core, a0, "b", runner=b0)
    assert deadlock_reason(core, [a_to_b], b0, "a", holds=True) is not None
    # From a thread of b's own, b's execute is not held: it can answer a, and a then frees.
    assert deadlock_reason(core, [a_to_b], b0, "a", holds=False) is None
    done = call(core, a0, "b", runner=None, holding=False)  # the held call's target has completed
    assert deadlock_reason(core, [done], b0, "a", holds=True) is None


def test_a_free_instance_breaks_the_cycle_but_two_held_chains_do_not():
    core = Core(a=2, b=2)
    a0, a1 = core.stubs["a"]
    b0, b1 = core.stubs["b"]
    first = call(core, a0, "b", runner=b0)
    assert deadlock_reason(core, [first], b0, "a", holds=True) is None  # a_0_1 is free
    second = call(core, a1, "b", runner=b1)
    back = call(core, b0, "a")  # b_0_0's call to a, queued: waits for a free a
    reason = deadlock_reason(core, [first, second, back], b1, "a", holds=True)
    assert reason is not None and "(a_0_0, a_0_1)" in reason


def test_chains_that_end_somewhere_free_are_fine():
    core = Core(a=1, b=1, c=1)
    (a0,), (b0,), (c0,) = core.stubs["a"], core.stubs["b"], core.stubs["c"]
    a_to_b = call(core, a0, "b", runner=b0)
    b_to_c = call(core, b0, "c", runner=c0)
    assert deadlock_reason(core, [a_to_b, b_to_c], c0, "b", holds=True) is not None  # c → b, b waits on c
    assert deadlock_reason(core, [a_to_b], b0, "c", holds=True) is None
    assert deadlock_reason(core, [a_to_b], b0, "ens", holds=True) is None  # ensembles have no instances
    assert deadlock_reason(core, [a_to_b], b0, "unknown", holds=True) is None
