"""One BLS call in flight: the payload the backend runs on a stub's behalf (python_be's infer payload).

    BlsRequest ─▶ BlsCall.start ─▶ target checks ─▶ Core.infer_stream(request) ─▶ ResponseStream
                  (registered)                                                     │
    caller stub ◀─ BlsResponse ◀─ outputs copied into the caller's p2s (one copy), ◀┘
                                  or inline in the frame when small
                                  then the target's response is released (its s2p, its credit)

GPU outputs the target exported by CUDA IPC (the caller asked for them on that GPU) are not
copied: the caller gets a claim on the export instead and maps it (features.bls.device_exports).
GPU inputs the caller exported (a target that takes them, features.bls.device_inputs) are held
by the call until it ends; the target's stub claims them with its request.

Inputs are views of the caller's s2p arena for the whole call; the final BlsResponse is sent only
when nothing reads them any more (the target request has been placed and has ended, or never ran),
and the stub frees them when it sees that final. Exactly one final is sent per call, unless the
caller died.

Decoupled calls are flow-controlled: at most BLS_CREDIT_WINDOW responses may be forwarded ahead
of the stub's iterator (it returns a credit per response taken); a caller that takes none for the
stub timeout gets its request cancelled with an error saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.bls.payloads import REGISTRY, PayloadKey
from pystub_backend.backend.inference import ExportGoneError, InferRequest, InferResponse, RequestedOutput, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.ipc import tensors
from pystub_backend.ipc.arena import ArenaFullError, ArenaWriter
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.bls import BLS_CREDIT_WINDOW, BlsRequest, BlsResponse
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireError, WireResponse, WireTensor
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.instance import ModelInstance
    from pystub_backend.backend.supervision.services import ServedVersion, StubFacingCore
    from pystub_backend.backend.supervision.stub_process import StubProcess

Checks = Callable[[], "ServerError | None"]

__all__ = ["BlsCall", "build_request", "CANCELLED_TEXT"]

log = logging.getLogger("pystub.bls")

CANCELLED_TEXT = "Request was cancelled"
_FINAL = msg.RESPONSE_FINAL


def build_request(caller: StubProcess, message: BlsRequest) -> InferRequest:
    """The InferRequest of a BLS frame; its tensors view the caller's s2p arena (no copy).

    Raises ValueError for a corrupt frame (a handle outside the arena, a bad parameters JSON).
    """
    request = message.request  # a pystub_backend.ipc.records.WireRequest
    request_id, wire_inputs, requested = request.id, request.inputs, request.requested_outputs
    parameters_json, correlation_id, flags, timeout_us = (request.parameters_json, request.correlation_id,
                                                          request.flags, request.timeout_us)
    if caller.s2p is None:
        raise ValueError(f"stub '{caller.instance_name}' has no s2p arena")
    parameters = json.loads(parameters_json) if parameters_json and parameters_json != "{}" else {}
    if not isinstance(parameters, dict):
        raise ValueError("BLS request parameters must be a JSON object")
    # Last: the caller's GPU inputs are registered and held here (BlsCall drops them when it ends).
    inputs = caller.services.device_exports.outputs(caller, wire_inputs, caller.s2p.view)
    if timeout_us:
        parameters["timeout"] = int(timeout_us)  # the server's queue policies read it; the model too
    return InferRequest(message.model_name, message.model_version, request_id, inputs,
                        [RequestedOutput(name) for name in requested], parameters,
                        correlation_id=correlation_id, flags=flags, device_outputs=request.device_outputs)


class BlsCall:
    """A BLS call of `caller` running through `core` (None only for a call that is answered with an
    error by its checks: a stub outside a server)."""

    def __init__(self, core: StubFacingCore | None, caller: StubProcess, message: BlsRequest,
                 request: InferRequest) -> None:
        self.core = core
        self.caller = caller
        self.call_id = message.call_id
        self.key: PayloadKey = (caller.base, message.call_id)
        self.request = request
        self.decoupled = bool(message.decoupled)
        self.trace_context = message.request.trace_context  # the caller's, when it passed request.trace()
        self.holds = bool(message.holds)
        self.stream: ResponseStream | None = None
        self.target: ServedVersion | None = None  # the version its checks found: it serves the call (one lookup)
        self.finished = False  # the final response was sent (or the caller is gone)
        self._task: asyncio.Task[None] | None = None
        self._scheduling = False  # _run waits in the target's queue (Core.infer_stream)
        self._unqueued = False  # cancel() took it out of that queue (a cancel of _run's own task)
        self._held: ModelInstance | None = None  # the caller's ModelInstance while this call holds it
        self._cancel_requested = False
        self._caller_dead = False
        self._unconsumed = 0
        self._credit = asyncio.Event()
        self._timeout = caller.settings.stub_timeout_seconds
        self._device_inputs = [t.device.key for t in request.inputs if t.device is not None]

    @property
    def holding(self) -> bool:
        """The call holds its caller's instance and its target request has not completed."""
        return self.holds and not self.finished and not self._cancel_requested \
            and not (self.stream is not None and self.stream.finished)

    def start(self, checks: Checks) -> None:
        """Register and run. `checks()` returns a ServerError to answer with instead, or None.
        Raises KeyError when the stub already has a call with this id."""
        REGISTRY.add(self.key, self)
        if self.holds and self.core is not None:
            self._held = _instance_of(self.core, self.caller)
            if self._held is not None:
                self._held.hold(self.caller)
        self._task = asyncio.get_running_loop().create_task(self._run(checks))

    def _release_hold(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release_hold(self.caller)

    def drop_device_inputs(self) -> None:
        """The call ended: its GPU inputs live on only while the target's stub maps them."""
        keys, self._device_inputs = self._device_inputs, []
        for key in keys:
            self.caller.services.device_exports.drop_hold(key)

    # -- the stub's requests -------------------------------------------------------------------------
    def cancel(self) -> None:
        """The caller gave up (iterator.cancel(), a timeout, a dropped iterator)."""
        if self._cancel_requested or self.finished:
            return
        self._cancel_requested = True
        # The caller's execute no longer waits for this call (a timeout moved it on; a cancelled
        # iterator gets at most the target's wind-down, bounded by the stub timeout): its instance
        # takes work again, and deadlock checks no longer count it as held by this call.
        self._release_hold()
        if self.stream is not None:
            self.stream.cancel(keep_responses=True)  # the target sees is_cancelled(), winds down with its final
        elif self._scheduling and self._task is not None:
            self._unqueued = True
            self._task.cancel()  # still waiting for an instance: leave the queue (_schedule answers)
        self._credit.set()

    def credit(self, count: int = 1) -> None:
        self._unconsumed -= count
        if self._unconsumed < BLS_CREDIT_WINDOW:
            self._credit.set()

    def caller_died(self) -> None:
        """The calling stub is gone: stop everything, send nothing (its arenas are dropped whole)."""
        if self._caller_dead:
            return
        self._caller_dead = True
        self.finished = True
        if self.stream is not None:
            self.stream.cancel()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._release_hold()
        self.drop_device_inputs()
        REGISTRY.remove(self.key, self)

    # -- running -------------------------------------------------------------------------------------
    async def _run(self, checks: Checks) -> None:
        trace = self.core.tracer.child(self.trace_context, self.request.model_name) \
            if self.core is not None and self.trace_context else None
        self.request.trace = trace
        if trace is not None:
            trace.request_start()
        try:
            stream = await self._schedule(checks)
            if stream is not None:
                await self._forward_all(stream)
        except asyncio.CancelledError:
            pass  # the caller died (nothing to send) or the server is stopping
        except Exception:  # a bug here must still end the call for the waiting model
            log.exception("BLS call %s of stub '%s' failed", self.call_id, self.caller.instance_name)
            await self._send_final_error(ServerError("internal error while running the BLS request", Status.INTERNAL))
        finally:
            if trace is not None:
                trace.finish()
            self.finished = True
            self._release_hold()
            self.drop_device_inputs()
            REGISTRY.remove(self.key, self)

    async def _schedule(self, checks: Checks) -> ResponseStream | None:
        """The target's response stream, or None after answering with an error."""
        error = checks() if not self._cancel_requested else ServerError(CANCELLED_TEXT, Status.CANCELLED)
        if error is None and self.core is not None:  # checks refuse every call without a core
            # A cancel meanwhile cancels this task where it waits in the target's queue, which
            # takes the request out of it; the call still owes the caller its final response.
            self._scheduling = True
            try:
                self.stream = await self.core.infer_stream(self.request, self.target)
            except asyncio.CancelledError:
                if not self._unqueued or self._caller_dead or _uncancel(self._task) > 0:
                    raise  # the caller died, or the server stops: nothing to answer
                error = ServerError(CANCELLED_TEXT, Status.CANCELLED)
            except ServerError as exc:
                error = ServerError(f"Model {self.request.model_name} - Error when running inference: "
                                    f"{exc.message}", exc.status)
            finally:
                self._scheduling = False
        if error is not None:
            await self._send_final_error(error)
            return None
        if self._cancel_requested and self.stream is not None:
            self.stream.cancel(keep_responses=True)
        return self.stream

    async def _forward_all(self, stream: ResponseStream) -> None:
        # After a cancel the caller still gets everything the target sends, ending with the
        # target's own final response, as on Triton; a stub that abandoned the call releases them.
        while True:
            response = await self._next(stream)
            if response is None:
                break
            if self._caller_dead:
                response.release()
                continue
            if self.decoupled and not await self._wait_for_credit(stream):
                response.release()  # the caller stopped reading: it was told, the target cancelled
                return
            await self._forward(response)
            if response.final:
                return
        if not self._caller_dead:  # ended without a final we could forward: cancelled or abandoned
            await self._send_final_error(ServerError(CANCELLED_TEXT, Status.CANCELLED))

    async def _next(self, stream: ResponseStream) -> InferResponse | None:
        if not self._cancel_requested:
            return await stream.next()
        # Cancelled: the target should wind down; a target that ignores the cancel is not waited for
        # beyond the stub timeout (it was placed already, so the caller's inputs are free to go).
        try:
            return await asyncio.wait_for(stream.next(), self._timeout)
        except asyncio.TimeoutError:
            return None

    async def _wait_for_credit(self, stream: ResponseStream) -> bool:
        """Wait until the caller's iterator is less than a window behind. False when it read
        nothing for the stub timeout: the target is cancelled and the caller gets the final."""
        while self._unconsumed >= BLS_CREDIT_WINDOW:
            self._credit.clear()
            try:
                await asyncio.wait_for(self._credit.wait(), self._timeout)
            except asyncio.TimeoutError:
                stream.cancel()
                await self._send_final_error(ServerError(
                    f"BLS response iterator of model '{self.request.model_name}' was not read: "
                    f"{BLS_CREDIT_WINDOW} responses waited {self._timeout:g} s; the request was cancelled.",
                    Status.UNAVAILABLE))
                return False
        return True

    async def _forward(self, response: InferResponse) -> None:
        """Copy the response's outputs into the caller's p2s (one copy), release the target's
        response, send it."""
        if not self.caller.alive:
            response.release()
            self.caller_died()
            return
        flags = _FINAL if response.final else 0
        placed: list[WireTensor] = []
        wire: WireResponse
        p2s = self.caller.p2s
        try:
            if response.flags_only:
                wire = WireResponse(self.call_id, flags, None, [], None)
            elif response.error is not None:
                wire = WireResponse(self.call_id, flags, WireError(int(response.error.status), response.error.message),
                                    [], _parameters_json(response))
            else:
                try:
                    if p2s is None:
                        raise ArenaFullError(f"stub '{self.caller.instance_name}' has no p2s arena")
                    budget = tensors.InlineBudget()  # small outputs ride in the frame: nothing to free
                    for tensor in response.outputs:  # else a fresh allocation each: the stub frees each one
                        placed.append(self._place(p2s, tensor, budget))
                    wire = WireResponse(self.call_id, flags, None, placed, _parameters_json(response))
                except (ArenaFullError, ExportGoneError) as exc:
                    self._free(placed)
                    placed = []
                    wire = WireResponse(self.call_id, flags, WireError(int(Status.INTERNAL), str(exc)), [], "{}")
        finally:
            response.release()  # the target's s2p bytes and its send credit
        if await self._send(BlsResponse(self.call_id, wire)):
            self._unconsumed += 1
            if response.final:
                self.finished = True
                self._release_hold()
        else:
            self._free(placed)

    def _place(self, p2s: ArenaWriter, tensor: Tensor, budget: tensors.InlineBudget) -> WireTensor:
        """The output as the caller gets it: inline in the frame while `budget` lasts and it is
        small, else copied into its p2s, or, for GPU memory the target exported, a claim on the
        export (the caller maps it; no copy). Raises ArenaFullError, ExportGoneError."""
        shape = list(tensor.shape)
        device = tensor.device
        if device is None:
            return tensors.place(p2s, tensor.name, tensor.datatype, shape, tensor.data, budget)
        return self.caller.services.device_exports.claim_tensor(
            tensor, self.caller, f"output of model '{self.request.model_name}'")

    async def _send_final_error(self, error: ServerError) -> None:
        if self.finished or self._caller_dead:
            return
        final = WireResponse(self.call_id, _FINAL, WireError(int(error.status), error.message), [], "{}")
        if await self._send(BlsResponse(self.call_id, final)):
            self.finished = True
            self._release_hold()

    async def _send(self, message: BlsResponse) -> bool:
        if not self.caller.alive:
            self.caller_died()
            return False
        try:
            await self.caller.send(message, self._timeout)
            return True
        except (ChannelClosedError, ChannelTimeoutError, OSError) as exc:
            log.error("BLS call %s: cannot reach stub '%s': %s", self.call_id, self.caller.instance_name, exc)
            self.caller_died()
            return False

    def _free(self, placed: list[WireTensor]) -> None:
        p2s = self.caller.p2s
        for wire in placed:
            if wire.handle[0] == tensors.INLINE_TAG:  # in the frame: nothing was allocated
                continue
            if wire.handle[0] == DEVICE_HANDLE_TAG:  # a claim the caller never got
                self.caller.services.device_exports.release_unsent(self.caller, [wire])
                continue
            try:
                if p2s is not None:
                    p2s.free(wire.handle)
            except (KeyError, IndexError, ValueError, TypeError, AttributeError):
                pass


def _uncancel(task: asyncio.Task[None] | None) -> int:
    """Withdraw the cancel that cancel() made; the cancels still pending (another's: shutdown).
    Python 3.10 counts no cancels: there the task just goes on."""
    uncancel = getattr(task, "uncancel", None)
    return int(uncancel()) if uncancel is not None else 0


def _instance_of(core: StubFacingCore, stub: StubProcess) -> ModelInstance | None:
    """The ModelInstance whose current stub is `stub`, if any."""
    for version in core.versions_of(stub.model_name):
        for instance in getattr(version, "instances", ()):
            if instance.stub is stub:
                return instance
    return None


def _parameters_json(response: InferResponse) -> str:
    return json.dumps(response.parameters) if response.parameters else "{}"
