"""The arenas at their limits, through a real backend.

- Exhaustion: the backend runs in a private mount namespace whose /dev/shm is a 48 MiB tmpfs, which
  no longer limits anything (arenas are anonymous memfds): 30 and 40 MiB requests are served over
  HTTP and gRPC and /dev/shm stays empty. The stub's memory is limited (STUB_MEMORY_LIMIT_BYTES):
  a request whose outputs cannot get shared memory there fails alone, with Triton's text (HTTP
  500, gRPC INTERNAL); smaller requests keep being served and nothing of it is left.
- Growth: a request larger than the default segment succeeds; the arena grows by a segment that
  is a multiple of `shm-growth-byte-size`.
- Fragmentation: a long concurrent mixed-size workload leaves `arena_used_bytes` at its baseline
  and the arena serves its largest request again without growing.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

MIB = 1 << 20
POOL_TEXT = "Failed to increase the shared memory pool size"
TMPFS_SIZE = 48 * MIB
GROWTH = 2 * MIB
# The stub's address space: its own ~400 MiB plus room to map a 500 MiB input, not also a 500 MiB output.
STUB_LIMIT = 'parameters { key: "STUB_MEMORY_LIMIT_BYTES", value: { string_value: "1200000000" } }\n'
BIG = 500 * MIB

# A private /dev/shm of TMPFS_SIZE bytes; the backend is exec'ed so its pid is the Popen's.
TMPFS_WRAPPER = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f'mount -t tmpfs -o size={TMPFS_SIZE},mode=1777 tmpfs /dev/shm && exec "$@"', "sh"]


def _namespaces_unavailable() -> str | None:
    """Why a private tmpfs /dev/shm cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    probe = subprocess.run(TMPFS_WRAPPER + ["true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return (f"cannot mount a private tmpfs on /dev/shm (needs CAP_SYS_ADMIN for unshare --mount "
                f"and mount): {probe.stderr.strip()}")
    return None


# -- helpers -----------------------------------------------------------------------------------
def infer(backend: Backend, data: np.ndarray, model: str = "identity_fp32") -> tuple[int, Any]:
    """One binary HTTP request; (200, output array) or (status, error text)."""
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, data.size],
                    "parameters": {"binary_data_size": data.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    request = urllib.request.Request(
        f"http://{backend.http_url}/v2/models/{model}/infer", data=header + data.tobytes(), method="POST",
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            length = int(response.headers["Inference-Header-Content-Length"])
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]
    return 200, np.frombuffer(body[length:], dtype=np.float32)


def stubs(backend: Backend) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return json.loads(response.read())["stubs"]


def floats(nbytes: int, seed: int = 0) -> np.ndarray:
    return (np.arange(nbytes // 4, dtype=np.float32) + seed) % 1000


def assert_identity(backend: Backend, nbytes: int, seed: int = 0) -> None:
    data = floats(nbytes, seed)
    status, output = infer(backend, data)
    assert status == 200, f"a {nbytes}-byte request failed: {status} {output}"
    np.testing.assert_array_equal(output, data)


def wait_for_baseline(backend: Backend, field: str = "arena_used_bytes", timeout: float = 5.0) -> list[dict]:
    """The stub rows once every stub's `field` is back to 0 (releases are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = stubs(backend)
        if all(row[field] == 0 and row["in_flight"] == 0 for row in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def shm_of(backend: Backend) -> list[str]:
    """The /dev/shm entries the backend sees in its own mount namespace."""
    return sorted(os.listdir(f"/proc/{backend.pid}/root/dev/shm"))


# -- exhaustion --------------------------------------------------------------------------------
@pytest.fixture()
def tmpfs_backend(tmp_path: Path) -> Iterator[Backend]:
    reason = _namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    repository = make_repository(tmp_path, "identity_fp32")
    config = repository / "identity_fp32" / "config.pbtxt"
    config.write_text(config.read_text() + STUB_LIMIT)
    backend = Backend(repository, f"--http-max-input-size={1024 * MIB}", wrapper=TMPFS_WRAPPER)
    with backend:
        yield backend


@pytest.mark.timeout(400)  # 500 MiB requests over HTTP and gRPC: minutes on a loaded 2-core machine
def test_dev_shm_size_is_no_limit_and_exhaustion_fails_only_that_request(tmpfs_backend: Backend) -> None:
    backend = tmpfs_backend
    assert_identity(backend, 4096)  # creates both arenas' first segments (1 MiB each)

    # 30 and 40 MiB in a 48 MiB /dev/shm: both arenas grow past its size; nothing is in it.
    assert_identity(backend, 30 * MIB)
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        data = floats(40 * MIB).reshape(1, -1)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        assert shm_of(backend) == []

        # 500 MiB: the stub maps the input but cannot map a 500 MiB output segment within its
        # limit. That request fails alone; small requests sent at the same time are served.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            big = pool.submit(infer, backend, floats(BIG))
            small = [pool.submit(assert_identity, backend, 4096, seed) for seed in range(20)]
            status, text = big.result()
            for future in small:
                future.result()
        assert status == 500 and text.startswith(POOL_TEXT), (status, text)
        tensor = grpcclient.InferInput("INPUT0", [1, BIG // 4], "FP32")
        tensor.set_data_from_numpy(floats(BIG).reshape(1, -1))
        with pytest.raises(InferenceServerException) as error:
            client.infer("identity_fp32", [tensor])
        assert error.value.status() == "StatusCode.INTERNAL"
        assert error.value.message().startswith(POOL_TEXT), error.value.message()
    finally:
        client.close()

    # Smaller requests are still served, including ones that need the s2p arena to grow a little.
    for nbytes in (16, 4096, MIB, 3 * MIB, 8 * MIB):
        assert_identity(backend, nbytes, seed=nbytes)
    rows = wait_for_baseline(backend)
    assert [row["healthy"] for row in rows] == [True]
    assert rows[0]["arena_used_bytes"] == 0, f"p2s inputs were not freed: {rows[0]['arena_used_bytes']} bytes"
    assert shm_of(backend) == []


# -- growth and fragmentation ------------------------------------------------------------------
@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("arena_limits"), "identity_fp32")
    config = repository / "identity_fp32" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    with module_backend(Backend(repository, f"--backend-config=python,shm-growth-byte-size={GROWTH}")) as server:
        yield server


def test_a_request_larger_than_the_default_segment_grows_the_arena(backend: Backend) -> None:
    before = sum(row["arena_total_bytes"] for row in stubs(backend))
    nbytes = before + 5 * MIB + 1000  # larger than any segment there can be yet
    assert_identity(backend, nbytes, seed=3)
    rows = wait_for_baseline(backend)
    grown = sum(row["arena_total_bytes"] for row in rows) - before
    # The one new segment (plus the 1 MiB default segment if this stub had none) is the smallest
    # multiple of the growth step that holds the request.
    expected = -(-nbytes // GROWTH) * GROWTH
    assert grown in (expected, expected + MIB), (grown, expected)
    assert all(row["arena_used_bytes"] == 0 for row in rows), \
        f"p2s inputs were not freed: {[row['arena_used_bytes'] for row in rows]} bytes"


def test_mixed_workload_leaves_the_arenas_at_baseline(backend: Backend) -> None:
    rng = random.Random(7)
    sizes = [rng.choice((4, 64, 4096, 60_000, 300_000, MIB, 3 * MIB + 4)) for _ in range(400)]

    def one(index: int) -> None:
        assert_identity(backend, sizes[index], seed=index)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(sizes))))
    rows = wait_for_baseline(backend)
    assert all(row["arena_used_bytes"] == 0 for row in rows), \
        f"p2s inputs were not freed: {[row['arena_used_bytes'] for row in rows]} bytes"
    assert all(row["served"] > 0 for row in rows), "both instances should have taken part"
    # Unfragmented: with everything freed, the largest request fits again without growing.
    totals = [row["arena_total_bytes"] for row in rows]
    for index in range(8):
        assert_identity(backend, max(sizes), seed=index)
    rows = wait_for_baseline(backend)
    assert [row["arena_total_bytes"] for row in rows] == totals
    assert all(row["arena_used_bytes"] == 0 for row in rows)
