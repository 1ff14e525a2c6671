"""What a model sees of its stub process, as on Triton: its own imports, `sys.argv == ['']`, an
instance that survives `sys.exit()` in `execute`, BF16 tensors, bytes for string arguments, and
`await async_exec(decoupled=True)` that yields to the event loop. Real backend, real stubs."""

from __future__ import annotations

import json
import queue
import shlex
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

# Top-level modules a stub may hold besides the standard library and site-packages: pystub's one
# package, Triton's two utility modules, the model itself, and Cython's runtime (msgpack is compiled).
_OURS = {"pystub_backend", "triton_python_backend_utils", "c_python_backend_utils", "__main__", "model", "1",
         "cython_runtime"}
_HELPERS = ("backend", "ipc", "pystub", "stub", "utils")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    directory = tmp_path_factory.mktemp("model_env")
    repository = make_repository(directory, "env_probe", "exit_async", "bf16_probe", "bls_leaf", "delayed_stream",
                                 "async_stream_driver")
    # The server runs in a directory holding modules named like the model's helpers: the model
    # must still get its own (`python -m` would put this directory first on sys.path).
    working = directory / "cwd"
    working.mkdir()
    for name in _HELPERS:
        (working / f"{name}.py").write_text('MARKER = "the working directory"\n')
    wrapper = ("sh", "-c", f'cd {shlex.quote(str(working))} && exec "$@"', "sh")
    with module_backend(Backend(repository, wrapper=wrapper)) as server:
        yield server


def infer(backend: Backend, model: str, params: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    """(stub pid, INFO) of one request; raises InferenceServerException for an error response."""
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        result = client.infer(model, [tensor], parameters=params or {})
        info = result.as_numpy("INFO")
        return float(result.as_numpy("OUT")[0]), json.loads(info[0]) if info is not None else {}
    finally:
        client.close()


def test_a_model_imports_its_own_helpers_and_nothing_generic_of_pystub(backend: Backend) -> None:
    _, info = infer(backend, "env_probe", {"mode": "env"})
    assert info["helpers"] == {name: f"env_probe/{name}" for name in _HELPERS}
    assert not any(info["found"].values()), info["found"]
    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    foreign = {name: path for name, path in info["modules"].items()
               if name not in stdlib and name not in _OURS and name not in _HELPERS and not name.startswith("_")
               and not (path and ("site-packages" in path or "dist-packages" in path))}
    assert foreign == {}, foreign
    for name in _HELPERS:
        assert info["modules"][name].endswith(f"env_probe/1/{name}.py")


def test_a_model_sees_an_empty_argv(backend: Backend) -> None:
    _, info = infer(backend, "env_probe", {"mode": "env"})
    assert info["argv_at_import"] == [""] and info["argv"] == [""]


@pytest.mark.parametrize("model", ["env_probe", "exit_async"])
def test_sys_exit_in_execute_fails_only_that_call(backend: Backend, model: str) -> None:
    params: dict[str, Any] = {"mode": "env"} if model == "env_probe" else {}
    pid, _ = infer(backend, model, params)
    with pytest.raises(InferenceServerException, match=f"Failed to process the request\\(s\\) for model "
                                                         f"'{model}_0', message: SystemExit: "):
        infer(backend, model, {"mode": "exit"} if model == "env_probe" else {"exit": True})
    for _ in range(3):
        assert infer(backend, model, params)[0] == pid  # the same stub answers: it did not exit


def test_bf16_input_keeps_its_dtype_refuses_numpy_and_round_trips_through_dlpack(backend: Backend) -> None:
    import ml_dtypes

    values = np.array([1.0, -2.5, 0.15625, 3.0e38], np.float32).astype(ml_dtypes.bfloat16)
    client = httpclient.InferenceServerClient(backend.http_url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("IN", list(values.shape), "BF16")
        tensor.set_data_from_numpy(values, binary_data=True)
        result = client.infer("bf16_probe", [tensor], outputs=[httpclient.InferRequestedOutput("OUT"),
                                                              httpclient.InferRequestedOutput("INFO")])
    finally:
        client.close()
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["dtype"] == 14 and info["dlpack_dtype"] == 14  # TRITONSERVER_TYPE_BF16
    assert info["as_numpy"] == ("Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                                "from_dlpack() instead.")
    assert result.get_output("OUT")["datatype"] == "BF16"
    output = result.as_numpy("OUT")
    assert output.dtype == ml_dtypes.bfloat16 and output.tobytes() == values.tobytes()


def test_string_arguments_accept_bytes(backend: Backend) -> None:
    _, info = infer(backend, "env_probe", {"mode": "bytes"})
    assert info == {"out": [2.0], "ready": True, "error_message": "bytes message", "request_id": "r1",
                    "requested": ["OUT"]}
    assert "env_probe: a bytes log message" in backend.log()


def test_await_async_exec_decoupled_yields_until_the_first_response(backend: Backend) -> None:
    """Four concurrent decoupled executes each await a BLS call whose first response comes after
    4 s: they overlap, so all four answer in about 4 s, not 16."""
    count, seconds = 4, 4.0
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        started = time.monotonic()
        for index in range(count):
            tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
            tensor.set_data_from_numpy(np.array([seconds], np.float32))
            client.async_stream_infer("async_stream_driver", [tensor], request_id=str(index))
        results = [answers.get(timeout=30) for _ in range(count)]
        elapsed = time.monotonic() - started
    finally:
        client.stop_stream()
        client.close()
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    for result in results:
        waited, *values = result.as_numpy("OUT").tolist()
        assert values == [seconds] and waited >= seconds - 0.5
    assert seconds - 0.5 <= elapsed < 7.0, f"{count} concurrent async_exec(decoupled=True) took {elapsed:.1f} s"


def test_a_model_can_spawn_processes_that_import_its_helpers(backend: Backend) -> None:
    """multiprocessing's "spawn" children start from the stub's own sys.path and __main__."""
    _, info = infer(backend, "env_probe", {"mode": "spawn"})
    assert info == {"spawned": 21}
