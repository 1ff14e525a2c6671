"""stub.fork_safety: what keeps a shared-weights template from forking, checked in this process
with real threads and sockets."""

from __future__ import annotations

import socket
import threading

import numpy as np
from stream_clients import wait_until

from pystub_backend.stub import fork_safety


def test_a_process_with_only_its_own_threads_may_fork() -> None:
    baseline = fork_safety.task_ids()  # this test process's (numpy's BLAS pool, pytest's)
    sockets = set(fork_safety._sockets(set()))  # the runner's own (xdist, gRPC), as a template's are
    assert fork_safety.fork_refusal(baseline, sockets, settle=0) is None


def test_a_python_thread_left_running_is_named() -> None:
    baseline = fork_safety.task_ids()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="left-running")
    thread.start()
    try:
        refusal = fork_safety.fork_refusal(baseline, set(), settle=0)
    finally:
        stop.set()
        thread.join()
    assert refusal is not None and f"left-running (tid {thread.native_id})" in refusal
    assert refusal.startswith("initialize left 1 thread(s) running")


def test_a_thread_that_is_ending_is_waited_for() -> None:
    baseline = fork_safety.task_ids()
    thread = threading.Thread(target=threading.Event().wait, args=(0.2,), name="ending")
    thread.start()
    assert fork_safety.fork_refusal(baseline, set(), settle=30) is None  # returns once it is gone
    thread.join()


def test_a_native_thread_is_told_by_its_library() -> None:
    """A thread Python starts is started on Python's own routine, whatever its stack held before
    (the C library hands a new thread the stack of one that ended, stale words and all: here one
    that ran OpenBLAS code, a library whose threads would pass for fork-aware)."""
    worker = threading.Thread(target=lambda: np.ones((256, 256)) @ np.ones((256, 256)))
    worker.start()
    worker.join()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        owners = []
        for _ in range(200):  # until it is parked in its system call (while it starts, it may be elsewhere)
            owners.append(fork_safety.thread_owner(thread.native_id))
            if owners[-1] is not None and "python" in owners[-1]:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join()
    assert owners[-1] is not None and "python" in owners[-1], owners
    assert not any(name in (owner or "") for owner in owners for name in fork_safety.FORK_AWARE), owners


def test_numpys_blas_pool_is_told_as_openblas() -> None:
    """The BLAS pool numpy started on import: native threads the process had before this test.
    Just after a product its workers spin (running, so nothing can be told) before they park."""
    python_threads = {thread.native_id for thread in threading.enumerate()}

    def owners() -> list[str | None]:
        return [fork_safety.thread_owner(tid) for tid in fork_safety.task_ids() - python_threads]

    wait_until(lambda: any("openblas" in (owner or "") for owner in owners()), 30,
               "a native thread told as OpenBLAS's")


def test_an_open_socket_that_is_not_the_templates_own_refuses() -> None:
    baseline = fork_safety.task_ids()
    ours, theirs = socket.socketpair()
    try:
        others = set(fork_safety._sockets({ours.fileno(), theirs.fileno()}))  # the runner's own
        refusal = fork_safety.fork_refusal(baseline, others | {ours.fileno()}, settle=0)
        assert refusal is not None and f"descriptors [{theirs.fileno()}]" in refusal
        assert fork_safety.fork_refusal(baseline, others | {ours.fileno(), theirs.fileno()}, settle=0) is None
    finally:
        ours.close()
        theirs.close()
