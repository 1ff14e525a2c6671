"""The stub process: one model instance, driven by the backend over a channel and two arenas.

Threads:
    main       runs AutoComplete, Init, Execute, Finalize (model code runs here); while idle it
               reads the channel itself (no thread hand-off per request, stub/reader.py)
    receiver   reads the channel while main is busy: frees s2p handles on Release at once,
               reads SPILLED frames (over the frame limit) out of p2s and releases them,
               queues main's work for it in arrival order
    heartbeat  liveness.Heartbeat
    async      event_loop.InstanceLoop, on first `async def execute`
"""

from __future__ import annotations

import inspect
import json
import os
import queue
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pystub_backend.ipc import spill
from pystub_backend.ipc.arena import ArenaReader, ArenaWriter
from pystub_backend.ipc.channel import BlockingChannel, ChannelClosedError
from pystub_backend.ipc.control_block import ControlBlock, StubState
from pystub_backend.ipc.exit_codes import StubExitCode
from pystub_backend.ipc.heap import raise_malloc_thresholds
from pystub_backend.ipc.isolation import forbid_inspection
from pystub_backend.ipc.messages import core as msg
from pystub_backend.stub import output_buffers, pb_utils
from pystub_backend.stub.batched import BatchedExecute, has_execute_batch
from pystub_backend.stub.device_pinning import pinned_args
from pystub_backend.stub.event_loop import InstanceLoop, unwrap
from pystub_backend.stub.execute_batch import run_batch
from pystub_backend.stub.executor import format_traceback, model_frames
from pystub_backend.stub.features.install import install_features
from pystub_backend.stub.handlers import StubHandlers
from pystub_backend.stub.liveness import Heartbeat, ignore_termination_signals, set_parent_death_signal
from pystub_backend.stub.loader import LoadError, load_model_class
from pystub_backend.stub.pb_utils import _runtime
from pystub_backend.stub.reader import HANDBACK, PARK_CHECK, POLL, ReadOwnership
from pystub_backend.stub.rescheduled import RescheduledRequests
from pystub_backend.stub.senders import RequestRegistry

__all__ = ["StubOptions", "Stub", "prepare_process"]

_FINAL = msg.RESPONSE_FINAL
_LOG_ERROR = 2


@dataclass
class StubOptions:
    instance: str
    base: str
    fd: int
    control_fd: int
    parent_pid: int
    shm_default: int
    shm_growth: int
    heartbeat_interval: float
    send_timeout: float
    rlimits: dict[str, int]
    fork_fd: int = -1  # a shared-weights template's fork socket (stub/fork_server.py); -1: an ordinary stub


class Stub:
    def __init__(self, options: StubOptions) -> None:
        self.options = options
        self.instance = options.instance
        try:
            self.control = ControlBlock.attach_fd(options.control_fd)
        finally:
            os.close(options.control_fd)  # mapped; no descriptor of it stays in this process
        os.set_inheritable(options.fd, False)  # processes the model starts must not hold our channel
        self.channel = BlockingChannel(socket.socket(fileno=options.fd))
        self.p2s = ArenaReader(options.base, "p2s")
        self.s2p = ArenaWriter(options.base, "s2p", options.shm_default, options.shm_growth)
        # Arenas have no names: p2s segments arrive with the backend's frames, s2p ones leave with ours.
        self.channel.carry_segments(self.s2p, self.p2s)
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()  # frames the receiver read for main
        self.reading = ReadOwnership()  # who reads the channel now: main when idle, else the receiver
        self.loop = InstanceLoop(self.log_error)
        self.model: Any = None
        self.model_name = ""
        self.model_version = 0
        self.decoupled = False
        self.batched: BatchedExecute | None = None  # pystub extension: the model's execute_batch
        self.rescheduled = RescheduledRequests()  # iterative sequences (rescheduled.py)
        self.busy_until_ns = 0  # when the last EXECUTE_DONE went (execute_batch.py)
        self.handlers = StubHandlers()
        install_features(self.handlers)
        self._send_hooks = self.handlers.send_hooks()
        self._reply_kinds = self.handlers.reply_kinds()
        self.boot_failure: StubExitCode | None = None  # set when INIT failed: the stub then exits with it
        output_buffers.install(self.s2p)  # pb_utils.new_output_array
        self.requests = RequestRegistry(self.instance, self.send, self.s2p, lambda: self.decoupled,
                                        options.send_timeout, self.reading.need_reader)

    # -- plumbing ------------------------------------------------------------------------------
    def send(self, message: Any) -> None:
        for hook in self._send_hooks:  # e.g. buffered metric changes go out before this frame
            hook(self, message)
        if type(message) in self._reply_kinds:  # its answer must be read even while main is busy
            self.reading.need_reader()
        frame = msg.encode(message)
        if not spill.fits(frame):  # e.g. a response with megabytes of parameters: it goes in s2p
            frame, handle = spill.spill(frame, self.s2p)
            try:
                self.channel.send(frame, self.options.send_timeout, type(message).__name__)
            except BaseException:
                self.s2p.free(handle)  # never sent: the backend will not release it
                raise
            return
        self.channel.send(frame, self.options.send_timeout, type(message).__name__)

    def log(self, level: int, text: str, filename: str = "stub", lineno: int = 0) -> None:
        try:
            self.send(msg.Log(level, text, filename, lineno))
        except (ChannelClosedError, OSError):
            sys.stderr.write(text + "\n")

    def log_error(self, text: str) -> None:
        self.log(_LOG_ERROR, text, "pb_stub", 0)

    def _read(self, timeout: float) -> Any:
        """The next frame as a message, or None when none arrived within `timeout` s or it was
        corrupt (logged). Raises ChannelClosedError. Only the thread that owns reading calls it."""
        frame = self.channel.recv(timeout)
        if frame is None:
            return None
        try:
            message = msg.decode(frame)
            if type(message) is msg.Spilled:
                message = self._unspill(message)
        except msg.MessageDecodeError as exc:
            self.log_error(f"stub '{self.instance}' dropped a corrupt frame: {exc}")
            return None
        return message

    def read_for_reply(self, arrived: queue.SimpleQueue[Any], deadline: float) -> bool:
        """The main thread, reading inside its handler (ReadOwnership.read_in_handler): read and
        act on frames until `arrived` holds one or `deadline` (time.monotonic) passes; frames
        that are main-thread work are queued for after the handler, in arrival order. False when
        the channel closed (the main loop then ends after the handler)."""
        while arrived.empty():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            try:
                message = self._read(min(left, PARK_CHECK))
            except ChannelClosedError:
                self.work.put(None)
                return False
            if message is not None and self._on_frame(message):
                self.work.put(message)
        return True

    def _receive(self) -> None:
        """The receiver thread: reads while the main thread is busy (pystub_backend.stub.reader)."""
        while True:
            self.reading.wait_for_turn()
            while True:
                try:
                    message = self._read(POLL)
                except ChannelClosedError:
                    self.work.put(None)
                    return
                if message is not None and self._on_frame(message):
                    self.work.put(message)
                if self.reading.give_back():
                    self.work.put(HANDBACK)
                    break

    def _on_frame(self, message: Any) -> bool:
        """Act on a frame at once; True when it is the main thread's work (AutoComplete, Init,
        Execute, Finalize, features' main-thread kinds), to run in arrival order."""
        try:
            return self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - a malformed frame must not end the reader
            self.log_error(f"stub '{self.instance}' dropped a malformed {type(message).__name__} frame: "
                           f"{type(exc).__name__}: {exc}")
            return False

    def _unspill(self, message: msg.Spilled) -> Any:
        """The message a SPILLED frame names in p2s; the backend frees its bytes on our RELEASE."""
        return spill.unspill(message, self.p2s, self._release_p2s)

    def _release_p2s(self, handle: list[int]) -> None:
        try:
            self.send(msg.Release([handle], []))
        except (ChannelClosedError, OSError):
            pass  # the backend is gone: its arena goes with it

    def _dispatch(self, message: Any) -> bool:
        """Act on one frame on the reading thread (it must not block); True for main-thread work."""
        kind = type(message)
        if kind is msg.Execute:  # the common frame first
            return True
        if kind is msg.Release:
            self.free(message.handles)
            self.requests.on_credits(message.credits)
        elif kind is msg.Cancel:
            self.requests.on_cancel(message.rids)
        elif (feature := self.handlers.receiver_handler(kind)) is not None:
            feature(self, message)
        elif kind is msg.IsReady:
            # Readiness is asked while execute may run: answer from a thread of its own.
            threading.Thread(target=self._is_ready, args=(message.token,), daemon=True,
                             name="pystub-is-ready").start()
        else:
            return True  # the main thread says it has no handler for it
        return False

    def free(self, handles: list[list[int]]) -> None:
        """Free s2p handles the backend released (or that never left); an unknown one is logged."""
        for handle in handles:
            try:
                self.s2p.free(handle)
            except (KeyError, IndexError, ValueError, TypeError):
                self.log_error(f"stub '{self.instance}' was asked to free an unknown handle {handle}")

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> int:
        self.control.set_pid(os.getpid())
        heartbeat = Heartbeat(self.control, self.options.parent_pid, self.options.heartbeat_interval, self.s2p)
        heartbeat.start()
        threading.Thread(target=self._receive, name="pystub-receiver", daemon=True).start()
        _runtime.set_log_sink(self._log_from_model)
        handlers: dict[type, Callable[[Any], None]] = {msg.AutoComplete: self._auto_complete, msg.Init: self._init,
                    msg.Execute: self._execute, msg.Finalize: self._finalize}
        while True:
            message = self._next_work()
            if message is None:  # the backend closed the channel: it is gone or gave up on us
                sys.stderr.write("Non-graceful termination detected.\n")
                return StubExitCode.CHANNEL_CLOSED
            handler = handlers.get(type(message))
            self.reading.handler_started()
            try:
                if handler is not None:
                    handler(message)
                else:
                    self._run_feature(message)
            except Exception as exc:  # noqa: BLE001 - a malformed frame must not end the stub
                self.log_error(f"stub '{self.instance}' dropped a malformed {type(message).__name__} frame: "
                               f"{type(exc).__name__}: {exc}")
            finally:
                self.reading.handler_finished()
            if isinstance(message, (msg.Finalize, msg.AutoComplete)) or self.boot_failure is not None:
                heartbeat.stop()
                return self.boot_failure or StubExitCode.OK

    def _next_work(self) -> Any:
        """The main thread's next message (None: the channel closed). Frames the receiver queued
        come first, in order; then, when reading is the main thread's, it reads the channel itself
        and acts on frames that are not its work at once (pystub_backend.stub.reader)."""
        while True:
            if self.reading.main_may_read():
                if not self.work.empty():
                    message = self.work.get_nowait()
                else:
                    try:
                        message = self._read(PARK_CHECK)
                    except ChannelClosedError:
                        return None
                    if message is None or not self._on_frame(message):
                        continue
            else:
                try:
                    message = self.work.get(timeout=PARK_CHECK)
                except queue.Empty:
                    continue
            if message is not HANDBACK:
                return message

    def _run_feature(self, message: Any) -> None:
        feature = self.handlers.main_handler(type(message))
        if feature is None:
            self.log_error(f"stub '{self.instance}' has no handler for {type(message).__name__}")
        else:
            feature(self, message)

    def _log_from_model(self, level: int, message: str, filename: str, lineno: int) -> None:
        self.log(level, message, filename, lineno)

    # -- commands ------------------------------------------------------------------------------
    def _auto_complete(self, message: msg.AutoComplete) -> None:
        config = json.loads(message.config_json)
        try:
            model_class = load_model_class(message.model_path)
            hook = getattr(model_class, "auto_complete_config", None)
            if hook is None:
                self.send(msg.AutoCompleteDone(message.config_json, None))
                return
            result = hook(pb_utils.ModelConfig(message.config_json))
            if not isinstance(result, pb_utils.ModelConfig):
                raise LoadError(f"auto_complete_config function in model '{config.get('name', '')}' must "
                                f"return a valid pb.ModelConfig object.")
            self.send(msg.AutoCompleteDone(json.dumps(result._model_config), None))
        except Exception as exc:
            self.send(msg.AutoCompleteDone(None, self._describe(exc)))

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, LoadError):
            return str(exc)
        return f"{type(exc).__name__}: {exc}\n\n{format_traceback(exc)}"

    def _init(self, message: msg.Init) -> None:
        args = message.args
        self.model_name = args["model_name"]
        self.model_version = int(args["model_version"])
        self.decoupled = bool(message.settings.get("decoupled", False))
        _runtime.set_model_dir(os.path.dirname(message.model_path))
        _runtime.set_instance_name(self.instance)
        self.handlers.notify_phase(self, "initializing")
        self.boot_failure = StubExitCode.MODEL_IMPORT_FAILED
        try:
            args = pinned_args(args)  # PYSTUB_PIN_GPU: before the model can start CUDA
            model_class = load_model_class(message.model_path, message.sources)
            if not callable(getattr(model_class, "execute", None)) and not has_execute_batch(model_class):
                raise LoadError(f"Python model {message.model_path} does not implement `execute` method.")
            self.boot_failure = StubExitCode.INITIALIZE_FAILED
            self.batched = BatchedExecute.create(model_class, args.get("model_config", "{}"), self.instance,
                                                 self.decoupled)
            self.model = model_class()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                initialize(args)
        except Exception as exc:
            text = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}{model_frames(exc)}"
            self.send(msg.InitDone(text, format_traceback(exc), False))
            return  # run() exits with self.boot_failure
        self.boot_failure = None
        self.control.set_state(StubState.READY)
        self.handlers.notify_phase(self, "ready")
        self.send(msg.InitDone(None, None, callable(getattr(self.model, "is_ready", None))))

    def _execute(self, message: msg.Execute) -> None:
        run_batch(self, message)

    def _finalize(self, message: msg.Finalize) -> None:
        self.control.set_state(StubState.FINALIZING)
        self.handlers.notify_phase(self, "finalizing")
        error = None
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                finalize()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.log_error(f"finalize of '{self.instance}' failed: {error}\n{format_traceback(exc)}")
        self.loop.stop()
        self.send(msg.FinalizeDone(error))

    def _is_ready(self, token: int) -> None:
        """Run the model's `is_ready()` (sync or async) and report it (docs/reference/model-api.md#model-readiness)."""
        ready, error = False, None
        try:
            result = self.model.is_ready()
            if inspect.isawaitable(result):
                result = self.loop.submit(_await(result)).result()
            if not isinstance(result, bool):
                error = "is_ready() must return a boolean value"
            elif result:
                ready = True
            else:
                error = f"Model '{self.instance}' is not ready (user-defined check failed)."
        except BaseException as exc:  # noqa: BLE001 - the model's sys.exit() too: the backend gets its answer
            exc = unwrap(exc)
            error = f"is_ready() of model '{self.instance}' raised {type(exc).__name__}: {exc}"
        try:
            self.send(msg.IsReadyDone(token, ready, error))
        except (ChannelClosedError, OSError):
            pass

async def _await(awaitable: Any) -> Any:
    return await awaitable


def apply_rlimits(limits: dict[str, int]) -> None:
    """Limit this process (address space, CPU seconds, open files) before model code runs."""
    names = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "nofile": resource.RLIMIT_NOFILE}
    for name, value in limits.items():
        which = names[name]
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and value > hard:
            value = hard
        resource.setrlimit(which, (value, value))


def prepare_process(options: StubOptions) -> None:
    """What every stub process does before it attaches to the backend (templates too)."""
    ignore_termination_signals()
    set_parent_death_signal(options.parent_pid)
    forbid_inspection()  # other stubs (same uid) cannot read this one's memory through /proc
    apply_rlimits(options.rlimits)
    raise_malloc_thresholds()  # tensor-sized buffers are reused, not faulted in per request


def main(options: StubOptions) -> int:
    prepare_process(options)
    try:
        stub = Stub(options)
    except (OSError, ValueError) as exc:  # its shared objects or channel are not there
        sys.stderr.write(f"stub '{options.instance}' could not attach to the backend: {exc}\n")
        return StubExitCode.BOOT_FAILED
    try:
        return stub.run()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
