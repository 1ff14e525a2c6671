"""The requests in flight on one stub incarnation: one record per request, keyed by its request id.

    submit(batch, wait=...)  ──▶ inputs into p2s, one _InFlight per request, EXECUTE (FrameLink)
    on_response(wire)        ◀── RESPONSE / responses inside EXECUTE_DONE: to the request's stream
    on_execute_done(done)    ◀── EXECUTE_DONE: the batch's `execute` returned (or raised)
    fail_all(error)              the stub died or stopped: every request in flight fails at once

`submit` is the one way a batch reaches a stub. It never waits: the batch is placed and its
EXECUTE sent before it returns, and the `Submission` it gives back holds each request's outcome
(its ResponseStream, or why it could not be sent) and a future that resolves when the model's
`execute` returned. `wait` says what a full channel does: with `wait=True` the frame waits, in
order, for room (up to the stub timeout, then everything in flight fails); with `wait=False`
nothing is kept and `submit` returns None, for a caller that would rather queue the batch.

A record lives until both its final response is in and `execute` has returned: a decoupled model
may read its inputs from another thread after `execute` returned, as Triton's examples do, so the
p2s memory of the inputs is freed only then. `in_flight` counts the records still awaiting their
final response.

The exchange is built from the stub's frame link, its two arenas and the features' side of this
stub (`ExchangeFeatures`); it owns the outbox of small frames and knows nothing of the process.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import (
    ExportGoneError,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
    model_parameters_json,
    no_release,
)
from pystub_backend.backend.response_stream import Outcome, ResponseStream
from pystub_backend.backend.supervision.frames import FrameLink
from pystub_backend.backend.supervision.outbox import StubOutbox
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc import tensors
from pystub_backend.ipc.arena import ArenaFullError, ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import ChannelClosedError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.records import WireRequest, WireResponse, WireTensor
from pystub_backend.ipc.status import Status

__all__ = ["RequestExchange", "Submission", "ExecuteEnd", "ExchangeFeatures"]

log = logging.getLogger("pystub.stub")


def _small_bytes(data: object, room: int) -> bytes | None:
    """The bytes of a request's small input (at most INLINE_BYTES, and `room`), when they are bytes
    or a contiguous memoryview (what the frontends decode); else None: tensors.place decides."""
    if type(data) is bytes:
        return data if len(data) <= tensors.INLINE_BYTES and len(data) <= room else None
    if type(data) is memoryview and data.c_contiguous and data.nbytes <= tensors.INLINE_BYTES and data.nbytes <= room:
        return data.tobytes()
    return None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ExchangeFeatures(Protocol):
    """What the exchange asks of the features for this one stub (client shared memory, GPU tensors
    of BLS calls); supervision.stub_process binds them to the stub they concern."""

    def region_handle(self, tensor: Tensor) -> list[Any] | None:
        """The region handle of an input that lives in a client region, else None."""

    def attach_regions(self, request: InferRequest, stream: ResponseStream) -> dict[str, list[Any]]:
        """Hold the request's regions until `stream` is final; {output name: region handle}."""

    def claim_input(self, tensor: Tensor) -> WireTensor:
        """A BLS caller's GPU input as the stub maps it. Raises ExportGoneError."""

    def release_unsent(self, wire_inputs: list[WireTensor]) -> None:
        """Claims of inputs that never reached the stub."""

    def outputs(self, wire_outputs: list[WireTensor], view: Callable[[list[Any]], memoryview]) -> list[Tensor]:
        """A response's outputs as Tensors (arena bytes through `view`, GPU exports held)."""

    def discard(self, wire_outputs: list[WireTensor]) -> None:
        """Outputs nobody will take: the stub may drop their GPU exports."""

    def drop_hold(self, key: tuple[str, int]) -> None:
        """A GPU output's consumer is done with it."""


class ExecuteEnd:
    """The end of one batch's `execute` (its EXECUTE_DONE, or the stub's death), and who waits for
    it: callbacks run the moment it comes, in the frame's own turn of the loop."""

    __slots__ = ("callbacks", "over")

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.over = False

    def end(self) -> None:
        if not self.over:
            self.over = True
            callbacks, self.callbacks = self.callbacks, []
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # one waiter's bug must not keep the others from hearing it
                    log.exception("a batch's end callback failed")


class Submission:
    """One submitted batch: per request its outcome, and the batch's timing (complete once its
    `execute` returned). `sent` is False when no request of the batch could be sent (the outcomes
    say why); else `when_executed(callback)` calls `callback()` the moment the model's `execute`
    returned (or the stub died), and `executed()` waits for that."""

    __slots__ = ("outcomes", "timing", "_end")

    def __init__(self, outcomes: list[Outcome], timing: BatchTiming, end: ExecuteEnd | None) -> None:
        self.outcomes = outcomes
        self.timing = timing
        self._end = end

    @property
    def sent(self) -> bool:
        return self._end is not None

    def when_executed(self, callback: Callable[[], None]) -> None:
        """`callback()` once `execute` returned, from the frame that says so (at once if it has)."""
        end = self._end
        if end is None or end.over:
            callback()
        else:
            end.callbacks.append(callback)

    async def executed(self) -> None:
        """Wait until `execute` returned (at once when nothing was sent)."""
        end = self._end
        if end is None or end.over:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        end.callbacks.append(functools.partial(_resolve, future))
        await future


class _InFlight:
    """One request sent to the stub: its stream, the p2s memory of its inputs, its wire form."""

    __slots__ = ("rid", "request", "stream", "input_handles", "executed", "final", "rescheduled", "wire")

    def __init__(self, rid: int, request: InferRequest, stream: ResponseStream) -> None:
        self.rid = rid
        self.request = request
        self.stream = stream
        self.input_handles: list[list[int]] = []
        self.executed = False  # the `execute` call of its batch has returned
        self.final = False  # its final response is in
        self.rescheduled = False  # pystub sequences: runs again as itself in a later batch
        self.wire: WireRequest | None = None  # what EXECUTE carried; sent again if the model reschedules it


class _Batch:
    """A batch whose EXECUTE_DONE is awaited."""

    __slots__ = ("rids", "timing", "staged", "end")

    def __init__(self, rids: list[int], timing: BatchTiming, staged: int) -> None:
        self.rids = rids
        self.timing = timing
        self.staged = staged  # when its inputs were placed (monotonic ns): compute_infer starts here
        self.end = ExecuteEnd()


class RequestExchange:
    def __init__(self, link: FrameLink, p2s: ArenaWriter, s2p: ArenaReader, features: ExchangeFeatures) -> None:
        self._link = link
        self._p2s = p2s
        self._s2p = s2p
        self._features = features
        self.name = link.name
        self._ids = itertools.count(1)
        self._records: dict[int, _InFlight] = {}
        self._batches: dict[int, _Batch] = {}
        self._rescheduled = 0  # records flagged `rescheduled`
        self.served = 0  # requests whose final response carried no error
        self.failed = 0  # requests that ended in an error, or could not be sent
        self.outbox = StubOutbox(link.channel)
        self._budget = tensors.InlineBudget()  # one per exchange, reset for each batch
        link.route(msg.Response, self._on_response_frame)
        link.route(msg.ExecuteDone, self.on_execute_done)
        link.route(msg.Release, self._on_release)

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def in_flight(self) -> int:
        return sum(1 for record in self._records.values() if not record.final)

    def requests(self) -> list[InferRequest]:
        """The requests sent to the stub whose final response is not in yet."""
        return [record.request for record in list(self._records.values()) if not record.final]

    def unhealthy_error(self) -> ServerError:
        return ServerError(f"Stub process '{self.name}' is not healthy.", Status.UNAVAILABLE)

    # -- submit ----------------------------------------------------------------------------------
    def submit(self, requests: list[InferRequest], *, wait: bool) -> Submission | None:
        """Place and send one batch; see the module docstring. With `wait=False`, None (nothing
        kept) when the stub's queue is full, its channel closed, or requests the model
        rescheduled are pending (they go the general way). Never raises."""
        if self._link.channel.closed or (self._rescheduled and not wait):
            return None if not wait else Submission([self.unhealthy_error()] * len(requests), BatchTiming(), None)
        timing = BatchTiming()
        started = time.monotonic_ns()
        outcomes, rids = self._place_batch(requests)
        staged = time.monotonic_ns()
        timing.compute_input_ns = staged - started
        if not rids:
            return Submission(outcomes, timing, None)
        batch = self._send(rids, timing, staged, wait)
        if batch is False:
            self._fail(rids, ServerError("not sent", Status.UNAVAILABLE))  # never seen: frees what they held
            return None
        return Submission(outcomes, timing, None if batch is True else batch.end)

    def _place_batch(self, requests: list[InferRequest]) -> tuple[list[Outcome], list[int]]:
        """Per request its stream (inputs placed in p2s) or why it could not be placed, and the
        rids placed."""
        outcomes: list[Outcome] = []
        rids: list[int] = []
        budget = self._budget  # small inputs ride in the EXECUTE frame itself
        budget.left = tensors.FRAME_INLINE_BYTES
        for request in requests:
            record = self._take_rescheduled(request) if self._rescheduled else None
            try:
                record = record or self.place_request(request, budget)
            except (ArenaFullError, ExportGoneError) as exc:
                outcomes.append(ServerError(str(exc), Status.INTERNAL))
                self.failed += 1
                continue
            rids.append(record.rid)
            outcomes.append(record.stream)
        return outcomes, rids

    def _send(self, rids: list[int], timing: BatchTiming, staged: int, wait: bool) -> _Batch | bool:
        """EXECUTE for the records `rids`: the batch, which ends at EXECUTE_DONE (or death); False
        when `wait` is False and the stub's queue is full (nothing sent, the records still
        placed); True when no request of the batch could be sent (they failed already).

        A request the wire cannot carry (a value validation let through) or whose oversize frame
        finds no room in p2s fails alone, with everything it held freed; the others are sent."""
        batch_id = self.next_id()
        releases = self.outbox.take_releases() if self.outbox.releases else []
        while rids:
            batch = self._batches[batch_id] = _Batch(rids, timing, staged)
            frame = msg.Execute(batch_id, [self._wire(rid) for rid in rids], releases)
            try:
                if wait:
                    self._link.post(frame, self._link_failed)
                    return batch
                if self._link.try_send(frame):
                    return batch
                del self._batches[batch_id]
                self.outbox.release(releases)
                return False
            except (TypeError, ValueError, OverflowError, ArenaFullError) as exc:
                del self._batches[batch_id]
                rids = self._drop_unsendable(rids, exc)
            except ChannelClosedError as exc:
                self._link_failed(exc)
                return batch
        self.outbox.release(releases)  # nothing carried them: they go out in a RELEASE frame
        return True

    def _wire(self, rid: int) -> WireRequest:
        wire = self._records[rid].wire
        assert wire is not None  # set when the record was placed
        return wire

    def _link_failed(self, exc: Exception) -> None:
        """The stub's channel closed (or stayed full past the deadline): everything in flight fails."""
        log.error("stub '%s': %s", self.name, exc)
        self.fail_all(self.unhealthy_error())

    def _drop_unsendable(self, rids: list[int], exc: Exception) -> list[int]:
        """Fail the requests of `rids` that made the batch unsendable; the rest, to send again.

        Each request's wire form is encoded alone (only on this rare path): those the wire refuses
        fail with INVALID_ARG; when p2s could not hold the spilled frame, the largest request fails
        with the arena's text, as a request whose inputs do not fit does."""
        sizes: dict[int, int] = {}
        refused: dict[int, str] = {}
        for rid in rids:
            wire = self._records[rid].wire
            try:
                sizes[rid] = len(msg.encode_record(wire)) if wire is not None else 0
            except (TypeError, ValueError, OverflowError) as error:
                refused[rid] = str(error)
        for rid, text in refused.items():
            self._fail([rid], ServerError(f"the request could not be sent to stub '{self.name}': {text}",
                                          Status.INVALID_ARG), unsent=True)
        if refused:
            return [rid for rid in rids if rid not in refused]
        if isinstance(exc, ArenaFullError) and sizes:
            largest = max(sizes, key=sizes.__getitem__)
            self._fail([largest], ServerError(str(exc), Status.INTERNAL), unsent=True)
            return [rid for rid in rids if rid != largest]
        # the batch frame itself failed although each request encodes: nothing can be singled out
        self._fail(rids, ServerError(f"the batch could not be sent to stub '{self.name}': {exc}", Status.INTERNAL),
                   unsent=True)
        return []

    def _take_rescheduled(self, request: InferRequest) -> _InFlight | None:
        for record in self._records.values():
            if record.rescheduled and record.request is request:
                record.rescheduled, record.executed = False, False
                self._rescheduled -= 1
                return record
        return None

    def place_request(self, request: InferRequest, budget: tensors.InlineBudget | None = None) -> _InFlight:
        """A record for `request` with its inputs in p2s (or inline, while `budget` lasts), and the
        wire form EXECUTE carries it in. Raises ArenaFullError, ExportGoneError (nothing kept)."""
        budget = budget or tensors.InlineBudget()
        rid = self.next_id()
        stream = ResponseStream(request.id, request.model_name, lambda: self._cancel(rid))
        stream.model_version = request.model_version
        record = _InFlight(rid, request, stream)
        features = self._features
        wire_inputs: list[WireTensor] = []
        plain = True  # only plain tensors (no client region, no GPU memory): the common request
        try:
            for tensor in request.inputs:
                if type(tensor) is Tensor and tensor.device is None:  # in the request's own bytes
                    inline = _small_bytes(tensor.data, budget.left)
                    if inline is not None:  # tensors.place's inline case, written out (the usual input)
                        budget.left -= len(inline)
                        wire_inputs.append(WireTensor(tensor.name, tensor.datatype, list(tensor.shape),
                                                      [tensors.INLINE_TAG, inline]))
                        continue
                    placed = tensors.place(self._p2s, tensor.name, tensor.datatype, tensor.shape, tensor.data, budget)
                    wire_inputs.append(placed)
                    if placed.handle[0] != tensors.INLINE_TAG:
                        record.input_handles.append(placed.handle)
                    continue
                plain = False
                if tensor.device is not None:  # a BLS caller's GPU input: the stub maps it (no copy)
                    wire_inputs.append(features.claim_input(tensor))
                    continue
                region = features.region_handle(tensor)
                if region is not None:  # in a client's shm region: the stub maps it, nothing is copied
                    wire_inputs.append(WireTensor(tensor.name, tensor.datatype, list(tensor.shape), region))
                    continue
                placed = tensors.place(self._p2s, tensor.name, tensor.datatype, tensor.shape, tensor.data, budget)
                wire_inputs.append(placed)
                if placed.handle[0] != tensors.INLINE_TAG:
                    record.input_handles.append(placed.handle)
        except (ArenaFullError, ExportGoneError):
            self.free_p2s(record.input_handles)
            features.release_unsent(wire_inputs)
            raise
        # output_regions: outputs the stub writes straight into client regions
        if plain and all(type(output) is RequestedOutput for output in request.outputs):
            output_regions = None
        else:
            output_regions = features.attach_regions(request, stream) or None
        parameters = model_parameters_json(request) if request.parameters else "{}"  # the common request: none
        record.wire = WireRequest(rid, request.id, wire_inputs, [o.name for o in request.outputs],
                                  parameters, request.correlation_id, request.flags,
                                  int(request.parameters.get("timeout", 0) or 0), output_regions,
                                  request.trace.context() if request.trace is not None else None,
                                  request.device_outputs)
        self._records[rid] = record
        return record

    def reschedule(self, rid: int) -> InferRequest | None:
        """pystub sequences (iterative_sequence): the model rescheduled request `rid`. The next
        `submit` given the returned request runs it again under the same rid, stream and inputs.
        None when it is no longer in flight."""
        record = self._records.get(rid)
        if record is None or record.final:
            return None
        if not record.rescheduled:
            record.rescheduled = True
            self._rescheduled += 1
        return record.request

    def _cancel(self, rid: int) -> None:
        record = self._records.get(rid)
        if record is not None and not record.final:
            self.outbox.cancel(rid)

    # -- frames from the stub ------------------------------------------------------------------
    def _on_response_frame(self, message: msg.Response) -> None:
        self.on_response(message.response)

    def _on_release(self, message: msg.Release) -> None:
        self.free_p2s(message.handles)

    def on_response(self, wire: WireResponse) -> None:
        rid, flags, _, outputs, parameters_json = wire
        final = bool(flags & msg.RESPONSE_FINAL)
        record = self._records.get(rid)
        if record is None or record.final:
            log.warning("stub '%s' answered unknown request %s", self.name, rid)
            self._features.discard(outputs)  # GPU exports go back to it
            self.outbox.release(tensors.arena_handles(outputs), rid if outputs else None)
            return
        if final:
            record.final = True
            if record.executed:  # else the batch's EXECUTE_DONE frees its inputs
                self._retire(record)
        request = record.request
        if parameters_json is None:  # `send(flags=FINAL)` with no response: completes the request
            if final:
                self.served += 1
                record.stream.put(InferResponse(request.model_name, "", request.id, flags_only=True), True)
            return
        try:
            response = self._make_response(record, wire)
        except Exception as exc:  # noqa: BLE001 - a malformed response still ends its request
            response = InferResponse(request.model_name, "", request.id, error=ServerError(
                f"stub '{self.name}' sent a malformed response: {type(exc).__name__}: {exc}"))
        if final:
            if response.error is None and record.stream.error is None:
                self.served += 1
            else:
                self.failed += 1
        record.stream.put(response, final)

    def _make_response(self, record: _InFlight, wire: WireResponse) -> InferResponse:
        rid, flags, error, outputs_wire, parameters_json = wire
        # A credit lets the stub send more; after the final response it has forgotten the request.
        credit = None if flags & msg.RESPONSE_FINAL else rid
        request = record.request
        parameters = json.loads(parameters_json) if parameters_json and parameters_json != "{}" else {}
        if error is not None:
            return InferResponse(request.model_name, "", request.id, parameters=parameters,
                                 error=ServerError(error.message, Status.coerce(error.code)))
        if all(t.handle[0] == tensors.INLINE_TAG for t in outputs_wire):
            # every output inline (the common small response): nothing to map, nothing to free
            inline = [Tensor(name, datatype, tuple(shape), handle[1]) for name, datatype, shape, handle in outputs_wire]
            done = self._credit_release(credit) if credit is not None else no_release
            return InferResponse(request.model_name, "", request.id, inline, parameters, done)
        features = self._features  # GPU outputs a BLS caller asked for stay on the GPU
        s2p = self._s2p
        outputs = features.outputs(outputs_wire, lambda handle: tensors.handle_view(s2p, handle))
        handles = tensors.arena_handles(outputs_wire)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for tensor in outputs:
                    if isinstance(tensor.data, memoryview):
                        tensor.data.release()
                    elif tensor.device is not None:  # the export lives on while a BLS caller maps it
                        features.drop_hold(tensor.device.key)
                self.outbox.release(handles, credit)  # frees the bytes (and returns a send credit)

        return InferResponse(request.model_name, "", request.id, outputs, parameters, release)

    def _credit_release(self, rid: int) -> Callable[[], None]:
        """A response with nothing to free but its send credit, returned once."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.outbox.release([], rid)

        return release

    def on_execute_done(self, message: msg.ExecuteDone) -> None:
        for response in message.responses:
            self.on_response(response)
        batch = self._batches.pop(message.batch_id, None)
        if batch is None:
            return
        now = time.monotonic_ns()
        # the wait behind the stub's previous batch, within this batch's own span
        queued = min(max(message.busy_until_ns - batch.staged, 0), now - batch.staged)
        batch.timing.queued_in_stub_ns = queued
        batch.timing.compute_infer_ns = now - batch.staged - queued
        for rid in batch.rids:
            record = self._records.get(rid)
            if record is None or record.executed:
                continue
            record.executed = True
            if record.final:
                self._retire(record)
            elif message.error is not None:
                self._fail([rid], ServerError(message.error[1], Status.coerce(message.error[0])))
        batch.end.end()

    # -- ending --------------------------------------------------------------------------------
    def _retire(self, record: _InFlight) -> None:
        """Final response in and `execute` returned: forget the record, free its inputs."""
        self._records.pop(record.rid, None)
        if record.rescheduled:
            self._rescheduled -= 1
        self.free_p2s(record.input_handles)
        record.input_handles = []

    def _fail(self, rids: list[int], error: ServerError, unsent: bool = False) -> None:
        for rid in rids:
            record = self._records.get(rid)
            if record is not None:
                if unsent and record.wire is not None:  # the stub never got (nor will release) its claims
                    self._features.release_unsent(record.wire.inputs)
                self._retire(record)
                if not record.final:
                    self.failed += 1
                record.stream.fail(error)

    def fail_all(self, error: ServerError) -> None:
        """Every request in flight fails with `error`; every batch waiter wakes up."""
        self._fail(list(self._records), error)
        batches, self._batches = self._batches, {}
        for batch in batches.values():
            batch.end.end()

    def close(self) -> None:
        """The stub is gone for good: nothing more goes out."""
        self.outbox.closed = True
        self.outbox.clear()

    def free_p2s(self, handles: list[list[int]]) -> None:
        for handle in handles:
            try:
                self._p2s.free(handle)
            except (KeyError, IndexError, TypeError, ValueError):
                log.error("stub '%s' released an unknown p2s handle %s", self.name, handle)
