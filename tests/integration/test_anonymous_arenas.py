"""Arenas without names (issue 19), through real backends and stubs.

- While a server serves, neither it nor its stubs has anything in /dev/shm: every shared mapping
  is an anonymous memfd, and no process keeps a descriptor of one (so /proc/<pid>/fd shows none).
- SIGKILL of the backend with requests in flight leaves nothing anywhere: its stubs die with it
  (parent-death signal, even while a model's `execute` runs) and no process on the machine maps
  or holds any of its segments; no new start is needed to clean up.
- A stub whose backend closes the channel (without dying) exits by itself: the second path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from harness import Backend, make_repository

from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.ipc.exit_codes import StubExitCode

MIB = 1 << 20


def stub_pids(backend_pid: int) -> list[int]:
    return [child.pid for child in psutil.Process(backend_pid).children()]


def shared_mappings(pid: int) -> list[str]:
    """The paths of `pid`'s shared mappings (mode 's') that are files or memfds."""
    found = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[1].endswith("s"):
                found.append(fields[5].strip())
    return found


def memfd_descriptors(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:"):
            found.append(target)
    return found


def holders_anywhere(label: str) -> list[str]:
    """Every process on the machine that maps, or holds a descriptor of, a memfd labelled `label`."""
    holders = []
    for process in psutil.process_iter():
        pid = process.pid
        try:
            if any(label in path for path in shared_mappings(pid)) or any(label in t for t in memfd_descriptors(pid)):
                holders.append(f"{pid} {' '.join(process.cmdline())[:120]}")
        except (OSError, psutil.Error):
            continue
    return holders


def identity(url: str, nbytes: int, seed: int = 0) -> None:
    data = ((np.arange(nbytes // 4, dtype=np.float32) + seed) % 1000).reshape(1, -1)
    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)


def slow(url: str, delay_ms: int) -> None:
    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
        tensor.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
        client.infer("slow", [tensor])


@pytest.fixture()
def repository(tmp_path: Path) -> Iterator[Path]:
    repository = make_repository(tmp_path, "identity_fp32", "slow")
    config = repository / "identity_fp32" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    yield repository


def test_nothing_in_dev_shm_and_no_descriptor_kept_while_serving(repository: Path) -> None:
    with Backend(repository, f"--http-max-input-size={256 * MIB}") as backend:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # both instances, arenas that grow
            list(pool.map(lambda n: identity(backend.http_url, n, n), [16, 4096, MIB, 8 * MIB, 40 * MIB] * 2))
        processes = [backend.pid, *stub_pids(backend.pid)]
        assert len(processes) == 4  # the backend, two identity stubs, one slow stub
        prefix = f"pystub_{backend.pid}_"
        assert [name for name in os.listdir("/dev/shm") if name.startswith(prefix)] == []
        for pid in processes:
            mappings = shared_mappings(pid)
            assert not [path for path in mappings if path.startswith("/dev/shm")], (pid, mappings)
            assert memfd_descriptors(pid) == [], f"process {pid} keeps descriptors of its segments"
        # Positive control: the arenas are there, as memfds (the backend maps both directions).
        backend_maps = shared_mappings(backend.pid)
        assert any(f"/memfd:{prefix}" in p and "_p2s" in p for p in backend_maps), backend_maps
        assert any(f"/memfd:{prefix}" in p and "_s2p" in p for p in backend_maps), backend_maps


def test_sigkill_of_the_backend_with_requests_in_flight_leaves_nothing(repository: Path) -> None:
    backend = Backend(repository, f"--http-max-input-size={256 * MIB}")
    backend.start()
    try:
        identity(backend.http_url, 8 * MIB)
        stubs = stub_pids(backend.pid)
        label = f"/memfd:pystub_{backend.pid}_"
        assert holders_anywhere(label), "positive control: the segments are found while it runs"
        pool = concurrent.futures.ThreadPoolExecutor(6)
        try:
            # In flight: slow executes (the stub's main thread is busy for 30 s, so it does not see
            # the channel close: only the parent-death signal ends it) and large identity requests.
            futures = [pool.submit(slow, backend.http_url, 30_000) for _ in range(2)]
            large = [pool.submit(identity, backend.http_url, 64 * MIB, seed) for seed in range(4)]
            time.sleep(1.0)
            killed_at = time.monotonic()
            os.kill(backend.pid, signal.SIGKILL)
            assert backend.process is not None
            backend.process.wait(10)
            deadline = killed_at + 5.0
            while time.monotonic() < deadline and any(_running(pid) for pid in stubs):
                time.sleep(0.05)
            assert not [pid for pid in stubs if _running(pid)], "stubs outlived their backend by 5 s"
            for future in futures:  # cut off mid-execute
                with pytest.raises(Exception):  # noqa: B017 - the connection dies; which error is the client's
                    future.result(timeout=60)
            concurrent.futures.wait(large, timeout=60)  # served before the kill, or cut off
        finally:
            pool.shutdown(wait=True)
        assert holders_anywhere(label) == [], "a segment of the killed backend is still held"
        prefix = f"pystub_{backend.pid}_"
        assert [name for name in os.listdir("/dev/shm") if name.startswith(prefix)] == []
    finally:
        backend.stop(check=False)  # killed: its exit status is -9


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_stub_whose_channel_closes_exits_by_itself() -> None:
    """The other path: the backend is alive but closes the stub's channel; the stub exits with
    CHANNEL_CLOSED at once, without a signal, and leaves nothing."""
    async def main() -> None:
        stub = StubProcess("eof_0", StubSettings(), "eof", feature_services(None))
        stub.spawn()
        try:
            label = f"/memfd:{stub.base}"
            assert stub.process is not None
            await asyncio.sleep(0.5)  # the stub attached its control block
            assert holders_anywhere(label)
            started = time.monotonic()
            stub.link.close()
            while stub.process.poll() is None and time.monotonic() - started < 10:
                await asyncio.sleep(0.02)
            assert stub.process.poll() == StubExitCode.CHANNEL_CLOSED, stub.death_reason()
            assert time.monotonic() - started < 5.0
        finally:
            await stub.stop(finalize_timeout=0)
        assert holders_anywhere(label) == []

    asyncio.run(main())
