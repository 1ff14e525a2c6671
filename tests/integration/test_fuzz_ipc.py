"""Corrupt frames on the channel between a real backend and a real stub.

The test takes copies of both ends of a running stub's channel (pidfd_getfd(2), as a debugger
would) and writes frames into them without reading anything: writing into the backend's end
delivers to the stub, writing into the stub's end delivers to the backend. Each receiver must
reject what is corrupt (and log it) and the peer must stay healthy: same stub process, no restart,
every request sent meanwhile answered correctly, no unexpected exception in the log.

    test_corrupt_frames_*_under_load   frames the decoder rejects (noise, not a message array,
                                       unknown kind, wrong arity, wrong field types) while
                                       clients keep inferring
    test_well_typed_garbage_*          frames that decode (a known kind with fields of the right
                                       types and meaningless values), sent while idle: handlers
                                       must refuse them without harm. Frames that are valid
                                       commands (Finalize, AutoComplete, Init) are left out: a
                                       stub obeys those, they are not corrupt.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from fuzz_cases import ipc_frame, scaled, well_typed_frame
from harness import Backend, make_repository, module_backend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.wire import registered_kinds

_SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture
_LIBC = ctypes.CDLL(None, use_errno=True)
KINDS = tuple(sorted(registered_kinds()))
ARITIES = {kind: len(cls._fields) for kind, cls in registered_kinds().items()}
LIFECYCLE = {msg.Finalize, msg.AutoComplete, msg.Init}
SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
# Signs of harm in the backend's log. ("Traceback" alone is not one: a stub that refuses a garbage
# EXECUTE fails that batch with the traceback of why, as it does for a model's exception.)
HARM = ("Exception in callback", "Task exception was never retrieved", "is not healthy", "restarted",
        "Unhandled", "Fatal")


def grab(pid: int, fd: int) -> socket.socket:
    """A copy of file descriptor `fd` of process `pid`. Raises OSError."""
    pidfd = os.pidfd_open(pid)
    try:
        copy = _LIBC.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"pidfd_getfd({pid}, {fd}): {os.strerror(error)}")
    finally:
        os.close(pidfd)
    return socket.socket(fileno=copy)


def channel_ends(backend: Backend) -> tuple[socket.socket, socket.socket, int]:
    """(the backend's end, the stub's end, the stub's pid) of the backend's only stub."""
    (stub,) = backend.stub_processes()
    stub_fd = int(stub.cmdline()[stub.cmdline().index("--fd") + 1])
    ends = []
    for name in os.listdir(f"/proc/{backend.pid}/fd"):
        try:
            if not os.readlink(f"/proc/{backend.pid}/fd/{name}").startswith("socket:"):
                continue
            sock = grab(backend.pid, int(name))
        except OSError:
            continue
        if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_SEQPACKET:
            ends.append(sock)
        else:
            sock.close()
    assert len(ends) == 1, f"expected the one stub channel in the backend, found {len(ends)}"
    return ends[0], grab(stub.pid, stub_fd), stub.pid


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        pytest.skip(f"pidfd_open is not available: {exc}")
    with module_backend(Backend(make_repository(tmp_path_factory.mktemp("fuzz_ipc"), "identity_fp32"))) as server:
        yield server


@pytest.fixture()
def ends(backend: Backend) -> Iterator[tuple[socket.socket, socket.socket, int]]:
    to_stub, to_backend, pid = channel_ends(backend)
    for sock in (to_stub, to_backend):
        sock.settimeout(10.0)  # a receiver that stops reading fails the test instead of hanging it
    yield to_stub, to_backend, pid
    to_stub.close()
    to_backend.close()


def _rejected(frame: bytes) -> bool:
    try:
        msg.decode(frame)
    except msg.MessageDecodeError:
        return True
    return False


def _frames(strategy: st.SearchStrategy[bytes], count: int, accept: Callable[[bytes], bool] = lambda f: True
            ) -> list[bytes]:
    """Up to `count` frames from `strategy` that `accept` keeps."""
    found: list[bytes] = []

    @settings(max_examples=round(count * 1.3), **SETTINGS)
    @given(frame=strategy)
    def collect(frame: bytes) -> None:
        if len(found) < count and accept(frame):
            found.append(frame)

    collect()
    return found


class Load:
    """Clients inferring on identity_fp32 from threads until stopped; every answer is checked."""

    def __init__(self, backend: Backend, threads: int = 2) -> None:
        self.backend = backend
        self.results: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(threads)]

    def _run(self, seed: int) -> None:
        client = grpcclient.InferenceServerClient(self.backend.grpc_url)
        try:
            count = 0
            while not self._stop.is_set():
                data = np.full((1, 16), seed * 1000 + count, np.float32)
                tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
                tensor.set_data_from_numpy(data)
                try:
                    out = client.infer("identity_fp32", [tensor], client_timeout=20).as_numpy("OUTPUT0")
                    self.results.append("ok" if np.array_equal(out, data) else "wrong answer")
                except Exception as exc:  # noqa: BLE001 - recorded, the test reports it
                    self.results.append(f"{type(exc).__name__}: {exc}")
                count += 1
        finally:
            client.close()

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.3)
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def _stub_row(backend: Backend) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        (row,) = json.loads(response.read())["stubs"]
    return row


def _check_healthy(backend: Backend, stub_pid: int, log_from: int, marks: tuple[str, ...] = HARM + ("Traceback",)
                   ) -> None:
    row = _stub_row(backend)
    assert row["pid"] == stub_pid and row["healthy"] and row["restarts"] == 0, row
    assert psutil.pid_exists(stub_pid) and backend.process is not None and backend.process.poll() is None
    with Load(backend, threads=1) as load:
        time.sleep(0.5)
    assert load.results and set(load.results) == {"ok"}, load.results[:5]
    log = backend.log()[log_from:]
    unexpected = [line for line in log.splitlines() if any(mark in line for mark in marks)]
    assert not unexpected, "\n".join(unexpected[:20])


def _wait_for_count(backend: Backend, pattern: str, at_least: int, log_from: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        count = len(re.findall(pattern, backend.log()[log_from:]))
        if count >= at_least or time.monotonic() > deadline:
            return count
        time.sleep(0.1)


def _send_all(sock: socket.socket, frames: list[bytes]) -> None:
    for frame in frames:
        sock.send(frame)


# What the receiver logs for each corrupt frame it drops.
_DROPPED = {"stub": r"stub 'identity_fp32_0_0' dropped a corrupt frame",
            "backend": r"dropped a corrupt frame from stub 'identity_fp32_0_0'"}


@pytest.mark.parametrize("receiver", ["stub", "backend"])
def test_corrupt_frames_under_load(backend: Backend, ends: tuple[socket.socket, socket.socket, int], receiver: str):
    to_stub, to_backend, stub_pid = ends
    frames = _frames(ipc_frame(KINDS, ARITIES), scaled(300), _rejected)
    log_from = len(backend.log())
    with Load(backend) as load:
        _send_all(to_stub if receiver == "stub" else to_backend, frames)
    assert load.results and set(load.results) == {"ok"}, [r for r in load.results if r != "ok"][:5]
    dropped = _wait_for_count(backend, _DROPPED[receiver], len(frames), log_from)
    assert dropped == len(frames), (dropped, len(frames))
    _check_healthy(backend, stub_pid, log_from)
    print(f"\n{len(frames)} corrupt frames into the {receiver}, {len(load.results)} requests meanwhile, all answered")


@pytest.mark.parametrize("receiver", ["stub", "backend"])
def test_well_typed_garbage_is_refused_without_harm(backend: Backend, ends: tuple[socket.socket, socket.socket, int],
                                                    receiver: str):
    to_stub, to_backend, stub_pid = ends
    classes = tuple(cls for cls in registered_kinds().values() if receiver == "backend" or cls not in LIFECYCLE)
    frames = _frames(well_typed_frame(classes), scaled(200))
    assert all(not _rejected(frame) for frame in frames)
    kinds = sorted({type(msg.decode(frame)).__name__ for frame in frames})
    log_from = len(backend.log())
    _send_all(to_stub if receiver == "stub" else to_backend, frames)
    time.sleep(1.0)  # let the receiver work through them
    _check_healthy(backend, stub_pid, log_from, HARM)
    print(f"\n{len(frames)} well-typed garbage frames into the {receiver} ({', '.join(kinds)}): refused, "
          f"stub and backend healthy")
