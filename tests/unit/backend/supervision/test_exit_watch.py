"""ExitWatch: a child's exit known from a pidfd the loop watches, with `poll()` where there is none."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from pystub_backend.backend.supervision.exit_watch import ExitWatch

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _until_exited(watch: ExitWatch, deadline_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not watch.exited:
        assert loop.time() < end, f"timed out after {deadline_s} s waiting for the watched child's exit"
        await asyncio.sleep(0.01)


def test_the_loop_sees_the_exit_without_reaping_it() -> None:
    async def main() -> None:
        process = subprocess.Popen(_SLEEPER)
        try:
            watch = ExitWatch(process)
            assert watch.watched and not watch.exited
            process.send_signal(signal.SIGKILL)
            await _until_exited(watch)
            assert process.returncode is None  # the watch never waited: the status is the owner's
            assert not watch.watched  # the pidfd is closed once the exit is seen
        finally:
            process.kill()
            process.wait(10)
        assert process.returncode == -signal.SIGKILL
    asyncio.run(main())


def test_without_a_loop_it_asks_the_process() -> None:
    process = subprocess.Popen(_SLEEPER)
    try:
        watch = ExitWatch(process)
        assert not watch.watched and not watch.exited
        process.kill()
        process.wait(10)
        assert watch.exited
    finally:
        process.kill()
        process.wait(10)


def test_closing_before_the_exit_falls_back_and_leaks_no_descriptor() -> None:
    async def main() -> None:
        before = _open_fds()
        process = subprocess.Popen(_SLEEPER)
        try:
            watch = ExitWatch(process)
            assert watch.watched
            watch.close()
            watch.close()  # idempotent
            assert not watch.watched and not watch.exited
            process.kill()
            process.wait(10)
            assert watch.exited  # from poll(), now the watch is closed
        finally:
            process.kill()
            process.wait(10)
        assert _open_fds() == before
    asyncio.run(main())


def test_a_child_already_reaped_is_exited() -> None:
    async def main() -> None:
        process = subprocess.Popen([sys.executable, "-c", "pass"])
        process.wait(10)
        watch = ExitWatch(process)  # its pid may be reused: never opened as a pidfd
        assert not watch.watched and watch.exited
    asyncio.run(main())
