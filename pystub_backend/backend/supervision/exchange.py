"""The requests in flight on one stub incarnation: one record per request, keyed by its request id.

    execute_streams(batch) ──▶ inputs into p2s, one _InFlight per request, EXECUTE (FrameLink.send)
    start_streams(batch)   ──▶ the same without waiting: sent now, or nothing kept (queue full)
    on_response(wire)      ◀── RESPONSE / responses inside EXECUTE_DONE: to the request's stream
    on_execute_done(done)  ◀── EXECUTE_DONE: the batch's `execute` returned (or raised)
    fail_all(error)            the stub died or stopped: every request in flight fails at once

A record lives until both its final response is in and `execute` has returned: a decoupled model
may read its inputs from another thread after `execute` returned, as Triton's examples do, so the
p2s memory of the inputs is freed only then. `in_flight` counts the records still awaiting their
final response.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import ExportGoneError, InferRequest, InferResponse, model_parameters_json
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.outbox import StubOutbox
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc import tensors
from pystub_backend.ipc.arena import ArenaFullError
from pystub_backend.ipc.channel import ChannelClosedError, ChannelTimeoutError
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireRequest, WireResponse, WireTensor
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["RequestExchange", "StreamOrError"]

log = logging.getLogger("pystub.stub")

StreamOrError = ResponseStream | ServerError


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


class RequestExchange:
    def __init__(self, stub: StubProcess) -> None:
        self._stub = stub
        self._ids = itertools.count(1)
        self._records: dict[int, _InFlight] = {}
        self._batches: dict[int, tuple[asyncio.Future[None], list[int]]] = {}
        self._rescheduled = 0  # records flagged `rescheduled`
        self.outbox = StubOutbox(lambda: stub.link.channel)

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def in_flight(self) -> int:
        return sum(1 for record in self._records.values() if not record.final)

    def requests(self) -> list[InferRequest]:
        """The requests sent to the stub whose final response is not in yet."""
        return [record.request for record in list(self._records.values()) if not record.final]

    # -- execute -------------------------------------------------------------------------------
    async def execute_streams(self, requests: list[InferRequest],
                              on_sent: Callable[[list[StreamOrError]], None] | None = None
                              ) -> tuple[list[StreamOrError], BatchTiming]:
        """Send one batch; see StubProcess.execute_streams. Never raises."""
        timing = BatchTiming()
        stub = self._stub
        if not stub.alive:
            return [stub.unhealthy_error()] * len(requests), timing
        results, rids = self._place_batch(requests, timing)
        staged = time.monotonic_ns()
        if rids:
            done = await self._send_batch(rids)
            if done is None:  # the batch could not be encoded: its requests failed already
                return results, timing
            if on_sent is not None:
                on_sent(results)
            await done
        timing.compute_infer_ns = time.monotonic_ns() - staged
        return results, timing

    def start_streams(self, requests: list[InferRequest]
                      ) -> tuple[list[StreamOrError], BatchTiming, asyncio.Future[None] | None] | None:
        """`execute_streams` without waiting, for a caller that found the instance idle: the batch
        is sent now, and the future resolves when `execute` returned (its timing complete by then;
        None when no request could be sent: the results say why). None when the stub's queue has
        no room now or the stub is not alive: nothing was kept, the caller queues the batch."""
        if not self._stub.alive or self._rescheduled:  # rescheduled requests: the general path
            return None
        timing = BatchTiming()
        results, rids = self._place_batch(requests, timing)
        staged = time.monotonic_ns()
        if not rids:
            return results, timing, None
        done = self._send_batch_now(rids)
        if done is False:
            self._fail(rids, ServerError("not sent", Status.UNAVAILABLE))  # never seen: frees what they held
            return None
        if done is not None:
            done.add_done_callback(lambda _: setattr(timing, "compute_infer_ns", time.monotonic_ns() - staged))
        return results, timing, done

    def _place_batch(self, requests: list[InferRequest], timing: BatchTiming) -> tuple[list[StreamOrError], list[int]]:
        """Per request its stream (inputs placed in p2s) or why it could not be placed, and the
        rids placed; sets the batch's compute_input time."""
        started = time.monotonic_ns()
        results: list[StreamOrError] = []
        rids: list[int] = []
        for request in requests:
            record = self._take_rescheduled(request) if self._rescheduled else None
            try:
                record = record or self.place_request(request)
            except (ArenaFullError, ExportGoneError) as exc:
                results.append(ServerError(str(exc), Status.INTERNAL))
                continue
            rids.append(record.rid)
            results.append(record.stream)
        timing.compute_input_ns = time.monotonic_ns() - started
        return results, rids

    async def _send_batch(self, rids: list[int]) -> asyncio.Future[None] | None:
        """EXECUTE for the records `rids`; the future resolves at EXECUTE_DONE (or death), None
        when no request of the batch could be sent.

        A request the wire cannot carry (a value validation let through) or whose oversize frame
        finds no room in p2s fails alone, with everything it held freed; the others are sent."""
        batch_id = self.next_id()
        releases = self.outbox.take_releases()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        while rids:
            self._batches[batch_id] = (done, rids)
            try:
                await self._stub.link.send(self._execute_frame(batch_id, rids, releases))
                return done
            except (TypeError, ValueError, OverflowError, ArenaFullError) as exc:
                del self._batches[batch_id]
                rids = self._drop_unsendable(rids, exc)
            except (ChannelClosedError, ChannelTimeoutError) as exc:
                return self._link_failed(exc, done)
        self.outbox.release(releases)  # nothing carried them: they go out in a RELEASE frame
        return None

    def _send_batch_now(self, rids: list[int]) -> asyncio.Future[None] | Literal[False] | None:
        """`_send_batch` that never waits: False when the stub's queue is full (nothing sent, the
        records still placed)."""
        batch_id = self.next_id()
        releases = self.outbox.take_releases()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        while rids:
            self._batches[batch_id] = (done, rids)
            try:
                if self._stub.link.try_send(self._execute_frame(batch_id, rids, releases)):
                    return done
                del self._batches[batch_id]
                self.outbox.release(releases)
                return False
            except (TypeError, ValueError, OverflowError, ArenaFullError) as exc:
                del self._batches[batch_id]
                rids = self._drop_unsendable(rids, exc)
            except ChannelClosedError as exc:
                return self._link_failed(exc, done)
        self.outbox.release(releases)
        return None

    def _execute_frame(self, batch_id: int, rids: list[int], releases: list[list[int]]) -> msg.Execute:
        wires = [wire for rid in rids if (wire := self._records[rid].wire) is not None]  # all placed
        return msg.Execute(batch_id, wires, releases)

    def _link_failed(self, exc: Exception, done: asyncio.Future[None]) -> asyncio.Future[None]:
        """The stub's channel closed (or stayed full past the deadline): everything in flight fails."""
        log.error("stub '%s': %s", self._stub.instance_name, exc)
        self.fail_all(self._stub.unhealthy_error())
        return done

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
            self._fail([rid], ServerError(f"the request could not be sent to stub '{self._stub.instance_name}'"
                                          f": {text}", Status.INVALID_ARG), unsent=True)
        if refused:
            return [rid for rid in rids if rid not in refused]
        if isinstance(exc, ArenaFullError) and sizes:
            largest = max(sizes, key=sizes.__getitem__)
            self._fail([largest], ServerError(str(exc), Status.INTERNAL), unsent=True)
            return [rid for rid in rids if rid != largest]
        # the batch frame itself failed although each request encodes: nothing can be singled out
        self._fail(rids, ServerError(f"the batch could not be sent to stub '{self._stub.instance_name}'"
                                     f": {exc}", Status.INTERNAL), unsent=True)
        return []

    def _take_rescheduled(self, request: InferRequest) -> _InFlight | None:
        for record in self._records.values():
            if record.rescheduled and record.request is request:
                record.rescheduled, record.executed = False, False
                self._rescheduled -= 1
                return record
        return None

    def place_request(self, request: InferRequest) -> _InFlight:
        """A record for `request` with its inputs in p2s. Raises ArenaFullError (nothing kept)."""
        stub = self._stub
        assert stub.p2s is not None
        rid = self.next_id()
        stream = ResponseStream(request.id, request.model_name, lambda: self._cancel(rid))
        stream.model_version = request.model_version
        record = _InFlight(rid, request, stream)
        wire_inputs: list[WireTensor] = []
        try:
            for tensor in request.inputs:
                if tensor.device is not None:  # a BLS caller's GPU input: the stub maps it (no copy)
                    wire_inputs.append(stub.services.device_exports.claim_tensor(tensor, stub, "input"))
                    continue
                region = stub.services.client_regions.region_handle(tensor)
                if region is not None:  # in a client's shm region: the stub maps it, nothing is copied
                    wire_inputs.append(WireTensor(tensor.name, tensor.datatype, list(tensor.shape), region))
                    continue
                placed = tensors.place(stub.p2s, tensor.name, tensor.datatype, tensor.shape, tensor.data)
                wire_inputs.append(placed)
                record.input_handles.append(placed.handle)
        except (ArenaFullError, ExportGoneError):
            self.free_p2s(record.input_handles)
            stub.services.device_exports.release_unsent(stub, wire_inputs)
            raise
        # output_regions: outputs the stub writes straight into client regions
        output_regions = stub.services.client_regions.attach_regions(request, stub, stream) or None
        record.wire = WireRequest(rid, request.id, wire_inputs, [o.name for o in request.outputs],
                                  model_parameters_json(request), request.correlation_id, request.flags,
                                  int(request.parameters.get("timeout", 0) or 0), output_regions,
                                  request.trace.context() if request.trace is not None else None,
                                  request.device_outputs)
        self._records[rid] = record
        return record

    def reschedule(self, rid: int) -> InferRequest | None:
        """pystub sequences (iterative_sequence): the model rescheduled request `rid`. The next
        `execute_streams` given the returned request runs it again under the same rid, stream and
        inputs. None when it is no longer in flight."""
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
    def on_response(self, wire: WireResponse) -> None:
        rid, flags, _, outputs, parameters_json = wire
        final = bool(flags & msg.RESPONSE_FINAL)
        record = self._records.get(rid)
        if record is None or record.final:
            log.warning("stub '%s' answered unknown request %s", self._stub.instance_name, rid)
            self._stub.services.device_exports.discard(self._stub, outputs)  # GPU exports go back to it
            arena = [t.handle for t in outputs if t.handle[0] != DEVICE_HANDLE_TAG]
            self.outbox.release(arena, rid if outputs else None)
            return
        if final:
            record.final = True
            if record.executed:  # else the batch's EXECUTE_DONE frees its inputs
                self._retire(record)
        request = record.request
        if parameters_json is None:  # `send(flags=FINAL)` with no response: completes the request
            if final:
                record.stream.put(InferResponse(request.model_name, "", request.id, flags_only=True), True)
            return
        try:
            response = self._make_response(record, wire)
        except Exception as exc:  # noqa: BLE001 - a malformed response still ends its request
            response = InferResponse(request.model_name, "", request.id, error=ServerError(
                f"stub '{self._stub.instance_name}' sent a malformed response: {type(exc).__name__}: {exc}"))
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
        s2p = self._stub.s2p
        assert s2p is not None
        exports = self._stub.services.device_exports  # GPU outputs a BLS caller asked for stay on the GPU
        outputs = exports.outputs(self._stub, outputs_wire, s2p.view)
        handles = [t.handle for t in outputs_wire if not t.handle or t.handle[0] != DEVICE_HANDLE_TAG]
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for tensor in outputs:
                    if isinstance(tensor.data, memoryview):
                        tensor.data.release()
                    elif tensor.device is not None:  # the export lives on while a BLS caller maps it
                        exports.drop_hold(tensor.device.key)
                self.outbox.release(handles, credit)  # frees the bytes (and returns a send credit)

        return InferResponse(request.model_name, "", request.id, outputs, parameters, release)

    def on_execute_done(self, message: msg.ExecuteDone) -> None:
        for response in message.responses:
            self.on_response(response)
        entry = self._batches.pop(message.batch_id, None)
        if entry is None:
            return
        done, rids = entry
        for rid in rids:
            record = self._records.get(rid)
            if record is None or record.executed:
                continue
            record.executed = True
            if record.final:
                self._retire(record)
            elif message.error is not None:
                self._fail([rid], ServerError(message.error[1], Status.coerce(message.error[0])))
        if not done.done():
            done.set_result(None)

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
                    self._stub.services.device_exports.release_unsent(self._stub, record.wire.inputs)
                self._retire(record)
                record.stream.fail(error)


    def fail_all(self, error: ServerError) -> None:
        """Every request in flight fails with `error`; every batch waiter wakes up."""
        self._fail(list(self._records), error)
        batches, self._batches = self._batches, {}
        for future, _ in batches.values():
            if not future.done():
                future.set_result(None)

    def free_p2s(self, handles: list[list[int]]) -> None:
        p2s = self._stub.p2s
        if p2s is None:
            return
        for handle in handles:
            try:
                p2s.free(handle)
            except (KeyError, IndexError, TypeError, ValueError):
                log.error("stub '%s' released an unknown p2s handle %s", self._stub.instance_name, handle)
