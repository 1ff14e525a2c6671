"""The leak check that runs around every test (conftest's autouse `no_leaks`): it finds child
processes and descriptors left behind, ignores the long-lived backends' own, and lets the garbage
collector close what only an unreachable object still holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from harness import LONG_LIVED_PIDS, LeakSnapshot, check_no_leaks
from stream_clients import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
PARENT_OF_SLEEPER = [sys.executable, "-c",
                     f"import subprocess, time; subprocess.Popen({SLEEPER!r}); time.sleep(60)"]


def _wait_until_exec(process: subprocess.Popen) -> None:
    """Until `process` runs its own program: between fork and exec its command line is still this
    interpreter's (a loaded machine stretches that gap)."""
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    wait_until(lambda: b"time.sleep" in cmdline.read_bytes(), 30, f"child {process.pid} to exec")


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(10)


def test_a_child_left_running_is_found_with_its_command_line() -> None:
    before = LeakSnapshot.take()
    child = subprocess.Popen(SLEEPER)
    try:
        _wait_until_exec(child)
        problems = check_no_leaks(before, settle=0.2)
        found = [p for p in problems if "child processes left" in p and str(child.pid) in p and "time.sleep" in p]
        assert found, problems
    finally:
        _stop(child)
    assert check_no_leaks(before) == []


def test_grandchildren_count_unless_under_a_long_lived_process() -> None:
    before = LeakSnapshot.take()
    parent = subprocess.Popen(PARENT_OF_SLEEPER)
    try:
        problems = check_no_leaks(before, settle=0.2)
        assert any(str(parent.pid) in p for p in problems), problems
        LONG_LIVED_PIDS.add(parent.pid)
        assert check_no_leaks(before, settle=0.2) == []  # neither it nor the child it started
    finally:
        LONG_LIVED_PIDS.discard(parent.pid)
        for pid in LeakSnapshot.take().children - before.children:  # the grandchild, then the parent
            os.kill(pid, 9)
        parent.wait(10)
    assert check_no_leaks(before) == []


def test_a_descriptor_left_open_is_found_and_one_held_by_garbage_is_collected() -> None:
    before = LeakSnapshot.take()
    kept = socket.socket()
    try:
        assert any("file descriptors left" in p for p in check_no_leaks(before, settle=0.2))
    finally:
        kept.close()

    class Cycle:
        def __init__(self) -> None:
            self.me = self
            self.fd = os.open(os.devnull, os.O_RDONLY)

        def __del__(self) -> None:
            os.close(self.fd)

    Cycle()  # unreachable at once, but its descriptor stays open until a collection
    assert check_no_leaks(before) == []
