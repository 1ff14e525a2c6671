"""GPU tensors between models by CUDA IPC, with real stubs on the fake machine (PYSTUB_FAKE_GPUS=2).

The producer returns its output in fake device memory (pystub_backend.devices.fake_engine: memfds
whose IPC handles cross processes, and work that lands only when its process waits); a consumer
that asks for its BLS outputs on that GPU maps the producer's stub's synchronized copy of it, and
returns the mapped tensor to the HTTP client (its stub copies it to the host, reading through the
mapping). So an output written by a kernel the producer never waited for, memory CUDA cannot
export (a pool's, one the producer itself mapped), an empty output, and an export opened by the
stub that made it (an async decoupled model calling itself) all reach the caller right. The
export registry in the backend and both stubs' counts are read with `bls.inspect()` from inside
the models: they empty after normal use, after the consumer is killed while it maps an export,
and after the producer is killed while mapped.

GPU inputs go the other way: a caller's fake-GPU input to `unforced` (FORCE_CPU_ONLY_INPUT_TENSORS
"no", on that GPU) is mapped by the callee (a copy the caller exported, a mapped tensor given on
too), with the same bookkeeping and deaths; every other target (the default, another GPU, a
response cache, an ensemble, a dynamic batcher) gets the caller's host copy.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bls_calls import drive
from harness import Backend, module_backend

from pystub_backend.devices import FAKE_VARIABLE

_MODEL = '''
import gc, json, os
import numpy as np
import triton_python_backend_utils as pb_utils
from pystub_backend.devices import fake_cuda_capsule, fake_device_array
from pystub_backend.devices import fake_write_later
from pystub_backend.devices.fake_engine import freed_while_mapped
from pystub_backend.stub.features import bls


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])
        self.kept = None

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        params = json.loads(request.parameters())
        given = pb_utils.get_input_tensor_by_name(request, "IN")
        info = {"pid": os.getpid(), "input_is_cpu": given.is_cpu()}
        if not given.is_cpu():  # a caller's GPU input, mapped: answered as it came (read through the mapping)
            if params.get("keep_input"):
                self.kept = given
            info.update(during=bls.inspect(), device=given.__dlpack_device__()[1])
            return pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", given.to_dlpack()),
                                               _info(info)])
        data = given.as_numpy()
        out = pb_utils.Tensor("OUT", data)
        mode = params.get("mode", "produce")
        if mode == "produce":
            doubled = fake_device_array(data * 2, self.device, exportable=not params.get("pooled"))
            if params.get("late"):  # written by a kernel after a long one, never waited for
                doubled = fake_device_array(np.zeros_like(data), self.device)
                fake_write_later(doubled, data * 2, self.device)
            out = pb_utils.Tensor.from_dlpack("OUT", fake_cuda_capsule(doubled, self.device))
        elif mode == "call":
            kwargs = {}
            if "device" in params:
                kwargs["preferred_memory"] = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU,
                                                                      params["device"])
            sent = data.reshape(1, -1) if params.get("batched") else data  # a batch of one for a batcher
            given = pb_utils.Tensor("IN", sent)
            if params.get("gpu_input"):  # the input on this instance's GPU
                given = pb_utils.Tensor.from_dlpack(
                    "IN", fake_cuda_capsule(fake_device_array(sent, self.device), self.device))
            callee_params = json.loads(params["callee"]) if "callee" in params else (
                {"keep_input": True} if params.get("callee_keep") else {})
            answer = pb_utils.InferenceRequest(model_name=params.get("target", "producer"), inputs=[given],
                                               parameters=callee_params,
                                               requested_output_names=["OUT", "INFO"], **kwargs).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            got = pb_utils.get_output_tensor_by_name(answer, "OUT")
            callee = json.loads(pb_utils.get_output_tensor_by_name(answer, "INFO").as_numpy()[0])
            info.update(is_cpu=got.is_cpu(), device=got.__dlpack_device__()[1], during=bls.inspect(),
                        callee=callee)
            out = got  # a GPU tensor: its stub copies it to the host, through the mapping
            if params.get("batched"):
                out = pb_utils.Tensor("OUT", got.as_numpy().reshape(-1))
            if params.get("pass_on"):  # the mapped answer as the input of a second call
                again = pb_utils.InferenceRequest(
                    model_name=params["target"], inputs=[pb_utils.Tensor.from_dlpack("IN", got.to_dlpack())],
                    requested_output_names=["OUT", "INFO"]).exec()
                out = pb_utils.get_output_tensor_by_name(again, "OUT")
                info["callee"] = json.loads(pb_utils.get_output_tensor_by_name(again, "INFO").as_numpy()[0])
            if params.get("keep"):
                self.kept = got
        elif mode == "drop":
            self.kept = None
            gc.collect()
        elif mode == "inspect":
            gc.collect()
            info.update(bls.inspect(), freed_while_mapped=freed_while_mapped())
        return pb_utils.InferenceResponse([out, _info(info)])


def _info(info):
    return pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_))
'''


# A decoupled async model on GPU 0 that answers "inner" requests with a GPU tensor and, otherwise,
# calls itself for one with the answer on GPU 0: its stub maps its own export.
_SELF_CALLER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from pystub_backend.devices import fake_cuda_capsule, fake_device_array


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if json.loads(request.parameters() or "{}").get("inner"):
                out = pb_utils.Tensor.from_dlpack("OUT", fake_cuda_capsule(fake_device_array(data * 3, 0), 0))
            else:
                call = pb_utils.InferenceRequest(
                    model_name="self_caller", inputs=[pb_utils.Tensor("IN", data)], requested_output_names=["OUT"],
                    parameters={"inner": True},
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
                answers = [a for a in await call.async_exec(decoupled=True) if a.output_tensors() or a.has_error()]
                if answers[0].has_error():
                    raise pb_utils.TritonModelException(answers[0].error().message())
                out = pb_utils.get_output_tensor_by_name(answers[0], "OUT")
                if out.is_cpu():
                    raise pb_utils.TritonModelException("the inner answer did not arrive on the GPU")
            sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
_SELF_CALLER_CONFIG = '''backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]
'''
_SELF_DRIVER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="self_caller", inputs=[pb_utils.get_input_tensor_by_name(
                request, "IN")], requested_output_names=["OUT"])
            answers = [a for a in call.exec(decoupled=True) if a.output_tensors() or a.has_error()]
            if answers[0].has_error():
                raise pb_utils.TritonModelException(answers[0].error().message())
            out = pb_utils.get_output_tensor_by_name(answers[0], "OUT")
            info = np.array([json.dumps({"mapped": True}).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([out, pb_utils.Tensor("INFO", info)]))
        return responses
'''


_GPU_INPUTS_ALLOWED = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'


def _config(gpu: int, cached: bool = False, force_cpu_inputs: bool = True, batched: bool = False) -> str:
    return f'''backend: "python"
{"response_cache { enable: true }" if cached else ""}
{"" if force_cpu_inputs else _GPU_INPUTS_ALLOWED}
{"max_batch_size: 4 dynamic_batching { }" if batched else "max_batch_size: 0"}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {gpu} ] }} ]
'''


# An ensemble over `unforced` that asks for GPU inputs too: the server reads its inputs, so a BLS
# caller's GPU input reaches it (and its step) as a host copy.
_ENSEMBLE = f'''platform: "ensemble"
max_batch_size: 0
{_GPU_INPUTS_ALLOWED}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "unforced" model_version: -1 input_map {{ key: "IN" value: "IN" }}
  output_map {{ key: "OUT" value: "OUT" }} output_map {{ key: "INFO" value: "INFO" }} }} ] }}
'''


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root = Path(tmp_path_factory.mktemp("gpu_bls"))
    for name, gpu, cached, forced in (("producer", 0, False, True), ("consumer", 1, False, True),
                                      ("cached_producer", 0, True, True), ("unforced", 0, False, False),
                                      ("unforced_cached", 0, True, False)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_MODEL)
        (root / name / "config.pbtxt").write_text(_config(gpu, cached, forced))
    (root / "relay" / "1").mkdir(parents=True)  # a GPU 0 instance that hands on what it maps
    (root / "relay" / "1" / "model.py").write_text(_MODEL)
    (root / "relay" / "config.pbtxt").write_text(_config(0))
    for name, code, config in (("self_caller", _SELF_CALLER, _SELF_CALLER_CONFIG),
                               ("self_driver", _SELF_DRIVER, _config(0))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(config)
    (root / "unforced_batched" / "1").mkdir(parents=True)
    (root / "unforced_batched" / "1" / "model.py").write_text(_MODEL)
    (root / "unforced_batched" / "config.pbtxt").write_text(_config(0, force_cpu_inputs=False, batched=True))
    (root / "unforced_ensemble" / "1").mkdir(parents=True)
    (root / "unforced_ensemble" / "config.pbtxt").write_text(_ENSEMBLE)
    with module_backend(Backend(root, "--backend-config=python,stub-timeout-seconds=5",
                                "--cache-config=local,size=1048576", env={FAKE_VARIABLE: "2"})) as started:
        yield started


def _infer(backend: Backend, model: str, params: dict[str, Any],
           data: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    data = np.arange(6, dtype=np.float32) if data is None else data
    return drive(backend.http_url, params, data, model, network_timeout=60)


def _until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `check()` until truthy (exports are given back asynchronously); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def _idle(facts: dict[str, Any]) -> bool:
    assert facts["freed_while_mapped"] == 0, "a stub freed device memory another process still mapped"
    return facts["device_exports"] == 0 and facts["device_claims"] == 0 and facts["device_mappings"] == 0 \
        and facts["device_exports_held"] == 0


def _all_idle(backend: Backend) -> bool:
    return all(_idle(_infer(backend, model, {"mode": "inspect"})[1]) for model in ("producer", "consumer", "unforced"))


def _kill_and_wait_for_restart(backend: Backend, model: str, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _until(f"a new stub of '{model}'", lambda: _try_pid(backend, model) not in (None, pid))


def _try_pid(backend: Backend, model: str) -> int | None:
    try:
        return int(_infer(backend, model, {"mode": "inspect"})[1]["pid"])
    except Exception:  # noqa: BLE001 - restarting: not ready yet
        return None


def test_a_gpu_output_reaches_the_caller_mapped_without_a_copy_and_is_given_back(backend: Backend) -> None:
    data = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    out, info = _infer(backend, "consumer", {"mode": "call", "device": 0}, data)
    np.testing.assert_array_equal(out, data * 2)  # read through the consumer's mapping
    assert (info["is_cpu"], info["device"]) == (False, 0)
    during = info["during"]
    assert (during["device_exports"], during["device_claims"], during["device_mappings"]) == (1, 1, 1)
    _until("every export given back", lambda: _all_idle(backend))


def test_without_a_preferred_gpu_the_output_arrives_on_the_cpu(backend: Backend) -> None:
    out, info = _infer(backend, "consumer", {"mode": "call"})
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32) * 2)
    assert info["is_cpu"] and info["during"]["device_exports"] == 0


def test_another_gpu_gets_a_copy_through_the_host_and_nothing_is_exported(backend: Backend) -> None:
    out, info = _infer(backend, "consumer", {"mode": "call", "device": 1})
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32) * 2)
    assert (info["is_cpu"], info["device"], info["during"]["device_exports"]) == (False, 1, 0)


def test_a_cached_producers_gpu_output_reaches_the_caller_as_a_copy_on_its_gpu(backend: Backend) -> None:
    for _ in range(2):  # a miss, then a hit: the cache holds host bytes, never an export
        out, info = _infer(backend, "consumer", {"mode": "call", "device": 0, "target": "cached_producer"})
        np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32) * 2)
        assert (info["is_cpu"], info["device"], info["during"]["device_exports"]) == (False, 0, 0)
    _until("every export given back", lambda: _all_idle(backend))


def test_a_consumer_killed_while_it_maps_an_export_releases_it(backend: Backend) -> None:
    _, info = _infer(backend, "consumer", {"mode": "call", "device": 0, "keep": True})
    held = _infer(backend, "producer", {"mode": "inspect"})[1]
    assert (held["device_exports_held"], held["device_claims"]) == (1, 1)
    _kill_and_wait_for_restart(backend, "consumer", info["pid"])
    _until("the dead consumer's claim released", lambda: _all_idle(backend))


def test_a_producer_killed_while_its_export_is_mapped_takes_its_exports_along(backend: Backend) -> None:
    _, info = _infer(backend, "consumer", {"mode": "call", "device": 0, "keep": True})
    producer = _infer(backend, "producer", {"mode": "inspect"})[1]["pid"]
    _kill_and_wait_for_restart(backend, "producer", producer)
    consumer = _until("the dead producer's export dropped",
                      lambda: (f := _infer(backend, "consumer", {"mode": "inspect"})[1])["device_exports"] == 0 and f)
    assert consumer["device_mappings"] == 1  # the consumer still maps it, as a CUDA importer would
    _infer(backend, "consumer", {"mode": "drop"})
    _until("every export given back", lambda: _all_idle(backend))
    out, _ = _infer(backend, "consumer", {"mode": "call", "device": 0})  # and the pair works again
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32) * 2)


def test_a_gpu_input_to_a_callee_that_takes_it_on_that_gpu_is_mapped_not_copied(backend: Backend) -> None:
    data = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    out, info = _infer(backend, "producer", {"mode": "call", "target": "unforced", "gpu_input": True}, data)
    np.testing.assert_array_equal(out, data)  # the callee answered with its input, read through its mapping
    callee = info["callee"]
    assert (callee["input_is_cpu"], callee["device"]) == (False, 0)
    during = callee["during"]  # inside the callee: the caller's export, the callee's claim and mapping
    assert (during["device_exports"], during["device_claims"], during["device_mappings"]) == (1, 1, 1)
    _until("every export given back", lambda: _all_idle(backend))


@pytest.mark.parametrize(("caller", "target"), [
    ("consumer", "producer"),  # GPU 1 to a callee with FORCE_CPU_ONLY_INPUT_TENSORS "yes" (the default)
    ("consumer", "unforced"),  # GPU 1 to a callee that takes GPU inputs on GPU 0 only
    ("producer", "unforced_cached"),  # the response cache hashes the input bytes in the server
    ("producer", "unforced_ensemble"),  # an ensemble's steps get their inputs from the server
    ("producer", "unforced_batched"),  # the dynamic batcher gathers inputs in the server
])
def test_a_gpu_input_reaches_the_callee_on_the_cpu_copied_by_the_caller(backend: Backend, caller: str,
                                                                        target: str) -> None:
    data = np.linspace(-1, 1, 1 << 12, dtype=np.float32)
    params = {"mode": "call", "target": target, "gpu_input": True, "batched": target.endswith("batched")}
    out, info = _infer(backend, caller, params, data)
    np.testing.assert_array_equal(out, data * 2)  # the callee read the caller's GPU data from the host copy
    assert info["callee"]["input_is_cpu"] is True
    during = info["during"]
    assert (during["device_exports"], during["device_exports_held"]) == (0, 0)  # nothing was exported
    _until("every export given back", lambda: _all_idle(backend))


def test_a_caller_killed_while_the_callee_maps_its_gpu_input_takes_its_export_along(backend: Backend) -> None:
    _, info = _infer(backend, "producer", {"mode": "call", "target": "unforced", "gpu_input": True,
                                           "callee_keep": True})
    held = _infer(backend, "unforced", {"mode": "inspect"})[1]
    assert (held["device_exports"], held["device_claims"], held["device_mappings"]) == (1, 1, 1)
    _kill_and_wait_for_restart(backend, "producer", info["pid"])
    callee = _until("the dead caller's export dropped",
                    lambda: (f := _infer(backend, "unforced", {"mode": "inspect"})[1])["device_exports"] == 0 and f)
    assert callee["device_mappings"] == 1  # the callee still maps it, as a CUDA importer would
    _infer(backend, "unforced", {"mode": "drop"})
    _until("every export given back", lambda: _all_idle(backend))


def test_a_callee_killed_while_it_maps_a_gpu_input_releases_it(backend: Backend) -> None:
    _infer(backend, "producer", {"mode": "call", "target": "unforced", "gpu_input": True,
                                 "callee_keep": True})
    caller = _infer(backend, "producer", {"mode": "inspect"})[1]
    assert (caller["device_exports_held"], caller["device_claims"]) == (1, 1)  # held for the callee's mapping
    _kill_and_wait_for_restart(backend, "unforced", _infer(backend, "unforced", {"mode": "inspect"})[1]["pid"])
    _until("the dead callee's claim released", lambda: _all_idle(backend))


def test_a_mapped_gpu_tensor_given_on_as_an_input_is_exported_again_as_a_copy(backend: Backend) -> None:
    data = np.arange(6, dtype=np.float32)
    out, info = _infer(backend, "producer", {"mode": "call", "target": "unforced", "device": 0, "pass_on": True},
                       data)
    np.testing.assert_array_equal(out, data * 2)  # doubled once by the first call; the second answers its input
    assert (info["is_cpu"], info["callee"]["input_is_cpu"]) == (False, False)  # CUDA could not export the mapping
    _until("every export given back", lambda: _all_idle(backend))


@pytest.mark.parametrize("produce", [{"late": True}, {"pooled": True}], ids=["written-late", "pool-memory"])
def test_what_the_producer_wrote_reaches_the_caller_however_its_memory_came_to_be(
        backend: Backend, produce: dict[str, Any]) -> None:
    data = np.linspace(-1, 1, 1 << 12, dtype=np.float32)
    callee = json.dumps({"mode": "produce", **produce})
    out, info = _infer(backend, "consumer", {"mode": "call", "device": 0, "callee": callee}, data)
    np.testing.assert_array_equal(out, data * 2)  # handing over its memory itself: zeros, or no export at all
    assert (info["is_cpu"], info["during"]["device_mappings"]) == (False, 1)
    _until("every export given back", lambda: _all_idle(backend))


def test_a_callee_that_returns_a_tensor_it_mapped_hands_it_on(backend: Backend) -> None:
    data = np.arange(6, dtype=np.float32)
    callee = json.dumps({"mode": "call", "device": 0, "target": "producer"})  # the relay maps producer's answer
    out, info = _infer(backend, "consumer", {"mode": "call", "device": 0, "target": "relay", "callee": callee}, data)
    np.testing.assert_array_equal(out, data * 2)
    assert (info["is_cpu"], info["during"]["device_mappings"]) == (False, 1)
    _until("every export given back", lambda: _all_idle(backend))


def test_an_empty_gpu_output_reaches_a_caller_that_prefers_the_gpu(backend: Backend) -> None:
    out, info = _infer(backend, "consumer", {"mode": "call", "device": 0}, np.empty(0, np.float32))
    assert out.shape == (0,) and (info["is_cpu"], info["device"]) == (False, 0)


def test_a_stub_maps_its_own_export(backend: Backend) -> None:
    """An async decoupled model that calls itself through BLS, asking for the answer on its GPU."""
    data = np.arange(6, dtype=np.float32)
    out, info = _infer(backend, "self_driver", {}, data)
    np.testing.assert_array_equal(out, data * 3)
    assert info == {"mapped": True}
