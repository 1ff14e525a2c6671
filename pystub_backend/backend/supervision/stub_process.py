"""The parent side of one stub incarnation's process: spawn, handshake, stop, death, heartbeat.

    StubProcess.spawn ──▶ control block, channel pair, p2s arena (all anonymous: memfds and a
                          socket pair, nothing in /dev/shm), `python -m
                          pystub_backend.stub.triton_python_backend_stub` (subprocess, own session,
                          umask 077; inherits the channel and the control block's descriptor);
                          then the link and the exchange over them:
    .link              ──▶ frames both ways (supervision.frames.FrameLink); `send` is the one
                          "send to the stub with a deadline"
    .exchange          ──▶ the requests in flight (supervision.exchange.RequestExchange): requests
                          go to `exchange.submit`, never through this class
    .initialize        ──▶ INIT ... INIT_DONE, bounded by the init deadline or the stub's death
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

import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import pystub_backend
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.backend.supervision.errors import StubStartError
from pystub_backend.backend.supervision.exchange import RequestExchange
from pystub_backend.backend.supervision.exit_watch import ExitWatch, WatchedProcess
from pystub_backend.backend.supervision.frames import FrameLink
from pystub_backend.backend.supervision.hang_judge import ProcessProgress, read_progress
from pystub_backend.backend.supervision.init_failure import died_during_initialize
from pystub_backend.backend.supervision.output import OutputForwarder
from pystub_backend.backend.supervision.ready_probe import ReadyProbe
from pystub_backend.backend.supervision.services import RescheduleOwner, StubServices
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stop_ladder import Step, climb
from pystub_backend.ipc import names
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import ChannelClosedError, make_pair
from pystub_backend.ipc.control_block import ControlBlock
from pystub_backend.ipc.exit_codes import describe_exit
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.records import WireTensor
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
        self.process: WatchedProcess | None = None  # Popen here; a forked instance's own (supervision.forked)
        self.extra_fds: tuple[int, ...] = ()  # more descriptors the process inherits (a template's fork socket)
        self._exit: ExitWatch | None = None
        self.control: ControlBlock | None = None
        self.p2s: ArenaWriter | None = None
        self.s2p: ArenaReader | None = None
        self.started_at = time.monotonic()
        self.link: FrameLink | None = None  # from spawn on
        self.exchange: RequestExchange | None = None  # from spawn on
        self._dead = False
        self.alive = False  # see _update_alive
        # The stub was told to exit, or said it will (a FINALIZE answered, a failed INIT, the one
        # auto-complete call): worth waiting for. A stub never told ignores SIGTERM: killed at once.
        self._exiting = False
        self._output: OutputForwarder | None = None
        self._ready_probe: ReadyProbe | None = None  # config-sections hook (from spawn on)
        self.has_is_ready = False
        # The iterative sequence batcher whose batch runs here (set before each of its batches).
        self.reschedule_owner: RescheduleOwner | None = None
        self.on_death: Callable[[StubProcess], None] | None = None

    # -- facts ---------------------------------------------------------------------------------
    def _update_alive(self) -> None:
        """`alive` is a plain attribute (schedulers read it for every request), set here: False
        once the channel closed, the pidfd saw the exit, or (no pidfd) poll() says it ended."""
        if self._dead or self.process is None:
            self.alive = False
        elif self._exit is not None and self._exit.watched:
            self.alive = not self._exit.exited
        else:
            self.alive = self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once reaped (negative: killed by that signal), else None."""
        return self.process.poll() if self.process else None

    @property
    def in_flight(self) -> int:
        return self.exchange.in_flight if self.exchange is not None else 0

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
        if self.link is None:
            raise ChannelClosedError(f"stub '{self.instance_name}' has no channel")
        await self.link.send(message, timeout)

    def send_soon(self, message: NamedTuple) -> None:
        """Send a frame without blocking, in order with earlier `send_soon` frames (FrameLink)."""
        if self.link is not None:
            self.link.send_soon(message)

    async def flush(self) -> None:
        """Wait until every `send_soon` frame is out (or was given up)."""
        if self.link is not None:
            await self.link.flush()

    def requests_in_flight(self) -> list[InferRequest]:
        return self.exchange.requests() if self.exchange is not None else []

    def reschedule(self, rid: int) -> InferRequest | None:
        """See RequestExchange.reschedule."""
        return self.exchange.reschedule(rid) if self.exchange is not None else None

    # -- spawn and handshake -------------------------------------------------------------------
    def spawn(self, python: list[str] | None = None, rlimits: dict[str, int] | None = None) -> None:
        """Create the shared objects and start the process. Raises StubStartError.

        `python` is the interpreter command (an execution environment's), default ours; `rlimits`
        maps `as`/`cpu`/`nofile` to limits the stub applies to itself before loading the model.
        """
        parent_end, child_end = make_pair()
        control_fd = -1
        try:
            control_fd = self.create_shared_objects()
            fds = (child_end.fileno(), control_fd)
            self.process = process = subprocess.Popen(
                self._command(python, fds, rlimits or {}), pass_fds=fds + self.extra_fds,
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
        self.watch(process)
        self._output = OutputForwarder(self.instance_name, process.stdout, process.stderr)
        self.open_link(parent_end)

    def watch(self, process: WatchedProcess, pidfd: int = -1) -> ExitWatch:
        """Follow `process` as this stub's (spawn's, a forked instance's with the `pidfd` its
        template sent; tests that play the stub pass a process of their own): its start time,
        and its exit from a pidfd."""
        self.process = process
        self.started_at = time.monotonic()
        watch = self._exit = ExitWatch(process, self._update_alive, pidfd)
        self._update_alive()
        return watch

    def create_shared_objects(self) -> int:
        """The control block and the arenas; returns the control block's descriptor, which is the
        stub's (the caller closes its copy once handed over). Raises SegmentCreateError."""
        self.control = ControlBlock.create(self.base + "_ctl")
        control_fd = self.control.take_fd()  # the backend keeps only its mapping
        try:
            self.p2s = ArenaWriter(self.base, "p2s", self.settings.shm_default_byte_size,
                                   self.settings.shm_growth_byte_size)
            self.s2p = ArenaReader(self.base, "s2p")
        except BaseException:
            os.close(control_fd)
            raise
        return control_fd

    def open_link(self, sock: socket.socket) -> None:
        """The link and the exchange over the channel's backend end (spawn's last step; tests
        that play the stub call it with a socket of their own)."""
        assert self.p2s is not None and self.s2p is not None
        link = self.link = FrameLink(sock, self.instance_name, self.settings.stub_timeout_seconds, self.p2s,
                                     self.s2p, self.death_text, self._on_channel_closed)
        link.route_features(self._feature_handler)
        self.exchange = RequestExchange(link, self.p2s, self.s2p, _BoundFeatures(self.services, self))
        self._ready_probe = ReadyProbe(link, self.instance_name, self.settings.stub_timeout_seconds)

    def _feature_handler(self, kind: type) -> Callable[[Any], None] | None:
        handler = self.services.handlers.frame_handler(kind)
        return None if handler is None else functools.partial(handler, self)

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
            reply = await self._link().request_reply(msg.Init(model_path, args, settings, sources), msg.InitDone,
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
        reply = await self._link().request_reply(msg.AutoComplete(model_path, config_json), msg.AutoCompleteDone,
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
        if not self.has_is_ready or self._ready_probe is None:
            return None
        return await self._ready_probe.check(timeout)

    def _link(self) -> FrameLink:
        """The link, for a handshake. Raises StubStartError before spawn."""
        if self.link is None:
            raise StubStartError(f"stub process '{self.instance_name}' was never started")
        return self.link

    # -- death and stop ------------------------------------------------------------------------
    def _on_channel_closed(self) -> None:
        self._dead = True
        self.alive = False
        if self.exchange is not None:
            self.exchange.fail_all(self.unhealthy_error())
        if self.link is not None:
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
        if finalize_timeout > 0 and self.alive and self.link is not None and not self.link.closed:
            try:
                reply = await self.link.request_reply(msg.Finalize(), msg.FinalizeDone, finalize_timeout,
                                                      "finalize")
                self._exiting = True
                if reply.error:
                    log.warning("finalize of '%s' raised: %s", self.instance_name, reply.error)
            except StubStartError as exc:
                log.warning("%s", exc)
        await self._terminate()
        if self.exchange is not None:
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
        ladder = _LADDER if self._exiting or self.link is None or self.link.closed else _KILL_NOW
        await climb(process.pid, lambda: process.poll() is not None, ladder, f"stub '{self.instance_name}'", log,
                    group=True, extra={"model": self.model_name, "instance": self.instance_name})

    def _release_shared_objects(self) -> None:
        self._dead = True
        self.alive = False
        if self._exit is not None:
            self._exit.close()
        if self.exchange is not None:
            self.exchange.close()
        if self.link is not None:
            self.link.close()
        for resource in (self.p2s, self.s2p, self.control):
            if resource is not None:
                resource.close()  # anonymous: unmapped here and closed in the stub, they are gone


class _BoundFeatures:
    """The features' side of one stub, as its exchange sees it (exchange.ExchangeFeatures): the
    server's client regions and GPU exports, bound to this stub."""

    __slots__ = ("_services", "_stub")

    def __init__(self, services: StubServices, stub: StubProcess) -> None:
        self._services = services
        self._stub = stub

    def region_handle(self, tensor: Tensor) -> list[Any] | None:
        return self._services.client_regions.region_handle(tensor)

    def attach_regions(self, request: InferRequest, stream: ResponseStream) -> dict[str, list[Any]]:
        return self._services.client_regions.attach_regions(request, self._stub, stream)

    def claim_input(self, tensor: Tensor) -> WireTensor:
        return self._services.device_exports.claim_tensor(tensor, self._stub, "input")

    def release_unsent(self, wire_inputs: list[WireTensor]) -> None:
        self._services.device_exports.release_unsent(self._stub, wire_inputs)

    def outputs(self, wire_outputs: list[WireTensor], view: Callable[[list[Any]], memoryview]) -> list[Tensor]:
        return self._services.device_exports.outputs(self._stub, wire_outputs, view)

    def discard(self, wire_outputs: list[WireTensor]) -> None:
        self._services.device_exports.discard(self._stub, wire_outputs)

    def drop_hold(self, key: tuple[str, int]) -> None:
        self._services.device_exports.drop_hold(key)
