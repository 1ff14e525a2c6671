"""BLS in the stub: `pb_utils.InferenceRequest.exec()` / `async_exec()` (docs/reference/model-api.md#bls).

    exec ──▶ inputs into s2p (this stub writes it) ──▶ BlsRequest ──▶ backend ──▶ target model
    response ◀── InferenceResponse over p2s views ◀── BlsResponse (receiver thread) ◀──┘

BLS is enabled once `initialize` succeeded and refused again from `finalize` on (the "ready" and
"finalizing" phases), as in the original: `BLS is only supported during the 'execute' function.`
Calls from other threads (a decoupled model's workers) work in between.

Every wait has a deadline: the request's `timeout` when it has one, else the stub timeout; on
expiry the call is cancelled and the model gets an error response, never a hang. A decoupled call
returns a `ResponseIterator`; each `next()` waits at most that long for the next response. The
backend sends exactly one final response per call, after it stopped reading the inputs, which are
freed then (also for a call the model gave up on). `async_exec` awaits the same call natively on
the caller's event loop instead of blocking a thread of the loop's executor.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from pystub_backend.devices.interface import DeviceError
from pystub_backend.devices.numbering import device_numbering
from pystub_backend.ipc.arena import ArenaFullError
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.bls import BlsInspect, BlsInspectDone, BlsRequest, BlsResponse
from pystub_backend.ipc.records import WireError, WireRequest, WireResponse, WireTensor
from pystub_backend.ipc.status import Status
from pystub_backend.stub import device_outputs, pb_utils
from pystub_backend.stub.features import device_ipc
from pystub_backend.stub.features.bls_outputs import Cleanup, error_response, response_from_wire
from pystub_backend.stub.handlers import StubHandlers
from pystub_backend.stub.pb_utils import _runtime

__all__ = ["BlsClient", "inspect", "register", "release_claim"]

_FINAL = msg.RESPONSE_FINAL


class _Call:
    """One call as the stub sees it: responses queue up here as the receiver thread gets them."""

    __slots__ = ("id", "model_name", "decoupled", "timeout", "timeout_is_requests", "inputs", "responses",
                 "notify", "wake_on_first", "abandoned", "done", "device", "exports")

    def __init__(self, call_id: int, model_name: str, decoupled: bool, timeout: float,
                 timeout_is_requests: bool) -> None:
        self.id = call_id
        self.model_name = model_name
        self.decoupled = decoupled
        self.timeout = timeout  # seconds each wait for a response may take
        self.timeout_is_requests = timeout_is_requests  # else the stub timeout
        self.inputs: list[list[int]] = []
        self.exports: list[list[Any]] = []  # GPU inputs exported (the backend releases them once sent)
        self.responses: queue.SimpleQueue[WireResponse] = queue.SimpleQueue()
        self.notify: Callable[[], None] | None = None  # async callers: wakes the awaiting coroutine
        self.wake_on_first = False  # notify on the first response (decoupled), else on the final
        self.abandoned = False  # the model stopped waiting; responses are dropped on arrival
        self.done = False  # the model has taken the final response
        self.device: int | None = None  # PreferredMemory(GPU, id): outputs are delivered on that GPU


class BlsClient:
    """The stub's `_runtime.BlsHandler`."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self._calls: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.cleanup = Cleanup(stub.send)

    # -- the BlsHandler protocol -------------------------------------------------------------------
    def exec(self, request: Any, decoupled: bool) -> Any:
        if decoupled:
            return self._iterator(self._start(request, decoupled))
        # execute's own thread reads its answer itself when it can (stub.reader, HANDLER): a call
        # of host tensors only (GPU memory crosses by exports whose releases the receiver orders)
        reading = self._stub.reading if threading.current_thread() is threading.main_thread() else None
        if reading is None or not _host_only(request) or not reading.read_in_handler():
            return self._single(self._start(request, decoupled))
        try:
            call = self._start(request, decoupled)
            return self._single(call, read=True)
        finally:
            reading.stop_reading_in_handler()

    def async_exec(self, request: Any, decoupled: bool) -> Any:
        return self._async_exec(request, decoupled)

    async def _async_exec(self, request: Any, decoupled: bool) -> Any:
        """Yield to the event loop until the call's final response (default mode) or its first
        response (decoupled: as on Triton, the iterator is handed out once one is there), so that
        other coroutines of the instance run meanwhile."""
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()

        def wake() -> None:
            if not arrived.done():
                arrived.set_result(None)

        def notify() -> None:  # receiver thread: the awaited response is in
            loop.call_soon_threadsafe(wake)

        call = self._start(request, decoupled, notify, wake_on_first=decoupled)
        try:
            await asyncio.wait_for(asyncio.shield(arrived), call.timeout)
        except asyncio.TimeoutError:
            pass  # the iterator's first wait, or _single, answers with the timeout error
        if decoupled:
            return self._iterator(call)
        return self._single(call, wait=False)

    # -- starting a call -----------------------------------------------------------------------------
    def _start(self, request: Any, decoupled: bool, notify: Callable[[], None] | None = None,
               wake_on_first: bool = False) -> _Call:
        stub = self._stub
        timeout_us = request.timeout()
        call = _Call(next(self._ids), request._model_name, decoupled,
                     timeout_us / 1e6 if timeout_us else stub.options.send_timeout, bool(timeout_us))
        call.notify, call.wake_on_first = notify, wake_on_first
        call.device = _preferred_device(request)
        try:
            wire_inputs = self._place_inputs(request, call)
        except (ArenaFullError, pb_utils.TritonModelException) as exc:
            return self._fail_locally(call, str(exc))
        version = request._model_version
        wire = WireRequest(call.id, request.request_id(), wire_inputs, sorted(request.requested_output_names()),
                           request.parameters(), request.correlation_id(), request.flags(), timeout_us, None,
                           request.trace().get_context(),  # a traced caller's context: the call is its child
                           call.device)
        with self._lock:
            self._calls[call.id] = call
        try:
            stub.send(BlsRequest(call.id, request._model_name, "" if version < 0 else str(version), wire,
                                 bool(decoupled), self._holds()))
        except (ChannelClosedError, ChannelTimeoutError, OSError) as exc:
            with self._lock:
                self._calls.pop(call.id, None)
            return self._fail_locally(call, f"cannot reach the server: {exc}")
        return call

    def _place_inputs(self, request: Any, call: _Call) -> list[WireTensor]:
        placed: list[WireTensor] = []
        accepts: int | None = None  # the device whose GPU inputs the target takes (-1: none), asked once
        try:
            for tensor in request.inputs():
                datatype, shape, buffer = tensor._wire_payload()
                # Always a fresh allocation (never `tensors.place`, which reuses one the data may
                # already live in): the call frees its input handles when its final arrives.
                if isinstance(buffer, device_outputs.DeviceBuffer):
                    if accepts is None:
                        accepts = device_ipc.device_taking_inputs(request, buffer.device_id)
                    exported = device_ipc.export_input(tensor.name(), datatype, shape, buffer) \
                        if accepts == buffer.device_id else None
                    if exported is not None:  # the target maps it: held until DeviceRelease
                        placed.append(exported)
                        call.exports.append(exported.handle)
                        continue
                    # Otherwise copied to the host once, into that allocation: the target wants its
                    # inputs on the CPU (FORCE_CPU_ONLY_INPUT_TENSORS "yes", Triton's default), runs
                    # on another device, or the server reads the bytes on the way (batching, the
                    # response cache, ensembles); the server has no CUDA context to copy later.
                    handle = list(device_outputs.place(self._stub.s2p, "", datatype, shape, buffer).handle)
                else:
                    handle = list(self._stub.s2p.write(buffer))
                call.inputs.append(handle)
                placed.append(WireTensor(tensor.name(), datatype, list(shape), handle))
        except BaseException:
            self._free_inputs(call)
            self._unexport(call)
            raise
        return placed

    @staticmethod
    def _unexport(call: _Call) -> None:
        """GPU inputs of a call that never reached the backend: nobody else will release them."""
        exports, call.exports = call.exports, []
        for handle in exports:
            device_ipc.unexport(handle)

    def _fail_locally(self, call: _Call, text: str) -> _Call:
        """A call that never reached the backend: its answer is an error response, already final."""
        self._free_inputs(call)
        self._unexport(call)
        call.responses.put(WireResponse(call.id, _FINAL, WireError(int(Status.INTERNAL), text), [], "{}"))
        if call.notify is not None:
            call.notify()
        return call

    def _holds(self) -> bool:
        """Whether the caller's `execute` cannot return before this call ends (deadlock detection,
        and the backend sends the instance no more work meanwhile): a call made on the thread that
        runs `execute`, or, for an `async def execute` in default mode (which the stub awaits), on
        the instance's event loop while an execute is in progress. Calls from the model's own
        threads hold nothing."""
        current = threading.current_thread()
        if current is threading.main_thread():
            return True
        on_loop = getattr(self._stub.loop, "_thread", None) is current
        return on_loop and not self._stub.decoupled and self._stub.control.execute_start != 0.0

    # -- waiting for responses -----------------------------------------------------------------------
    def _single(self, call: _Call, wait: bool = True, read: bool = False) -> Any:
        """The one response of a default-mode call (extra data responses are dropped). `read`:
        this thread reads the channel itself until each response is in (Stub.read_for_reply)."""
        deadline = time.monotonic() + call.timeout
        first = None
        while True:
            if read and not self._stub.read_for_reply(call.responses, deadline):
                return error_response(Status.UNAVAILABLE, f"cannot reach the server: the BLS request to model "
                                      f"'{call.model_name}' got no response: the channel closed")
            try:
                wire = call.responses.get(timeout=max(0.0, deadline - time.monotonic()) if wait else 0)
            except queue.Empty:
                return self._timed_out(call)
            response = response_from_wire(self.cleanup, self._stub.p2s, wire, call.device)
            if first is None and response is not None:
                first = response
            if wire[1] & _FINAL:
                call.done = True
                return first if first is not None else pb_utils.InferenceResponse._create([])

    def _iterator(self, call: _Call) -> Any:
        def receive() -> tuple[Any, bool]:
            try:
                wire = call.responses.get(timeout=call.timeout)
            except queue.Empty:
                return self._timed_out(call), True
            final = bool(wire[1] & _FINAL)
            if final:
                call.done = True
            else:
                self.cleanup.credit(call.id)
            response = response_from_wire(self.cleanup, self._stub.p2s, wire, call.device)
            return (response if response is not None else pb_utils.InferenceResponse._create([])), final

        def cancel() -> None:
            if not call.done and not call.abandoned:
                self.cleanup.cancel(call.id)

        iterator = pb_utils.ResponseIterator(receive, cancel)
        # A dropped iterator cancels its call: the target stops, the backend ends the payload.
        weakref.finalize(iterator, self._dropped, call).atexit = False
        return iterator

    def _dropped(self, call: _Call) -> None:
        if not call.done:
            self._abandon(call)

    def _timed_out(self, call: _Call) -> Any:
        self._abandon(call)
        reason = "the request's timeout" if call.timeout_is_requests else "stub-timeout-seconds"
        return error_response(Status.UNAVAILABLE,
                              f"Request timeout expired: the BLS request to model '{call.model_name}' got no "
                              f"response within {call.timeout:g} s ({reason}); it was cancelled.")

    def _abandon(self, call: _Call) -> None:
        """The model stops waiting: cancel the call; whatever still arrives is released.

        Also runs as a finalizer (a dropped iterator), on whatever thread the collector runs, so
        it takes no lock of ours: flags are plain attribute writes, and the receiver drains the
        queue once more when the final arrives, which covers a response put in meanwhile.
        """
        call.done = True
        call.abandoned = True
        if call.id in self._calls:  # the final is not in yet: stop the target
            self.cleanup.cancel(call.id)
        self._drain(call)

    def _drain(self, call: _Call) -> None:
        while True:
            try:
                wire = call.responses.get_nowait()
            except queue.Empty:
                return
            self._release_outputs(wire)

    # -- frames (receiver thread) --------------------------------------------------------------------
    def on_response(self, message: BlsResponse) -> None:
        wire = message.response
        final = bool(wire[1] & _FINAL)
        with self._lock:
            call = self._calls.pop(message.call_id, None) if final else self._calls.get(message.call_id)
        if call is None or call.abandoned:
            self._release_outputs(wire)
        else:
            call.responses.put(wire)
            if call.wake_on_first and call.notify is not None:
                call.notify()
        if call is not None and final:
            self._free_inputs(call)  # the backend reads them no more
            if call.abandoned:
                self._drain(call)
            elif call.notify is not None:
                call.notify()

    def _release_outputs(self, wire: WireResponse) -> None:
        for wire_tensor in wire[3]:
            self.cleanup.release_output(wire_tensor)

    def _free_inputs(self, call: _Call) -> None:
        inputs, call.inputs = call.inputs, []
        for handle in inputs:
            try:
                self._stub.s2p.free(handle)
            except (KeyError, IndexError, ValueError, TypeError):
                self._stub.log_error(f"BLS call {call.id}: its input handle {handle} was not allocated")

    def in_flight(self) -> int:
        with self._lock:
            return len(self._calls)


def _host_only(request: Any) -> bool:  # noqa: ANN401 - pb_utils.InferenceRequest
    """Whether a call's inputs are all in host memory and it wants its outputs there."""
    return _preferred_device(request) is None and all(tensor.is_cpu() for tensor in request.inputs())


def _preferred_device(request: Any) -> int | None:  # noqa: ANN401 - pb_utils.InferenceRequest
    """The GPU a call's outputs should be delivered on, or None for the CPU (Triton's default)."""
    preferred = request._preferred_memory
    if preferred.preferred_memory_type == int(pb_utils.TRITONSERVER_MEMORY_GPU):
        try:  # the model's CUDA ordinal -> the server's id
            return device_numbering().to_server(int(preferred.preferred_device_id))
        except DeviceError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
    return None


# -- wiring into the stub --------------------------------------------------------------------------
_client: BlsClient | None = None
_inspections: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
_inspection_ids = itertools.count(1)


def release_claim(claim_id: int) -> None:
    """A mapping of another stub's GPU tensor closed (features.device_ipc): tell the backend."""
    if _client is not None:
        _client.cleanup.release_claim(claim_id)


def _enable(stub: Any) -> None:
    global _client
    if _client is None:
        _client = BlsClient(stub)
    _runtime.set_bls_handler(_client)


def _forget(stub: Any) -> None:
    """A forked instance: the client of its template's stub is not this process's; its own
    phases make a new one."""
    global _client
    _client = None


def _disable(stub: Any) -> None:
    _runtime.set_bls_handler(None)


def _on_response(stub: Any, message: BlsResponse) -> None:
    if _client is not None:
        _client.on_response(message)


def _on_inspected(stub: Any, message: BlsInspectDone) -> None:
    waiter = _inspections.get(message.token)
    if waiter is not None:
        waiter.put(message.facts)


def inspect(timeout: float = 10.0) -> dict[str, Any]:
    """pystub extension (diagnostics, leak tests): this stub's BLS bookkeeping and the backend's.

    `calls_in_flight`, `outputs_held` (BLS outputs the model still references), `s2p_used` and
    `s2p_allocations` (this stub's arena), and from the backend: `registry_size` (every stub's calls),
    `caller_calls`, `p2s_used`, `p2s_allocations`; GPU outputs by CUDA IPC: `device_exports` and
    `device_claims` (backend), `device_exports_held` and `device_mappings` (this stub), and `pid`.
    Raises TimeoutError when the backend does not answer.
    """
    client = _client
    if client is None:
        raise RuntimeError("BLS is not enabled in this process (no model initialized yet)")
    stub = client._stub
    token = next(_inspection_ids)
    waiter: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    _inspections[token] = waiter
    try:
        stub.send(BlsInspect(token))
        try:
            facts = dict(waiter.get(timeout=timeout))
        except queue.Empty:
            raise TimeoutError(f"the backend did not answer a BLS inspection within {timeout:g} s") from None
    finally:
        _inspections.pop(token, None)
    facts.update(calls_in_flight=client.in_flight(), outputs_held=client.cleanup.leased,
                 s2p_used=stub.s2p.used, s2p_allocations=stub.s2p.allocation_count, **device_ipc.facts())
    return facts


def register(handlers: StubHandlers) -> None:
    """Wire BLS into a stub: enable `exec` once the model is ready, route the backend's answers."""
    handlers.awaits_reply(BlsRequest)
    handlers.awaits_reply(BlsInspect)
    handlers.on_phase("ready", _enable)
    handlers.on_phase("finalizing", _disable)
    handlers.on_phase("forked", _forget)
    handlers.on_receiver(BlsResponse, _on_response)
    handlers.on_receiver(BlsInspectDone, _on_inspected)
