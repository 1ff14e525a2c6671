"""Tensor-sized buffers are reused from the heap, not faulted in again per request (ipc/heap.py).

A 1 MiB request used to cost the backend 86-570 minor page faults (fresh mappings for the body,
the message and the response, each zeroed by the kernel): about 40 % of its CPU per request. The
count of the backend's minor faults per request is what the change moves, and it does not depend
on the machine's load. A backend whose operator set glibc's threshold (MALLOC_MMAP_THRESHOLD_)
keeps that setting, and the faults come back: the control that shows the count tells them apart.

Each case gets a backend of its own: a connection that carried 4 MiB or more gives the freed heap
back when it closes (frontends/heap_trim.py), and one closed by an earlier case would trim the heap
under the next case's count.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository

MIB = 1 << 20
WARM_UP = 5
REQUESTS = 30
FEW_FAULTS = 64  # per request: a quarter of one 1 MiB buffer's 256 pages (about 1 measured; 500+ without)
MANY_FAULTS = 256  # per request: at least one 1 MiB buffer faulted in afresh


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("heap"), "identity_fp32")


def _minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt: the 10th field, the 8th after the command's ")"


def _faults_per_request(backend: Backend, protocol: str) -> float:
    data = np.arange(MIB // 4, dtype=np.float32).reshape(1, -1)
    if protocol == "http":
        client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient = (
            httpclient.InferenceServerClient(backend.http_url))
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    else:
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
    try:
        def infer() -> None:
            result = client.infer("identity_fp32", [tensor], outputs=outputs)
            assert np.array_equal(result.as_numpy("OUTPUT0"), data)

        for _ in range(WARM_UP):
            infer()
        before = _minor_faults(backend.pid)
        for _ in range(REQUESTS):
            infer()
        return (_minor_faults(backend.pid) - before) / REQUESTS
    finally:
        client.close()


@pytest.fixture
def tuned(repository: Path) -> Iterator[Backend]:
    with Backend(repository) as backend:
        yield backend


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_mib_requests_reuse_the_backends_heap(tuned: Backend, protocol: str) -> None:
    faults = _faults_per_request(tuned, protocol)
    assert faults < FEW_FAULTS, f"{faults:.0f} page faults per 1 MiB {protocol} request"


def test_an_operators_malloc_setting_wins(repository: Path) -> None:
    # 128 KiB is glibc's starting threshold; set explicitly, it stays there: every 1 MiB buffer
    # is a fresh mapping again.
    with Backend(repository, env={"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}) as backend:
        faults = _faults_per_request(backend, "http")
    assert faults > MANY_FAULTS, f"only {faults:.0f} page faults per request: the operator's setting lost"
