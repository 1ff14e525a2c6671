"""The parent side of one stub incarnation: spawn, handshake, stop. Requests are the exchange's.

    StubProcess.spawn ──▶ control block, channel pair, p2s arena (all anonymous: memfds and a
                          socket pair, nothing in /dev/shm), `python -m
                          pystub_backend.stub.triton_python_backend_stub` (subprocess, own session,
                          umask 077; inherits the channel and the control block's descriptor)
    .initialize        ──▶ INIT ... INIT_DONE, bounded by the init deadline or the stub's death
    .exchange          ──▶ the requests in flight (supervision.exchange.RequestExchange)
    .link              ──▶ frames both ways; `send` is the one "send to the stub with a deadline"
    .stop()            ──▶ the shutdown ladder: FINALIZE (deadline) → wait → SIGTERM → SIGKILL →
                          reap → close channel → unmap the arenas and the control block;
                          a stub not told to exit (no FINALIZE answered, no failed INIT reported)
                          is SIGKILLed at once: it ignores SIGTERM and would not exit by itself

The stub's death is seen at once, as EOF on the channel: every request in flight then fails with
`Stub process '<instance>' is not healthy.`, nothing it held leaks (its s2p arena is dropped whole,
the p2s allocations of its requests are freed) and `on_death` tells the supervisor
(supervision.instance), which decides what happens next.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import pystub_backend
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.exchange import RequestExchange, StreamOrError
from pystub_backend.backend.supervision.exit_watch import ExitWatch
from pystub_backend.backend.supervision.frames import FrameLink
from pystub_backend.backend.supervision.hang_judge import ProcessProgress, read_progress
from pystub_backend.backend.supervision.init_failure import died_during_initialize
from pystub_backend.backend.supervision.output import OutputForwarder
from pystub_backend.backend.supervision.ready_probe import ReadyProbe
from pystub_backend.backend.supervision.services import RescheduleOwner, StubServices
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stop_ladder import Step, climb
from pystub_backend.backend.telemetry.statistics import BatchTiming
from pystub_backend.ipc import names
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import make_pair
from pystub_backend.ipc.control_block import ControlBlock
from pystub_backend.ipc.exit_codes import describe_exit
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.status import Status

__all__ = ["StubProcess", "StubStartError", "PROJECT_ROOT"]

log = logging.getLogger("pystub.stub")
# The directory that holds the `pystub_backend` package, so that a stub finds it from any interpreter.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pystub_backend.__file__)))
# The shutdown ladder after FINALIZE: (signal, seconds to wait for the exit after it).
_LADDER: tuple[Step, ...] = ((None, 2.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0))
_KILL_NOW: tuple[Step, ...] = ((signal.SIGKILL, 5.0),)  # for a stub that was not told to exit (it ignores SIGTERM)


class StubProcess:
    def __init__(self, instance_name: str, settings: StubSettings, model_name: str,
                 services: StubServices) -> None:
        """`services` are what the stub's feature frame handlers may use (features.install builds
        them): given, never imported, so supervision stays below the features."""
        self.instance_name = instance_name
        self.model_name = model_name
        self.settings = settings
        self.services = services
        self.base = names.stub_base_name(settings.shm_prefix)
        self.process: subprocess.Popen[bytes] | None = None
        self._exit: ExitWatch | None = None
        self.control: ControlBlock | None = None
        self.p2s: ArenaWriter | None = None
        self.s2p: ArenaReader | None = None
        self.started_at = time.monotonic()
        self.link = FrameLink(self, settings.stub_timeout_seconds)
        self.exchange = RequestExchange(self)
        self._dead = False
        # The stub was told to exit, or said it will (a FINALIZE answered, a failed INIT, the one
        # auto-complete call): worth waiting for. A stub never told ignores SIGTERM: killed at once.
        self._exiting = False
        self._output: OutputForwarder | None = None
        self._ready_probe = ReadyProbe(self.link, instance_name, settings.stub_timeout_seconds)  # config-sections hook
        self.has_is_ready = False
        # The iterative sequence batcher whose batch runs here (set before each of its batches).
        self.reschedule_owner: RescheduleOwner | None = None
        self.on_death: Callable[[StubProcess], None] | None = None

    # -- facts ---------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        if self._dead or self.process is None:
            return False
        return not self._exit.exited if self._exit is not None else self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once reaped (negative: killed by that signal), else None."""
        return self.process.poll() if self.process else None

    @property
    def in_flight(self) -> int:
        return self.exchange.in_flight

    def heartbeat_age(self, now: float) -> float:
        """Seconds since the stub's last heartbeat (since spawn, before the first one)."""
        age = self.control.heartbeat_age() if self.control is not None else None
        return now - self.started_at if age is None else age

    def progress(self) -> ProcessProgress | None:
        """The process's CPU time and thread states (for telling frozen from busy), None when gone."""
        return read_progress(self.process.pid) if self.process is not None else None

    def execute_started(self) -> float | None:
        """When the running `execute` began (monotonic), None when none runs."""
        return (self.control.execute_start or None) if self.control is not None else None

    def unhealthy_error(self) -> ServerError:
        return ServerError(f"Stub process '{self.instance_name}' is not healthy.", Status.UNAVAILABLE)

    def death_reason(self) -> str:
        """How the process ended: exit code (named when it is a stub exit code), signal, or (still
        running) a closed channel."""
        code = self.exit_code
        if code is None:
            return "closed its channel"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return describe_exit(code)

    def death_text(self, what: str) -> str:
        return f"stub process '{self.instance_name}' {self.death_reason()} while waiting for {what}"

    # -- the features' seam --------------------------------------------------------------------
    async def send(self, message: NamedTuple, timeout: float | None = None) -> None:
        """Send a frame, waiting at most `timeout` s (default: the stub timeout) for room.
        Raises ChannelTimeoutError naming the message and the stub, ChannelClosedError."""
        await self.link.send(message, timeout)

    def send_soon(self, message: NamedTuple) -> None:
        """Send a frame without blocking, in order with earlier `send_soon` frames (FrameLink)."""
        self.link.send_soon(message)

    async def flush(self) -> None:
        """Wait until every `send_soon` frame is out (or was given up)."""
        await self.link.flush()

    def requests_in_flight(self) -> list[InferRequest]:
        return self.exchange.requests()

    def reschedule(self, rid: int) -> InferRequest | None:
        """See RequestExchange.reschedule."""
        return self.exchange.reschedule(rid)

    # -- spawn and handshake -------------------------------------------------------------------
    def spawn(self, python: list[str] | None = None, rlimits: dict[str, int] | None = None) -> None:
        """Create the shared objects and start the process. Raises StubStartError.

        `python` is the interpreter command (an execution environment's), default ours; `rlimits`
        maps `as`/`cpu`/`nofile` to limits the stub applies to itself before loading the model.
        """
        parent_end, child_end = make_pair()
        control_fd = -1
        try:
            self.control = ControlBlock.create(self.base + "_ctl")
            control_fd = self.control.take_fd()  # the stub's; the backend keeps only its mapping
            self.p2s = ArenaWriter(self.base, "p2s", self.settings.shm_default_byte_size,
                                   self.settings.shm_growth_byte_size)
            self.s2p = ArenaReader(self.base, "s2p")
            fds = (child_end.fileno(), control_fd)
            self.process = subprocess.Popen(
                self._command(python, fds, rlimits or {}), pass_fds=fds,
                close_fds=True, start_new_session=True, umask=0o077, env=self._environment(),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except Exception as exc:
            parent_end.close()
            self._release_shared_objects()
            raise StubStartError(f"failed to start stub process '{self.instance_name}': {exc}") from exc
        finally:
            child_end.close()
            if control_fd >= 0:
                os.close(control_fd)
        self.started_at = time.monotonic()
        self._exit = ExitWatch(self.process)
        self._output = OutputForwarder(self.instance_name, self.process.stdout, self.process.stderr)
        self.link.open(parent_end, self._on_channel_closed)
        assert self.link.channel is not None
        # p2s segments go to the stub with the frames; s2p segments arrive with the stub's frames.
        self.link.channel.carry_segments(self.p2s, self.s2p)

    def _command(self, python: list[str] | None, fds: tuple[int, int], rlimits: dict[str, int]) -> list[str]:
        heartbeat = min(1.0, self.settings.heartbeat_timeout_seconds / 4)
        limits = [f"--rlimit={name}={value}" for name, value in sorted(rlimits.items())]
        return [*(python or [sys.executable]), "-m", "pystub_backend.stub.triton_python_backend_stub",
                self.instance_name, "--base", self.base, "--fd", str(fds[0]), "--control-fd", str(fds[1]),
                "--parent-pid", str(os.getpid()),
                "--shm-default", str(self.settings.shm_default_byte_size),
                "--shm-growth", str(self.settings.shm_growth_byte_size),
                "--heartbeat-interval", str(heartbeat),
                "--send-timeout", str(self.settings.stub_timeout_seconds), *limits]

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The stub imports pystub and ipc from this checkout even when it is not installed.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        return env

    async def initialize(self, model_path: str, args: dict[str, str], settings: dict[str, object],
                         sources: dict[str, bytes] | None = None) -> None:
        """Run the model's initialize, importing `sources` (path -> bytes) in place of those files.
        Raises StubStartError with the model's error text; a model that failed to import or
        initialize is a boot failure (the stub exits with its code)."""
        try:
            reply = await self.link.request_reply(msg.Init(model_path, args, settings, sources), msg.InitDone,
                                                  self.settings.stub_init_timeout_seconds, "initialize")
        except StubStartError as exc:  # config-sections hook: a death fails the load with Triton's text
            raise StubStartError(await died_during_initialize(self, exc), exc.boot_failure) from exc
        if reply.error is not None:
            self._exiting = True  # a stub whose initialize failed exits with its boot-failure code
            # Triton's text goes to the client; the full Python traceback only to pystub's log.
            if reply.traceback:
                log.error("initialize of stub '%s' failed:\n%s", self.instance_name, reply.traceback.rstrip())
            raise StubStartError(reply.error, boot_failure=True)
        self.has_is_ready = bool(reply.has_is_ready)

    async def auto_complete(self, model_path: str, config_json: str) -> str:
        """Run `auto_complete_config`; returns the completed config JSON. Raises StubStartError."""
        reply = await self.link.request_reply(msg.AutoComplete(model_path, config_json), msg.AutoCompleteDone,
                                              self.settings.stub_init_timeout_seconds, "auto_complete_config")
        self._exiting = True  # the auto-complete stub exits after its one answer
        if reply.error is not None:
            raise StubStartError(reply.error, boot_failure=True)
        return str(reply.config_json)

    async def check_ready(self, timeout: float = 5.0) -> str | None:
        """The model's own readiness (docs/reference/model-api.md#model-readiness): None when ready, else why not.
        One call at a time: checks that come while it runs wait for it (ready_probe); a model without `is_ready` is
        ready while its stub lives."""
        if not self.alive:
            return self.unhealthy_error().message
        if not self.has_is_ready:
            return None
        return await self._ready_probe.check(timeout)

    # -- execute -------------------------------------------------------------------------------
    async def execute_streams(self, requests: list[InferRequest],
                              on_sent: Callable[[list[StreamOrError]], None] | None = None
                              ) -> tuple[list[StreamOrError], BatchTiming]:
        """Send one batch; returns once the model's `execute` returned, with, per request, its
        ResponseStream or a ServerError. Never raises.

        `on_sent(results)` is called as soon as the batch is on its way, before `execute`
        returns: a caller that gets its stream then can cancel it while the model still runs.
        """
        return await self.exchange.execute_streams(requests, on_sent)

    def start_streams(self, requests: list[InferRequest]
                      ) -> tuple[list[StreamOrError], BatchTiming, asyncio.Future[None] | None] | None:
        """`execute_streams` without waiting; see RequestExchange.start_streams."""
        return self.exchange.start_streams(requests)

    async def execute_timed(self, requests: list[InferRequest]) -> tuple[list[object], BatchTiming]:
        """Run one batch to completion; per request an InferResponse or a ServerError (never raises)."""
        started = time.monotonic_ns()
        streams, timing = await self.execute_streams(requests)
        results: list[object] = []
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

    async def execute(self, requests: list[InferRequest]) -> list[object]:
        results, _ = await self.execute_timed(requests)
        return results

    # -- death and stop ------------------------------------------------------------------------
    def _on_channel_closed(self) -> None:
        self._dead = True
        self.exchange.fail_all(self.unhealthy_error())
        self.link.fail_waiters()
        if self.on_death is not None:
            self.on_death(self)

    def kill(self) -> None:
        """SIGKILL the stub's process group now (a hung or doomed stub); its channel then closes."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def stop(self, finalize_timeout: float) -> None:
        """The shutdown ladder. Never raises; every step is bounded. `finalize_timeout=0` skips
        FINALIZE (for a stub that exits by itself, like the auto-complete one)."""
        if finalize_timeout > 0 and self.alive and not self.link.closed:
            try:
                reply = await self.link.request_reply(msg.Finalize(), msg.FinalizeDone, finalize_timeout,
                                                      "finalize")
                self._exiting = True
                if reply.error:
                    log.warning("finalize of '%s' raised: %s", self.instance_name, reply.error)
            except StubStartError as exc:
                log.warning("%s", exc)
        await self._terminate()
        self.exchange.fail_all(self.unhealthy_error())
        if self._output is not None:
            await self._output.drain(timeout=1.0)
        self._release_shared_objects()

    async def _terminate(self) -> None:
        process = self.process
        if process is None:
            return
        # Waiting for an exit nothing asked for, then sending a SIGTERM the stub ignores, only
        # delays a failed load (an initialize past its deadline) by 3 s: kill it now instead.
        ladder = _LADDER if self._exiting or self.link.closed else _KILL_NOW
        await climb(process.pid, lambda: process.poll() is not None, ladder, f"stub '{self.instance_name}'", log,
                    group=True, extra={"model": self.model_name, "instance": self.instance_name})

    def _release_shared_objects(self) -> None:
        self._dead = True
        if self._exit is not None:
            self._exit.close()
        self.link.close()
        for resource in (self.p2s, self.s2p, self.control):
            if resource is not None:
                resource.close()  # anonymous: unmapped here and closed in the stub, they are gone
