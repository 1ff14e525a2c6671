"""pystub_backend.backend.supervision.hang_judge: a late heartbeat is a hang only when the stub shows
no other sign of life, judged against a fake process (its CPU time and thread states) on a
simulated clock: stopped and deadlocked stubs are killed within the limit plus one check; busy
and starved ones are not, and the supervisor's own lateness is not held against a stub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pystub_backend.backend.supervision.hang_judge import HangJudge, ProcessProgress, read_progress

LIMIT = 5.0
TICK = 0.5


class FakeProcess:
    """What the judge reads of a stub: its threads' states and CPU seconds, set by the test. The
    first thread is the model's; the others wait for the GIL, waking every 5 ms (about 1% of a CPU)."""

    def __init__(self, states: str = "SS") -> None:
        self.cpu = [1.0] * len(states)
        self.states = states
        self.gone = False
        self.looks = 0

    def __call__(self) -> ProcessProgress | None:
        self.looks += 1
        if self.gone:
            return None
        return ProcessProgress({tid: (state, self.cpu[tid]) for tid, state in enumerate(self.states)})

    def run(self, seconds: float, model_share: float) -> None:
        self.cpu[0] += seconds * model_share
        for waiter in range(1, len(self.cpu)):
            self.cpu[waiter] += seconds * 0.01


def _killed_after(judge: HangJudge, process: FakeProcess, last_beat: float, *, model_share: float = 0.0,
                  lateness: float = 0.0, until: float = 60.0) -> float | None:
    """Tick the judge from `last_beat` (the heartbeat then stops) until it calls the stub hung;
    returns the seconds since the last beat, None when it never did within `until`."""
    now = last_beat
    while now - last_beat < until:
        now += TICK + lateness
        process.run(TICK + lateness, model_share)
        if judge.judge(now, now - last_beat, lateness) is not None:
            return now - last_beat
    return None


def test_a_stopped_stub_is_hung_within_the_limit_plus_one_check_even_when_the_supervisor_is_late() -> None:
    process = FakeProcess("TT")
    killed = _killed_after(HangJudge(LIMIT, process), process, 100.0, lateness=2.0)
    assert killed is not None and LIMIT < killed <= LIMIT + TICK + 2.0


def test_a_deadlocked_stub_is_hung_within_the_limit_plus_one_check() -> None:
    process = FakeProcess("SSS")
    judge = HangJudge(LIMIT, process)
    killed = _killed_after(judge, process, 100.0)
    assert killed is not None and LIMIT < killed <= LIMIT + TICK
    assert "asleep, using no CPU" in (judge.judge(200.0, 100.0) or "")


def test_a_busy_stub_is_never_hung_while_a_thread_works() -> None:
    process = FakeProcess("RSS")
    assert _killed_after(HangJudge(LIMIT, process), process, 100.0, model_share=1.0) is None
    process = FakeProcess("SSS")  # on a loaded machine the model's thread gets a fifth of a CPU
    assert _killed_after(HangJudge(LIMIT, process), process, 100.0, model_share=0.2) is None


def test_threads_waking_to_wait_for_the_gil_are_no_work() -> None:
    process = FakeProcess("SSSSSS")  # the model asleep in a C call holding the GIL; five waiters
    killed = _killed_after(HangJudge(LIMIT, process), process, 100.0, model_share=0.0)
    assert killed is not None and killed <= LIMIT + TICK


def test_a_stub_waiting_for_a_cpu_is_not_hung_and_is_once_it_sleeps_without_progress() -> None:
    process = FakeProcess("RS")
    judge = HangJudge(LIMIT, process)
    assert _killed_after(judge, process, 100.0, until=30.0) is None
    process.states = "SS"
    killed_at = next(now for now in (130.0 + TICK * i for i in range(1, 40)) if judge.judge(now, now - 100.0))
    assert LIMIT < killed_at - 130.0 <= LIMIT + TICK


def test_the_supervisors_lateness_is_not_held_against_an_idle_stub() -> None:
    process = FakeProcess("SS")
    judge = HangJudge(LIMIT, process)
    assert judge.judge(104.0, 4.0) is None
    assert judge.judge(110.0, 10.0, lateness=5.5) is None  # this process was starved for 5.5 s too
    assert judge.judge(112.0, 12.0) is not None  # then 7 s of its own time without a sign of life


def test_a_heartbeat_on_time_needs_no_look_at_the_process_and_a_gone_one_is_no_hang() -> None:
    process = FakeProcess()
    judge = HangJudge(LIMIT, process)
    for tick in range(20):
        assert judge.judge(100.0 + tick, 1.0) is None
    assert process.looks == 0
    process.gone = True
    assert judge.judge(200.0, 50.0) is None  # a dead stub is the channel's to report


def test_read_progress_sees_a_stopped_process_and_cpu_time_of_a_busy_one() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first, looked = read_progress(busy.pid), time.monotonic()
        assert first is not None
        deadline = looked + 30
        while (later := read_progress(busy.pid)) is not None and later.busiest_share(first, 1.0) < 0.1:
            assert time.monotonic() < deadline, "timed out waiting for the busy process's CPU time to grow"
            time.sleep(0.05)
        os.kill(busy.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not (progress := read_progress(busy.pid)) or not progress.stopped:
            assert time.monotonic() < deadline, "timed out waiting for the process to show as stopped"
            time.sleep(0.05)
    finally:
        busy.kill()
        busy.wait(30)
    assert read_progress(busy.pid) is None
