"""One EXECUTE frame on the stub's main thread: the batch's requests built, the model's `execute`
run (pystub_backend.stub.executor), and one EXECUTE_DONE carrying the responses it returned.

The common request costs only what it uses: its sender (a closure, the sender and its weakref finalizer) is made
when the model first asks for it, and after `execute` only for a request that is still open (the model answers it
later, or dropped it: the finalizer then fails it, docs/reference/model-api.md#decoupled-mode-and-senders); its
requested-output set is built once, on its state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from pystub_backend.ipc.arena import ArenaFullError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.records import WireError, WireRequest, WireResponse, error_to_wire
from pystub_backend.ipc.status import Status
from pystub_backend.ipc.tensors import InlineBudget, arena_handles
from pystub_backend.stub.executor import check_return, failure_text, format_traceback, run_execute
from pystub_backend.stub.rescheduled import report_rescheduled
from pystub_backend.stub.senders import RequestState
from pystub_backend.stub.translate import build_request, response_to_wire

if TYPE_CHECKING:
    from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
    from pystub_backend.ipc.control_block import ControlBlock
    from pystub_backend.stub.batched import BatchedExecute
    from pystub_backend.stub.event_loop import InstanceLoop
    from pystub_backend.stub.rescheduled import RescheduledRequests
    from pystub_backend.stub.senders import RequestRegistry

__all__ = ["run_batch", "ExecutingStub"]


class ExecutingStub(Protocol):
    """The stub (stub/stub.py, which calls `run_batch`) as one batch uses it."""

    instance: str
    model: Any
    model_name: str
    model_version: int
    decoupled: bool
    batched: BatchedExecute | None
    control: ControlBlock
    loop: InstanceLoop
    requests: RequestRegistry
    rescheduled: RescheduledRequests
    busy_until_ns: int  # when the previous batch's EXECUTE_DONE went (msg.ExecuteDone.busy_until_ns)
    p2s: ArenaReader
    s2p: ArenaWriter

    def send(self, message: Any) -> None: ...

    def free(self, handles: list[list[int]]) -> None: ...

    def log_error(self, text: str) -> None: ...

_FINAL = msg.RESPONSE_FINAL


def run_batch(stub: ExecutingStub, message: msg.Execute) -> None:
    """Run one batch and send its EXECUTE_DONE (always: the backend must hear of every batch)."""
    if message.releases:
        stub.free(message.releases)
    requests: list[Any] = []
    states: list[RequestState] = []
    responses: list[WireResponse] = []
    error = None
    stub.control.execute_started()
    try:
        _build_requests(stub, message.requests, requests, states, responses)
        if not requests:  # every request of the batch was refused alone
            return
        result = run_execute(stub.model, requests, stub.decoupled, stub.loop, stub.log_error, stub.batched)
        entries = check_return(result, requests, stub.decoupled, stub.instance)
        budget = InlineBudget()  # small outputs ride in the EXECUTE_DONE frame itself
        for state, entry in zip(states, entries, strict=False):  # decoupled: no entries
            if entry is not None and not state.final:
                stub.requests.close(state)
                responses.append(response_to_wire(state.rid, entry, _FINAL, state.requested, stub.s2p, budget))
        _arm_senders(requests, states)
        report_rescheduled(stub, requests, states)  # pystub sequences: report them before EXECUTE_DONE
    except BaseException as exc:  # noqa: BLE001 - sys.exit() in execute fails this batch only, as on Triton
        text = failure_text(stub.instance, exc)
        stub.log_error(f"{text}\n{format_traceback(exc)}")
        error = error_to_wire(Status.INTERNAL, text)
        for state in states:
            stub.requests.close(state)  # the backend fails every request that is still open
        for response in responses:
            stub.free(arena_handles(response.outputs))
        responses = []
    finally:
        stub.control.execute_finished()
        _send_done(stub, message.batch_id, error, responses)
        stub.busy_until_ns = time.monotonic_ns()


def _arm_senders(requests: list[Any], states: list[RequestState]) -> None:
    """Give every request still open after `execute` its sender: the model answers it later
    through it, or the sender is collected with the request and fails it (senders.py)."""
    for request, state in zip(requests, states, strict=True):
        if not state.final and request._response_sender is None:
            request.get_response_sender()


def _send_done(stub: ExecutingStub, batch_id: int, error: WireError | None, responses: list[WireResponse]) -> None:
    """EXECUTE_DONE; when it is over the frame limit and s2p has no room to spill it, the
    batch fails with the arena's text instead (that frame always fits): the backend must hear
    of every batch, or its requests would wait for their deadline."""
    try:
        stub.send(msg.ExecuteDone(batch_id, error, responses, stub.busy_until_ns))
    except ArenaFullError as exc:
        for response in responses:
            stub.free(arena_handles(response.outputs))
        stub.send(msg.ExecuteDone(batch_id, error_to_wire(Status.INTERNAL, str(exc)), [], stub.busy_until_ns))


def _build_requests(stub: ExecutingStub, wires: list[WireRequest], requests: list[Any], states: list[RequestState],
                    responses: list[WireResponse]) -> None:
    """Fill `requests` and `states` for the wire requests that can be built.

    A request whose inputs cannot be read (a client region that shrank or was replaced under
    it, a corrupt handle) is answered alone with INVALID_ARG in `responses`: it must not fail
    the other requests of its batch."""
    rescheduled = stub.rescheduled
    for wire in wires:
        kept = rescheduled.take(wire.rid) if len(rescheduled) else None  # pystub sequences: runs as itself
        if kept is not None:
            requests.append(kept[0])
            states.append(kept[1])
            continue
        state = stub.requests.open(wire)
        try:
            request = build_request(wire, stub.p2s, stub.model_name, stub.model_version, state)
        except ValueError as exc:
            stub.requests.close(state)
            responses.append(WireResponse(wire.rid, _FINAL, error_to_wire(Status.INVALID_ARG, str(exc)), [], "{}"))
            continue
        requests.append(request)
        states.append(state)
