"""The parent side of one stub incarnation: spawn, handshake, execute, stop.

    StubProcess.spawn ──▶ control block, channel pair, p2s arena, `python -m
                          pystub_backend.stub.triton_python_backend_stub` (subprocess, own session, umask 077)
    .initialize        ──▶ INIT ... INIT_DONE, bounded by the init deadline or the stub's death
    .execute(batch)    ──▶ inputs into p2s, EXECUTE; responses arrive as RESPONSE / EXECUTE_DONE
    .stop()            ──▶ the shutdown ladder: FINALIZE (deadline) → SIGTERM → SIGKILL → reap →
                          close channel → unlink every shm object of this incarnation

The stub's death is seen at once, as EOF on the channel; every request in flight then fails with
`Stub process '<instance>' is not healthy.` and nothing it held leaks: its s2p arena is dropped
whole and the p2s allocations of its requests are freed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pystub_backend
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features import client_shm
from pystub_backend.backend.features import install as features  # noqa: F401 - registers the features' frame handlers
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor
from pystub_backend.backend.models.validation import model_parameters
from pystub_backend.backend.supervision.handlers import handler_for
from pystub_backend.backend.supervision.init_failure import died_during_initialize
from pystub_backend.backend.supervision.outbox import StubOutbox
from pystub_backend.backend.supervision.output import OutputForwarder
from pystub_backend.backend.supervision.ready_probe import ReadyProbe
from pystub_backend.backend.supervision.response_stream import ResponseStream
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc import names, tensors
from pystub_backend.ipc.arena import ArenaFullError, ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import AsyncChannel, ChannelClosedError, ChannelTimeoutError, make_pair
from pystub_backend.ipc.control_block import ControlBlock
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.status import Status

__all__ = ["StubProcess", "StubStartError", "PROJECT_ROOT"]

log = logging.getLogger("pystub.stub")
# The directory that holds the `pystub_backend` package, so that a stub finds it from any interpreter.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pystub_backend.__file__)))
_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class StubStartError(Exception):
    """The stub could not start or its model failed to initialize; the message says why."""


class _Pending:
    """One request in flight: its response stream and the p2s memory of its inputs.

    Inputs stay allocated until both `execute` has returned and the final response is in: a
    decoupled model may read its inputs from another thread after `execute` returned, as
    Triton's own examples do.
    """

    __slots__ = ("rid", "request", "stream", "input_handles", "executed", "wire")

    def __init__(self, rid: int, request: InferRequest, stream: ResponseStream) -> None:
        self.rid = rid
        self.request = request
        self.stream = stream
        self.input_handles: list[list[int]] = []
        self.executed = False
        self.wire: list[Any] = []  # what EXECUTE carried; sent again if the model reschedules it


class StubProcess:
    def __init__(self, instance_name: str, settings: StubSettings, model_name: str = "",
                 context: Any = None) -> None:
        self.instance_name = instance_name
        self.context = context  # the server core, for feature handlers (pystub_backend.backend.supervision.handlers)
        self.model_name = model_name
        self.settings = settings
        self.base = names.stub_base_name(settings.shm_prefix)
        self.process: subprocess.Popen | None = None
        self.control: ControlBlock | None = None
        self.channel: AsyncChannel | None = None
        self.p2s: ArenaWriter | None = None
        self.s2p: ArenaReader | None = None
        self.started_at = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._finished_early: dict[int, _Pending] = {}  # final response in, execute not yet returned
        self._batches: dict[int, tuple[asyncio.Future, list[int]]] = {}
        self._rescheduled: dict[int, int] = {}  # pystub sequences: id(request) -> rid, to run again
        self._waiters: dict[type, asyncio.Future] = {}
        self._outbox = StubOutbox(lambda: self.channel)
        self._dead = False
        self._output: OutputForwarder | None = None
        self._ready_probe = ReadyProbe(self, settings.stub_timeout_seconds)  # config-sections hook
        self.has_is_ready = False
        self.on_death: Callable[[StubProcess], None] | None = None

    # -- life cycle ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._dead and self.process is not None and self.process.poll() is None

    def exited(self) -> bool:
        """The process has ended and was reaped (its exit status is known)."""
        return self.process is not None and self.process.poll() is not None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def unhealthy_error(self) -> ServerError:
        return ServerError(f"Stub process '{self.instance_name}' is not healthy.", Status.UNAVAILABLE)

    def spawn(self, python: list[str] | None = None, rlimits: dict[str, int] | None = None) -> None:
        """Create the shared objects and start the process. Raises StubStartError.

        `python` is the interpreter command (an execution environment's), default ours; `rlimits`
        maps `as`/`cpu`/`nofile` to limits the stub applies to itself before loading the model.
        """
        parent_end, child_end = make_pair()
        try:
            self.control = ControlBlock.create(self.base + "_ctl")
            self.p2s = ArenaWriter(self.base, "p2s", self.settings.shm_default_byte_size,
                                   self.settings.shm_growth_byte_size)
            self.s2p = ArenaReader(self.base, "s2p")
            self.process = subprocess.Popen(
                self._command(python, child_end.fileno(), rlimits or {}), pass_fds=(child_end.fileno(),),
                close_fds=True, start_new_session=True, umask=0o077, env=self._environment(),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except Exception as exc:
            parent_end.close()
            self._release_shared_objects()
            raise StubStartError(f"failed to start stub process '{self.instance_name}': {exc}") from exc
        finally:
            child_end.close()
        self.started_at = time.monotonic()
        self._output = OutputForwarder(self.instance_name, self.process.stdout, self.process.stderr)
        self.channel = AsyncChannel(parent_end, self._on_frame, self._on_channel_closed)

    def _command(self, python: list[str] | None, fd: int, rlimits: dict[str, int]) -> list[str]:
        heartbeat = min(1.0, self.settings.heartbeat_timeout_seconds / 4)
        limits = [f"--rlimit={name}={value}" for name, value in sorted(rlimits.items())]
        return [*(python or [sys.executable]), "-m", "pystub_backend.stub.triton_python_backend_stub", self.instance_name,
                "--base", self.base, "--fd", str(fd), "--parent-pid", str(os.getpid()),
                "--shm-default", str(self.settings.shm_default_byte_size),
                "--shm-growth", str(self.settings.shm_growth_byte_size),
                "--heartbeat-interval", str(heartbeat),
                "--send-timeout", str(self.settings.stub_timeout_seconds), *limits]

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The stub imports pystub and ipc from this checkout even when it is not installed.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        return env

    async def _await_reply(self, kind: type, timeout: float, what: str) -> Any:
        future = self._loop.create_future()
        self._waiters[kind] = future
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise StubStartError(f"timed out after {timeout:.0f} s waiting for {what} from stub "
                                 f"'{self.instance_name}'") from None
        finally:
            self._waiters.pop(kind, None)

    async def _request_reply(self, message: Any, reply: type, timeout: float, what: str) -> Any:
        if self._dead or self.channel is None:
            raise StubStartError(self._death_text(what))
        waiter = asyncio.ensure_future(self._await_reply(reply, timeout, what))
        await asyncio.sleep(0)  # register the waiter before the reply can arrive
        try:
            await self.channel.send(msg.encode(message), self.settings.stub_timeout_seconds, what)
        except (ChannelClosedError, ChannelTimeoutError) as exc:
            waiter.cancel()
            raise StubStartError(f"{self._death_text(what)} ({exc})") from exc
        return await waiter

    def death_reason(self) -> str:
        """How the process ended: exit code, signal, or (still running) a closed channel."""
        code = self.process.poll() if self.process else None
        if code is None:
            return "closed its channel"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def _death_text(self, what: str) -> str:
        return f"stub process '{self.instance_name}' {self.death_reason()} while waiting for {what}"

    def kill(self) -> None:
        """SIGKILL the stub's process group now (a hung or doomed stub); its channel then closes."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def initialize(self, model_path: str, args: dict[str, str], settings: dict[str, Any]) -> None:
        """Run the model's initialize. Raises StubStartError with the model's error text."""
        try:
            reply = await self._request_reply(msg.Init(model_path, args, settings), msg.InitDone,
                                              self.settings.stub_init_timeout_seconds, "initialize")
        except StubStartError as exc:  # config-sections hook: a death fails the load with Triton's text
            raise StubStartError(await died_during_initialize(self, exc)) from exc
        if reply.error is not None:
            raise StubStartError(reply.error + (f"\n{reply.traceback}" if reply.traceback else ""))
        self.has_is_ready = bool(reply.has_is_ready)

    async def check_ready(self, timeout: float = 5.0) -> str | None:
        """The model's own readiness (API.md 2.3): None when ready, else why not. One call at a
        time: checks that come while it runs wait for it (ready_probe); a model without
        `is_ready` is ready while its stub lives."""
        if not self.alive:
            return self.unhealthy_error().message
        if not self.has_is_ready:
            return None
        return await self._ready_probe.check(timeout)

    # The two waits the ready probe uses (config-sections hook: ready_probe.ReadyTransport).
    request_reply = _request_reply
    await_reply = _await_reply

    async def auto_complete(self, model_path: str, config_json: str) -> str:
        """Run `auto_complete_config`; returns the completed config JSON. Raises StubStartError."""
        reply = await self._request_reply(msg.AutoComplete(model_path, config_json), msg.AutoCompleteDone,
                                          self.settings.stub_init_timeout_seconds, "auto_complete_config")
        if reply.error is not None:
            raise StubStartError(reply.error)
        return reply.config_json

    # -- frames from the stub ------------------------------------------------------------------
    def _on_frame(self, frame: bytes) -> None:
        try:
            message = msg.decode(frame)
        except msg.MessageDecodeError as exc:
            log.error("dropped a corrupt frame from stub '%s': %s", self.instance_name, exc)
            return
        try:
            self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - a malformed frame must not end the channel's reader
            log.error("dropped a malformed %s frame from stub '%s': %s: %s", type(message).__name__,
                      self.instance_name, type(exc).__name__, exc)

    def _dispatch(self, message: Any) -> None:
        kind = type(message)
        if kind is msg.Response:
            self._on_response(message.response)
        elif kind is msg.ExecuteDone:
            self._on_execute_done(message)
        elif kind is msg.Log:
            self._on_log(message)
        elif kind is msg.Release:
            self._free_p2s(message.handles)
        elif (feature := handler_for(kind)) is not None:
            feature(self, message)
        else:
            waiter = self._waiters.get(kind)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            else:
                log.warning("unexpected %s from stub '%s'", kind.__name__, self.instance_name)

    def _on_log(self, message: msg.Log) -> None:
        """A record from the stub, logged once with the model's own file:line."""
        level = _LOG_LEVELS.get(message.level, logging.INFO)
        if not log.isEnabledFor(level):
            return
        record = log.makeRecord(log.name, level, message.filename, message.lineno,
                                "[%s] %s", (self.instance_name, message.message), None)
        log.handle(record)

    def _on_response(self, wire: list[Any]) -> None:
        rid, flags, error, outputs, parameters_json = wire
        final = bool(flags & msg.RESPONSE_FINAL)
        pending = self._pending.get(rid)
        if pending is None:
            log.warning("stub '%s' answered unknown request %s", self.instance_name, rid)
            self._outbox.release([t[3] for t in outputs], rid if outputs else None)
            return
        if final:
            del self._pending[rid]
            if pending.executed:
                self._release_inputs(pending)
            else:  # execute has not returned yet: the batch entry frees them when it does
                self._finished_early[rid] = pending
        if parameters_json is None:  # `send(flags=FINAL)` with no response: completes the request
            if final:
                request = pending.request
                pending.stream.put(InferResponse(request.model_name, "", request.id, flags_only=True), True)
            return
        try:
            response = self._make_response(pending, wire)
        except Exception as exc:  # noqa: BLE001 - a malformed response still ends its request
            request = pending.request
            response = InferResponse(request.model_name, "", request.id, error=ServerError(
                f"stub '{self.instance_name}' sent a malformed response: {type(exc).__name__}: {exc}"))
        pending.stream.put(response, final)

    def _make_response(self, pending: _Pending, wire: list[Any]) -> InferResponse:
        rid, _, error, outputs_wire, parameters_json = wire
        request = pending.request
        parameters = json.loads(parameters_json) if parameters_json and parameters_json != "{}" else {}
        if error is not None:
            return InferResponse(request.model_name, "", request.id, parameters=parameters,
                                 error=ServerError(error[1], Status.coerce(error[0])))
        assert self.s2p is not None
        outputs = [Tensor(name, datatype, tuple(shape), self.s2p.view(handle))
                   for name, datatype, shape, handle in outputs_wire]
        handles = [t[3] for t in outputs_wire]
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for tensor in outputs:
                    if isinstance(tensor.data, memoryview):
                        tensor.data.release()
                self._outbox.release(handles, rid)  # frees the bytes and returns a send credit

        return InferResponse(request.model_name, "", request.id, outputs, parameters, release)

    def _on_execute_done(self, message: msg.ExecuteDone) -> None:
        for response in message.responses:
            self._on_response(response)
        entry = self._batches.pop(message.batch_id, None)
        if entry is None:
            return
        done, rids = entry
        for rid in rids:
            early = self._finished_early.pop(rid, None)
            if early is not None:
                self._release_inputs(early)
                continue
            pending = self._pending.get(rid)
            if pending is None:
                continue
            pending.executed = True
            if message.error is not None:
                del self._pending[rid]
                self._release_inputs(pending)
                pending.stream.fail(ServerError(message.error[1], Status.coerce(message.error[0])))
        if not done.done():
            done.set_result(None)

    def _release_inputs(self, pending: _Pending) -> None:
        self._free_p2s(pending.input_handles)
        pending.input_handles = []

    def _free_p2s(self, handles: list[list[int]]) -> None:
        if self.p2s is None:
            return
        for handle in handles:
            try:
                self.p2s.free(handle)
            except (KeyError, IndexError, TypeError, ValueError):
                log.error("stub '%s' released an unknown p2s handle %s", self.instance_name, handle)

    def _cancel(self, rid: int) -> None:
        if rid in self._pending:
            self._outbox.cancel(rid)

    # -- execute -------------------------------------------------------------------------------
    async def execute_streams(self, requests: list[InferRequest],
                              on_sent: Callable[[list[Any]], None] | None = None) -> tuple[list[Any], BatchTiming]:
        """Send one batch; returns once the model's `execute` returned, with, per request, its
        ResponseStream or a ServerError. Never raises.

        `on_sent(results)` is called as soon as the batch is on its way, before `execute`
        returns: a caller that gets its stream then can cancel it while the model still runs.
        """
        timing = BatchTiming()
        if not self.alive:
            return [self.unhealthy_error()] * len(requests), timing
        assert self.channel is not None
        started = time.monotonic_ns()
        batch_id = next(self._ids)
        results: list[Any] = []
        wire_requests, rids = [], []
        for request in requests:
            again = self._pending.get(self._rescheduled.pop(id(request), 0)) if self._rescheduled else None
            if again is not None:  # pystub sequences: a rescheduled request runs again as itself
                again.executed = False
                wire_requests.append(again.wire)
                rids.append(again.rid)
                results.append(again.stream)
                continue
            try:
                wire, pending = self._place_request(request)
            except ArenaFullError as exc:
                results.append(ServerError(str(exc), Status.INTERNAL))
                continue
            self._pending[pending.rid] = pending
            wire_requests.append(wire)
            rids.append(pending.rid)
            results.append(pending.stream)
        staged = time.monotonic_ns()
        timing.compute_input_ns = staged - started
        if wire_requests:
            releases = self._outbox.take_releases()
            try:
                frame = msg.encode(msg.Execute(batch_id, wire_requests, releases))
            except (TypeError, ValueError, OverflowError) as exc:
                # A value the wire cannot carry (validation should have refused it): fail this
                # batch alone; the caller (a scheduler worker) must go on serving.
                self._outbox.release(releases)
                self._fail_unsent(rids, ServerError(f"the request could not be sent to stub "
                                                    f"'{self.instance_name}': {exc}", Status.INVALID_ARG))
                return results, timing
            done = self._loop.create_future()
            self._batches[batch_id] = (done, rids)
            try:
                await self.channel.send(frame, self.settings.stub_timeout_seconds, "EXECUTE")
            except (ChannelClosedError, ChannelTimeoutError) as exc:
                log.error("stub '%s': %s", self.instance_name, exc)
                self._fail_all(self.unhealthy_error())
            if on_sent is not None:
                on_sent(results)
            await done
        timing.compute_infer_ns = time.monotonic_ns() - staged
        return results, timing

    async def execute_timed(self, requests: list[InferRequest]) -> tuple[list[Any], BatchTiming]:
        """Run one batch to completion; per request an InferResponse or a ServerError (never raises)."""
        started = time.monotonic_ns()
        streams, timing = await self.execute_streams(requests)
        results: list[Any] = []
        for stream in streams:
            if isinstance(stream, ServerError):
                results.append(stream)
                continue
            try:
                results.append(await stream.single())
            except ServerError as error:
                results.append(error)
        timing.compute_infer_ns = time.monotonic_ns() - started - timing.compute_input_ns
        return results, timing

    async def execute(self, requests: list[InferRequest]) -> list[Any]:
        results, _ = await self.execute_timed(requests)
        return results

    def _place_request(self, request: InferRequest) -> tuple[list[Any], _Pending]:
        assert self.p2s is not None
        rid = next(self._ids)
        stream = ResponseStream(request.id, request.model_name, lambda: self._cancel(rid))
        stream.model_version = request.model_version
        pending = _Pending(rid, request, stream)
        wire_inputs = []
        try:
            for tensor in request.inputs:
                region = client_shm.region_handle(tensor)
                if region is not None:  # in a client's shm region: the stub maps it, nothing is copied
                    wire_inputs.append([tensor.name, tensor.datatype, list(tensor.shape), region])
                    continue
                placed = tensors.place(self.p2s, tensor.name, tensor.datatype, tensor.shape, tensor.data)
                wire_inputs.append(placed)
                pending.input_handles.append(placed[3])
        except ArenaFullError:
            self._free_p2s(pending.input_handles)
            raise
        wire = [rid, request.id, wire_inputs, [o.name for o in request.outputs],
                _parameters_json(request), request.correlation_id, request.flags,
                int(request.parameters.get("timeout", 0) or 0)]
        output_regions = client_shm.attach_regions(request, self, stream)
        if output_regions:
            wire.append(output_regions)  # outputs the stub writes straight into client regions
        pending.wire = wire
        return wire, pending

    def reschedule(self, rid: int) -> InferRequest | None:
        """pystub sequences (iterative_sequence): the model rescheduled request `rid`. The next
        `execute_streams` given the returned request runs it again under the same rid, stream and
        inputs. None when it is no longer in flight."""
        pending = self._pending.get(rid)
        if pending is None:
            return None
        self._rescheduled[id(pending.request)] = rid
        return pending.request

    # -- death and stop --------------------------------------------------------------------------
    def _on_channel_closed(self) -> None:
        self._dead = True
        self._fail_all(self.unhealthy_error())
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(StubStartError(self._death_text("a reply")))
        if self.on_death is not None:
            self.on_death(self)

    def _fail_unsent(self, rids: list[int], error: ServerError) -> None:
        for rid in rids:
            pending = self._pending.pop(rid, None)
            if pending is not None:
                self._release_inputs(pending)
                pending.stream.fail(error)

    def _fail_all(self, error: ServerError) -> None:
        pending, self._pending = self._pending, {}
        early, self._finished_early = self._finished_early, {}
        for entry in [*pending.values(), *early.values()]:
            self._release_inputs(entry)
            entry.stream.fail(error)
        batches, self._batches = self._batches, {}
        for future, _ in batches.values():
            if not future.done():
                future.set_result(None)

    async def stop(self, finalize_timeout: float) -> None:
        """The shutdown ladder. Never raises; every step is bounded. `finalize_timeout=0` skips
        FINALIZE (for a stub that exits by itself, like the auto-complete one)."""
        if finalize_timeout > 0 and self.alive and self.channel is not None:
            try:
                reply = await self._request_reply(msg.Finalize(), msg.FinalizeDone, finalize_timeout, "finalize")
                if reply.error:
                    log.warning("finalize of '%s' raised: %s", self.instance_name, reply.error)
            except StubStartError as exc:
                log.warning("%s", exc)
        await self._terminate()
        self._fail_all(self.unhealthy_error())
        if self._output is not None:
            await self._output.drain(timeout=1.0)
        self._release_shared_objects()

    async def _terminate(self) -> None:
        process = self.process
        if process is None:
            return
        for sig, grace in ((None, 2.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            if sig is not None and process.poll() is None:
                log.info("sending %s to stub '%s' (pid %d)", sig.name, self.instance_name, process.pid)
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if process.poll() is not None:
                return
        log.error("stub '%s' (pid %d) did not exit after SIGKILL", self.instance_name, process.pid)

    def _release_shared_objects(self) -> None:
        self._dead = True
        if self.channel is not None:
            self.channel.close()
        for resource in (self.p2s, self.s2p, self.control):
            if resource is not None:
                resource.close()
        names.unlink_entries(names.owned_entries(self.base))


def _parameters_json(request: InferRequest) -> str:
    parameters = model_parameters(request)
    return json.dumps(parameters) if parameters else "{}"
