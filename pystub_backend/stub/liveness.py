"""Liveness both ways: the stub's heartbeat, and its exit when the backend is gone.

The heartbeat thread never runs model code, so a model stuck in `execute` keeps beating (that case
is caught by the execute deadline); a stub whose interpreter is frozen (SIGSTOP, a C call holding
the GIL) stops beating and the supervisor sees it. Parent death is caught twice: the kernel's
parent-death signal (SIGKILL, set at start) and polling `getppid()`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any

from pystub_backend.ipc.control_block import ControlBlock
from pystub_backend.ipc.exit_codes import StubExitCode

__all__ = ["set_parent_death_signal", "ignore_termination_signals", "Heartbeat"]

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the polling below still catches it
    if os.getppid() != parent_pid:
        _exit_orphaned()


def ignore_termination_signals() -> None:
    """Stubs stop on a FINALIZE message; SIGINT/SIGTERM from a terminal or a group kill are ignored.

    Ignored by a handler that only records them, not by SIG_IGN: an ignored disposition is inherited
    across exec, so a process the model starts (a multiprocessing "spawn" pool, a subprocess) could
    not be terminated by its own parent; a handler is reset to the default in the new program.
    """
    signal.signal(signal.SIGINT, _record_signal)
    signal.signal(signal.SIGTERM, _record_signal)


ignored_signals: dict[int, int] = {}  # signal number -> how often it reached the stub and was ignored


def _record_signal(signum: int, frame: object) -> None:
    ignored_signals[signum] = ignored_signals.get(signum, 0) + 1


def _exit_orphaned() -> None:
    sys.stderr.write("Non-graceful termination detected.\n")
    sys.stderr.flush()
    os._exit(StubExitCode.PARENT_GONE)


class Heartbeat(threading.Thread):
    def __init__(self, control: ControlBlock, parent_pid: int, interval: float, arena: Any = None) -> None:
        super().__init__(name="pystub-heartbeat", daemon=True)
        self._control = control
        self._arena = arena  # the s2p ArenaWriter: its usage is published with each beat
        self._parent_pid = parent_pid
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._control.beat()
            if self._arena is not None:
                self._control.set_arena(self._arena.used, self._arena.total)
            if os.getppid() != self._parent_pid:
                _exit_orphaned()
            self._stop_event.wait(self._interval)

    def stop(self) -> None:
        self._stop_event.set()
