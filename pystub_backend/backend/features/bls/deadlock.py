"""Refusing a BLS call that can never run: the deadlock Triton leaves hanging.

A stub runs one `execute` at a time. A model whose `execute` waits for a BLS call holds its
instance until that call returns; if the call needs, directly or through other models, a free
instance of a model whose every instance is held that way, nothing can ever move:

    A (1 instance) ─exec→ B ─exec→ A        A_0_0 waits for B, B waits for a free A: forever
    A (1 instance) ─exec→ A                  the same, without the detour

Triton hangs (python_backend documents "circular BLS can deadlock"). pystub checks each new call
before scheduling it and fails it at once when it would wait forever. The check is a fixpoint over
the instances that are held:

    free     = the stubs that hold no BLS call (they will finish what they run)
    repeat:  a held stub joins `free` when every call it holds can complete, i.e. the call's
             request runs on a stub in `free`, or waits for a model with an instance in `free`
    refuse   when no instance of the target model is in `free`

A call "holds" its caller when the stub says so (pystub_backend.ipc.messages.bls.BlsRequest.holds: made on the
thread running `execute`, or while a default-mode `execute` is in progress). Calls made from a
decoupled model's own threads hold nothing, so recursion through them works. Requests that do not
come from BLS, and ensembles (whose steps are separate requests), are taken to complete: the check
only refuses what certainly cannot finish; every other wait is still bounded by the call's deadline.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystub_backend.backend.features.bls.payloads import Payload
    from pystub_backend.backend.inference import InferRequest
    from pystub_backend.backend.supervision.services import StubFacingCore
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["deadlock_reason"]

_Call = tuple["StubProcess | None", str]  # a held call: the stub its request runs on (if sent), its model


def _live_stubs(core: StubFacingCore) -> dict[str, list[StubProcess]]:
    """Model name -> the stubs of its healthy instances (every loaded version)."""
    stubs: dict[str, list[StubProcess]] = {}
    for version in core.model_versions():
        for instance in getattr(version, "instances", ()):
            if instance.healthy and instance.stub is not None:
                stubs.setdefault(version.name, []).append(instance.stub)
    return stubs


def _has_unheld_instance(core: StubFacingCore, model: str) -> bool:
    # ModelInstance.held: an execute of its current stub waits for a BLS call (features.bls.call).
    return any(instance.healthy and not getattr(instance, "held", True)
               for version in core.versions_of(model) for instance in getattr(version, "instances", ()))


def _pending_requests(stub: StubProcess) -> Iterable[InferRequest]:
    # The requests a stub holds (sent to it, final response not yet in).
    return stub.requests_in_flight()


def deadlock_reason(core: StubFacingCore, payloads: Iterable[Payload], caller: StubProcess, target: str,
                    holds: bool) -> str | None:
    """Why a new BLS call from `caller` to model `target` can never run, or None when it can.

    `payloads` are the BLS calls in flight (objects with `caller`, `request`, and `holding`: the
    call holds its caller and its target request has not completed yet).
    """
    if _has_unheld_instance(core, target):
        return None  # the quick answer for nearly every call: an instance of the target is free
    stubs_of = _live_stubs(core)
    targets = stubs_of.get(target)
    if not targets:
        return None  # an ensemble, or not loaded: the lookup reports that
    runs_on: dict[int, StubProcess] = {}
    for stubs in stubs_of.values():
        for stub in stubs:
            for request in _pending_requests(stub):
                runs_on[id(request)] = stub
    held: dict[StubProcess, list[_Call]] = {}  # stub -> [(the stub it waits on or None, model)]
    for payload in payloads:
        if payload.holding:
            held.setdefault(payload.caller, []).append((runs_on.get(id(payload.request)),
                                                        payload.request.model_name))
    if holds:
        held.setdefault(caller, []).append((None, target))
    free = {stub for stubs in stubs_of.values() for stub in stubs if stub not in held}

    def completes(call: _Call) -> bool:
        runner, model = call
        if runner is not None:
            return runner in free
        candidates = stubs_of.get(model)
        return not candidates or any(stub in free for stub in candidates)

    changed = True
    while changed:
        changed = False
        for stub, calls in held.items():
            if stub not in free and all(completes(call) for call in calls):
                free.add(stub)
                changed = True
    if any(stub in free for stub in targets):
        return None
    names = ", ".join(sorted(stub.instance_name for stub in targets))
    return (f"BLS deadlock: the request to model '{target}' can never run: every instance of '{target}' "
            f"({names}) is inside an execute that waits, directly or through other models, for this "
            f"request. Give '{target}' more instances (instance_group count), or make the call from a "
            f"thread of a decoupled model so that it does not hold the instance.")
