"""The compiled hot path and its pure-Python fallback, end to end (docs/compiled.md).

The rest of the suite runs the package as built: pure Python by default, compiled after an opt-in
build (PYSTUB_BUILD_COMPILED=1 ./dev.sh test builds it first, or says loudly that it could not and
sets PYSTUB_PURE_PYTHON=1). Here one backend runs with PYSTUB_PURE_PYTHON=1 and serves what a
request crosses: HTTP and gRPC unary calls, a stub, BLS and a decoupled model's stream. Each
backend says its mode at `GET /v2/pystub/build` and in its log, and the `module_files` model shows
which of pystub's modules its stub imported from an extension.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import queue
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import ROOT, Backend, make_repository, module_backend

sys.path.insert(0, str(ROOT / "tools"))
from build_compiled import MANIFEST, build_due, compiler_version  # noqa: E402

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
MODELS = ("identity_fp32", "bls_driver", "bls_leaf", "repeat", "module_files")
SUITE_PURE = os.environ.get("PYSTUB_PURE_PYTHON", "") not in ("", "0")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("modes"), *MODELS)


@pytest.fixture(scope="module")
def pure(repository: Path) -> Iterator[Backend]:
    with module_backend(Backend(repository, env={"PYSTUB_PURE_PYTHON": "1"})) as backend:
        yield backend


def build_state(backend: Backend) -> dict:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/build", timeout=30) as response:
        return json.loads(response.read())


def stub_module_files(backend: Backend) -> dict[str, str | None]:
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        return json.loads(client.infer("module_files", [tensor]).as_numpy("INFO")[0])
    finally:
        client.close()


def test_pure_backend_says_so_and_its_stub_imports_no_extension(pure: Backend):
    state = build_state(pure)
    assert state["mode"] == "pure" and state["compiled_modules"] == []
    assert state["reason"] == "PYSTUB_PURE_PYTHON=1"
    assert "hot path: pure (PYSTUB_PURE_PYTHON=1)" in pure.log()
    files = stub_module_files(pure)
    assert "pystub_backend.stub.stub" in files
    assert not [name for name, file in files.items() if file and file.endswith(SUFFIX)]


def test_pure_backend_serves_http_and_grpc(pure: Backend):
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    http = httpclient.InferenceServerClient(pure.http_url, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(pure.grpc_url)
    try:
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            tensor = module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        http.close()
        grpc.close()


def test_pure_backend_runs_bls(pure: Backend):
    client = httpclient.InferenceServerClient(pure.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        result = client.infer("bls_driver", [tensor], parameters={"chain": "bls_leaf"})
    finally:
        client.close()
    assert json.loads(result.as_numpy("INFO")[0]) == {"path": ["bls_driver", "bls_leaf"]}
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.arange(4, dtype=np.float32) + 2)  # a hop each


def test_pure_backend_streams_a_decoupled_models_responses(pure: Backend):
    received: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(pure.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: received.put((result, error)))
        inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_MS", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([5], np.int32))
        inputs[1].set_data_from_numpy(np.array([0], np.int32))
        client.async_stream_infer("repeat", inputs)
        values = []
        for _ in range(5):
            result, error = received.get(timeout=60)
            assert error is None, error
            values.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
        client.close()
    assert values == [0, 1, 2, 3, 4]


def built_modules() -> list[str] | None:
    """The modules the compiled tree was built from (None: nothing built, the default)."""
    try:
        return sorted(json.loads(MANIFEST.read_text())["modules"])
    except FileNotFoundError:
        return None


@pytest.mark.skipif(SUITE_PURE or built_modules() is not None,
                    reason="PYSTUB_PURE_PYTHON is set, or a compiled tree was built")
def test_without_a_build_the_default_backend_runs_pure(repository: Path):
    """Off by default: with nothing built, the backend says so and its stub imports no extension."""
    with Backend(repository) as backend:
        state = build_state(backend)
        assert (state["mode"], state["compiled_modules"]) == ("pure", []), state
        assert "no compiled modules were built" in state["reason"], state
        files = stub_module_files(backend)
    assert [name for name, file in files.items() if file and file.endswith(SUFFIX)] == []


@pytest.mark.skipif(SUITE_PURE or built_modules() is None,
                    reason="nothing compiled (the default; PYSTUB_BUILD_COMPILED=1 ./dev.sh test builds it), "
                           "or PYSTUB_PURE_PYTHON is set")
def test_the_suite_runs_the_current_compiled_build(repository: Path):
    """After an opt-in build, the default backend and its stub run every module of that build compiled,
    from a build of these sources."""
    built = built_modules()
    assert built is not None
    compiler = compiler_version()
    assert compiler is not None, "Cython is not installed: pip install -e '.[compiled]'"
    due = build_due(compiler, tuple(built))
    assert due is None, f"the compiled modules are not current ({due}): run tools/build_compiled.py"
    with Backend(repository) as backend:
        state = build_state(backend)
        assert state["mode"] == "compiled" and state["stale_modules"] == [], state
        assert sorted(state["compiled_modules"]) == built
        assert "hot path: compiled (every compiled module is current" in backend.log()
        files = stub_module_files(backend)
    for name in ("pystub_backend.stub.pb_utils._tensor", "pystub_backend.ipc.wire"):
        assert files[name].endswith(SUFFIX) and "_native" in Path(files[name]).parts, (name, files[name])
    uncompiled = [name for name, file in files.items() if name in built and not file.endswith(SUFFIX)]
    assert uncompiled == []
