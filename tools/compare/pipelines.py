"""The pipeline cells: models that call models, and a dynamically batched one (perf_analyzer, gRPC).

    step          OUTPUT0 = INPUT0 + 1 (FP32 [4], 16 B); measured alone at c=1 (p50) and c=8
    bls_twice     a BLS model whose execute calls step twice in a row: OUTPUT0 = INPUT0 + 2
    ensemble3     an ensemble of three steps: OUTPUT0 = INPUT0 + 3
    batched_step  step with dynamic_batching (max_batch_size 64) and an execute that costs 2 ms
                  per call whatever its batch holds; measured at c=64

Every model is a standard Python-backend model (execute over a list of requests), one instance,
in the repository pystub and Triton share. Before each cell one request's answer is checked, so
a server that computes the wrong thing cannot look fast.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from compare.loadgen import Point

_STEP = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + np.float32(1))])
            for r in requests]
'''

_BATCHED = '''import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.002)  # the batch's fixed cost, whatever it holds
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + np.float32(1))])
            for r in requests]
'''

_BLS = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for _ in range(2):
                answer = pb_utils.InferenceRequest(model_name="step", inputs=[pb_utils.Tensor("INPUT0", value)],
                                                   requested_output_names=["OUTPUT0"]).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                value = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
'''

_TENSORS = '''input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
'''
_ONE_INSTANCE = 'instance_group [ { count: 1, kind: KIND_CPU } ]\n'


def _python_config(name: str, max_batch: int = 0, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n{_TENSORS}{_ONE_INSTANCE}{extra}'


def _ensemble_config(name: str, steps: int) -> str:
    tensors = ["INPUT0", *(f"between{i}" for i in range(1, steps)), "OUTPUT0"]
    entries = ",\n".join(f'    {{ model_name: "step", model_version: -1, input_map {{ key: "INPUT0", value: '
                         f'"{tensors[i]}" }}, output_map {{ key: "OUTPUT0", value: "{tensors[i + 1]}" }} }}'
                         for i in range(steps))
    return f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{_TENSORS}' \
           f'ensemble_scheduling {{ step [\n{entries}\n] }}\n'


# model -> (model.py or None for an ensemble, config.pbtxt, what OUTPUT0 adds to INPUT0)
MODELS: dict[str, tuple[str | None, str, float]] = {
    "step": (_STEP, _python_config("step"), 1.0),
    "bls_twice": (_BLS, _python_config("bls_twice"), 2.0),
    "ensemble3": (None, _ensemble_config("ensemble3", 3), 3.0),
    "batched_step": (_BATCHED, _python_config("batched_step", 64, "dynamic_batching { }\n"), 1.0),
}
CELLS = (Point("step", 16, 1, "grpc"), Point("step", 16, 8, "grpc"), Point("bls_twice", 16, 8, "grpc"),
         Point("ensemble3", 16, 8, "grpc"), Point("batched_step", 16, 64, "grpc"))
TITLES = {"step": "step", "bls_twice": "BLS, two calls of step", "ensemble3": "ensemble of three steps",
          "batched_step": "dynamic batching, 2 ms per execute"}


def write_models(models: Path) -> None:
    """The pipeline models, into the repository pystub and Triton share (an ensemble's version
    folder is empty, as Triton wants it)."""
    for name, (source, config, _) in MODELS.items():
        (models / name / "1").mkdir(parents=True, exist_ok=True)
        if source is not None:
            (models / name / "1" / "model.py").write_text(source)
        (models / name / "config.pbtxt").write_text(config)


def check(url: str, model: str) -> None:
    """One gRPC request to `model`; raises RuntimeError unless OUTPUT0 = INPUT0 + what it adds."""
    value = np.arange(4, dtype=np.float32)
    batched = model == "batched_step"
    tensor = grpcclient.InferInput("INPUT0", [1, 4] if batched else [4], "FP32")
    tensor.set_data_from_numpy(value.reshape(1, 4) if batched else value)
    client = grpcclient.InferenceServerClient(url)
    try:
        got = client.infer(model, [tensor], client_timeout=60).as_numpy("OUTPUT0")
    finally:
        client.close()
    want = value + np.float32(MODELS[model][2])
    if got is None or not np.array_equal(got.reshape(-1), want):
        raise RuntimeError(f"{model} answered {got} for {value} (expected {want})")
