"""Arenas without names where it matters: a container-sized /dev/shm, and models that
try to read other instances' memory.

Both run the image's entrypoint in the container sandbox (container_sandbox: a private mount
namespace with a 64 MiB tmpfs on /dev/shm, uid 1000 with no capabilities).

- 256 MiB tensors round-trip through a model over HTTP and over gRPC; /dev/shm stays empty.
- A hostile model (tests/models/arena_prober, two instances) next to another model's instances
  finds nothing it may open: no object in /dev/shm, and none of /proc/<pid>/{mem,fd,map_files}
  of the backend or of any other stub. The same probe from this (root) test process does open the
  backend's /proc/<pid>/mem: what stops the model is the isolation, not a broken probe.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from container_sandbox import SHM_BYTES, UID, ContainerBackend, sandboxed_repository, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

MIB = 1 << 20
BIG = 256 * MIB


@pytest.fixture()
def sandbox() -> Iterator[tuple[Path, list[str]]]:
    with sandboxed_repository("pystub-memfd-", "identity_fp32", "arena_prober") as sandbox:
        yield sandbox


def _dev_shm(backend: ContainerBackend) -> list[str]:
    return sorted(os.listdir(f"/proc/{backend.pid}/root/dev/shm"))


@pytest.mark.timeout(400)  # 256 MiB both ways, twice: minutes on a loaded 2-core machine
def test_256_mib_tensors_over_http_and_grpc_in_a_64_mib_dev_shm(sandbox: tuple[Path, list[str]]) -> None:
    repository, wrapper = sandbox
    with ContainerBackend(repository, wrapper, f"--http-max-input-size={2 * BIG}") as backend:
        shm = os.statvfs(f"/proc/{backend.pid}/root/dev/shm")
        assert shm.f_blocks * shm.f_frsize == SHM_BYTES
        data = np.random.default_rng(19).random((1, BIG // 4), dtype=np.float32)
        with httpclient.InferenceServerClient(backend.http_url, network_timeout=300) as client:
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        client = grpcclient.InferenceServerClient(backend.grpc_url)
        try:
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("identity_fp32", [tensor], client_timeout=300)
                                          .as_numpy("OUTPUT0"), data)
        finally:
            client.close()
        assert _dev_shm(backend) == []


def test_a_model_cannot_open_other_instances_memory(sandbox: tuple[Path, list[str]]) -> None:
    repository, wrapper = sandbox
    with ContainerBackend(repository, wrapper) as backend:
        processes = [psutil.Process(backend.pid), *backend.stub_processes()]
        assert {p.uids().effective for p in processes} == {UID}
        data = np.arange(MIB // 4, dtype=np.float32).reshape(1, -1)
        with httpclient.InferenceServerClient(backend.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            client.infer("identity_fp32", [tensor])  # the other model's arenas exist
            reports = []
            for _ in range(4):  # requests reach both prober instances
                # 4 KiB: past what travels inline in the frame, so the prober's arena holds it
                tensor = httpclient.InferInput("INPUT0", [1024], "FP32")
                tensor.set_data_from_numpy(np.zeros(1024, dtype=np.float32))
                reports.append(json.loads(client.infer("arena_prober", [tensor]).as_numpy("REPORT")[0]))
        for report in reports:
            assert report["dev_shm"] == [] and report["opened_shm"] == [], report
            assert report["opened_proc"] == [], report
            assert report["other_stubs"] >= 2, report  # the other prober and the identity stub
            assert report["own_memfd_mappings"] >= 2, report  # control: it sees its own arenas
            assert report["own_memfd_fds"] == 0, report
        # Control: with CAP_SYS_PTRACE (this root test process) the same path opens.
        fd = os.open(f"/proc/{backend.pid}/mem", os.O_RDONLY)
        os.close(fd)
