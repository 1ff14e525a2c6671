"""The shared-weights template: a stub that runs the model's `initialize` once, then forks the
model's instances from itself (docs/shared-weights.md).

    backend ──Init──▶ template        initialize runs on a thread of its own while the main thread
                                      keeps reading the channel (metric and BLS replies); thread
                                      pools a library keeps per thread (GNU OpenMP's) end with it
    backend ──ForkCheck──▶            "forking" phase (pystub's threads stop), gc.freeze(), then
            ◀──ForkCheckDone──        stub.fork_safety says whether a fork is safe
    backend ══Fork + fds══▶           os.fork(); the child becomes the instance
            ◀══ForkDone + pidfd══     (stub.forked_instance) with the channel, control block,
                                      stdout and stderr that came with the frame
            ◀══ForkedExit══           a child reaped (SIGCHLD wakes the loop), its status
    backend ──Finalize──▶             the model's finalize, FinalizeDone, exit

(── the template's channel, ══ its fork socket: ipc/messages/forks.py.) The template has one
thread between requests: its main loop waits on the channel, the fork socket and the SIGCHLD
wake-up pipe at once, beats the heartbeat and checks its parent on each turn. It never serves
an EXECUTE. Its children die with it (their parent-death signal), and it with the backend.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import threading
from typing import Any, NamedTuple

from pystub_backend.ipc.channel import ChannelClosedError
from pystub_backend.ipc.descriptors import close_all, receive_with_fds, send_with_fds
from pystub_backend.ipc.exit_codes import StubExitCode
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.forks import FORK_FDS, Fork, ForkCheck, ForkCheckDone, ForkDone, ForkedExit
from pystub_backend.stub import fork_safety
from pystub_backend.stub.forked_instance import SharedModel, become_instance
from pystub_backend.stub.stub import Stub, StubOptions, prepare_process

__all__ = ["TemplateServer", "run_template"]


class _Prepared(NamedTuple):
    refusal: str | None


class TemplateServer:
    def __init__(self, stub: Stub, fork_socket: socket.socket) -> None:
        self.stub = stub
        self.fork_socket = fork_socket
        self.fork_socket.settimeout(stub.options.send_timeout)  # bounds our sends; reads follow select
        # The threads the stub has before any model code: numpy's BLAS pool (fork_safety).
        self.baseline = fork_safety.task_ids()
        self.shared: SharedModel | None = None  # the model, once initialize succeeded
        self._init_thread: threading.Thread | None = None
        self._init_message: msg.Init | None = None
        self._prepared: _Prepared | None = None  # the fork check's verdict (it runs once)
        self._fork_open = True
        self._wake_read, self._wake_write = os.pipe()
        for fd in (self._wake_read, self._wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._wake_write)
        signal.signal(signal.SIGCHLD, _note_child)  # the handler only records; the loop reaps

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> int:
        """Run until FINALIZE (0), a failed initialize (its boot exit code) or a closed channel."""
        channel = self.stub.channel.fileno()
        self.stub.control.set_pid(os.getpid())
        while True:
            watched = [channel, self._wake_read] + ([self.fork_socket.fileno()] if self._fork_open else [])
            readable, _, _ = select.select(watched, [], [], self.stub.options.heartbeat_interval)
            self.stub.control.beat()
            if os.getppid() != self.stub.options.parent_pid:
                return StubExitCode.PARENT_GONE
            if self._wake_read in readable:
                _drain(self._wake_read)
            self._reap()
            done = self._init_finished(wait=0)
            if done is not None:
                return done
            if channel in readable:
                try:
                    message = self.stub._read(0)
                except ChannelClosedError:
                    return StubExitCode.CHANNEL_CLOSED
                if message is not None:
                    code = self._on_message(message)
                    if code is not None:
                        return code
            if self._fork_open and self.fork_socket.fileno() in readable:
                self._on_fork_frame()

    def _on_message(self, message: Any) -> int | None:
        kind = type(message)
        if kind is msg.Init:
            self._start_initialize(message)
        elif kind is ForkCheck:
            # Asked right after INIT_DONE, which the initialize thread sends as its last act.
            done = self._init_finished(wait=self.stub.options.send_timeout)
            if done is not None:
                return done
            self.stub.send(ForkCheckDone(self._prepare().refusal))
        elif kind is msg.Finalize:
            self.stub._finalize(message)  # the model's finalize in the template, after its instances'
            return StubExitCode.OK
        elif self.stub._on_frame(message):  # Release, metric replies...: handled at once; the rest:
            self.stub.log_error(f"the template '{self.stub.instance}' does not run {kind.__name__}")
        return None

    # -- initialize, once ----------------------------------------------------------------------
    def _start_initialize(self, message: msg.Init) -> None:
        if self._init_message is not None:
            self.stub.log_error(f"the template '{self.stub.instance}' is initialized once")
            return
        self._init_message = message
        # On a thread of its own: the main thread keeps reading the replies initialize may wait
        # for, and per-thread pools (GNU OpenMP's) end with this thread, before any fork.
        self._init_thread = threading.Thread(target=self.stub._init, args=(message,),
                                             name="pystub-template-initialize", daemon=True)
        self._init_thread.start()

    def _init_finished(self, wait: float) -> int | None:
        """Join the initialize thread once it ended (waiting up to `wait` s); its boot exit code
        when initialize failed (INIT_DONE said so)."""
        thread = self._init_thread
        if thread is None:
            return None
        thread.join(wait)
        if thread.is_alive():
            return None
        self._init_thread = None
        if self.stub.boot_failure is not None:
            return self.stub.boot_failure
        assert self._init_message is not None
        self.shared = SharedModel(self.stub.model, os.path.abspath(self._init_message.model_path))
        return None

    def _prepare(self) -> _Prepared:
        """Ready the process for forking, once: pystub's threads stopped, the collector's objects
        frozen (their headers are not written again, so their pages stay shared), the check."""
        if self._prepared is not None:
            return self._prepared
        if self.shared is None:
            return _Prepared("the model is not initialized")
        self.stub.handlers.notify_phase(self.stub, "forking")
        gc.collect()
        gc.freeze()
        own = {self.stub.channel.fileno(), self.fork_socket.fileno()}
        self._prepared = _Prepared(fork_safety.fork_refusal(self.baseline, own))
        return self._prepared

    # -- forks ---------------------------------------------------------------------------------
    def _on_fork_frame(self) -> None:
        try:
            frame, fds = receive_with_fds(self.fork_socket)
        except (BlockingIOError, TimeoutError):
            return
        except OSError as exc:
            self.stub.log_error(f"the template '{self.stub.instance}' dropped a fork frame: {exc}")
            return
        if not frame:  # the backend closed it: the channel's end follows
            self._fork_open = False
            return
        try:
            request = msg.decode(frame)
        except msg.MessageDecodeError as exc:
            close_all(fds)
            self.stub.log_error(f"the template '{self.stub.instance}' dropped a corrupt fork frame: {exc}")
            return
        if type(request) is not Fork or len(fds) != len(FORK_FDS):
            close_all(fds)
            self.stub.log_error(f"the template '{self.stub.instance}' dropped a {type(request).__name__} "
                                f"with {len(fds)} descriptors on its fork socket")
            return
        self._fork(request, fds)

    def _fork(self, request: Fork, fds: list[int]) -> None:
        prepared = self._prepared
        if self.shared is None or prepared is None or prepared.refusal is not None:
            close_all(fds)
            self._notify(ForkDone(request.token, 0, "the template has not been cleared to fork"))
            return
        sys.stdout.flush()
        sys.stderr.flush()  # buffered output would be written twice, by the child too
        try:
            pid = os.fork()
        except OSError as exc:
            close_all(fds)
            self._notify(ForkDone(request.token, 0, f"fork failed: {exc}"))
            return
        if pid == 0:
            become_instance(self.stub, self.shared, request, fds,
                            [self.fork_socket.fileno(), self._wake_read, self._wake_write])
        close_all(fds)  # the child's now; a later child must not inherit them
        try:
            pidfd = os.pidfd_open(pid)  # before any reaping: it is this very child
        except OSError as exc:
            self._notify(ForkDone(request.token, pid, f"pidfd_open failed: {exc}"))
            return
        try:
            self._notify(ForkDone(request.token, pid, None), [pidfd])
        finally:
            os.close(pidfd)

    def _reap(self) -> None:
        """Collect every child that ended (no zombie stays) and tell the backend its status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._notify(ForkedExit(pid, os.waitstatus_to_exitcode(status)))

    def _notify(self, message: NamedTuple, fds: list[int] | None = None) -> None:
        if not self._fork_open:
            return
        try:
            send_with_fds(self.fork_socket, msg.encode(message), fds or [])
        except OSError as exc:  # the backend is gone or stopped reading: the channel says which
            self.stub.log_error(f"the template '{self.stub.instance}' could not send {type(message).__name__}: {exc}")


def _note_child(signum: int, frame: object) -> None:
    """SIGCHLD: nothing to do here; the wake-up byte the signal writes ends the loop's wait."""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def run_template(options: StubOptions) -> int:
    """A template stub's main (the stub entry point with --fork-fd): the process set-up of every
    stub, then the template's loop instead of the stub's."""
    prepare_process(options)
    try:
        stub = Stub(options)
        fork_socket = socket.socket(fileno=options.fork_fd)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"template '{options.instance}' could not attach to the backend: {exc}\n")
        return StubExitCode.BOOT_FAILED
    os.set_inheritable(fork_socket.fileno(), False)
    try:
        return TemplateServer(stub, fork_socket).serve()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
