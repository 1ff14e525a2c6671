"""Shared weights with real PyTorch on the CPU: a model whose `initialize` ran a forward pass on
two intra-op threads (GNU OpenMP's pool: forking after it is the classic hang) serves correctly
from every forked instance. Needs torch (the test extra installs torch==2.13.0, the CPU build)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend

torch = pytest.importorskip("torch", reason="torch is not installed: `pip install torch==2.13.0` (the CPU build) "
                                            "runs this test")

MODEL = "shared_torch"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("torch"), MODEL)
    with module_backend(Backend(repository)) as server:
        yield server


def reference(inputs: np.ndarray) -> np.ndarray:
    """The model as its initialize builds it (same seed, same layers), in this process."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
    with torch.inference_mode():
        return torch.nn.Sequential(*layers).eval()(torch.from_numpy(inputs)).numpy()


def infer(backend: Backend, inputs: np.ndarray) -> tuple[str, np.ndarray, list[int]]:
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)  # a hung child fails here
    try:
        tensor = httpclient.InferInput("INPUT0", list(inputs.shape), "FP32")
        tensor.set_data_from_numpy(inputs)
        result = client.infer(MODEL, [tensor])
        return (result.as_numpy("INSTANCE")[0].decode(), result.as_numpy("OUTPUT0"),
                result.as_numpy("THREADS").tolist())
    finally:
        client.close()


def test_a_model_that_used_intra_op_threads_serves_from_every_forked_instance(backend: Backend):
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        rows = {row["instance"]: row for row in json.loads(response.read())["stubs"]}
    (template,) = {psutil.Process(row["pid"]).ppid() for row in rows.values()}
    assert template != backend.pid, "the instances were not forked"
    assert "does not share its weights" not in backend.log()
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal((64, 512), dtype=np.float32) for _ in range(8)]
    answered = set()
    with ThreadPoolExecutor(2) as pool:
        answers = pool.map(lambda x: infer(backend, x), batches)
        for inputs, (name, outputs, threads) in zip(batches, answers, strict=True):
            np.testing.assert_allclose(outputs, reference(inputs), rtol=1e-4, atol=1e-5)
            assert threads[0] == 2  # initialize ran on two intra-op threads
            answered.add(name)
    assert answered <= set(rows)
    for name in rows:  # and each instance by itself (the pool may have sent every batch to one)
        assert rows[name]["healthy"]
