"""Which BLS targets take a caller's GPU inputs as they are (features.bls.device_inputs).

Only a model that asks for GPU inputs, runs every instance on the caller's device and has no
server path that reads input bytes (batchers, the response cache, ensembles) qualifies; the
integration tests (test_gpu_bls.py) run the mapped and copied paths with real stubs.
"""

from __future__ import annotations

import pytest

from pystub_backend.backend.config.model_config import ModelConfig, normalize, parse_config_text
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.bls.device_inputs import accepts_device_inputs, check_device_inputs
from pystub_backend.backend.inference import DeviceRef, InferRequest, Tensor

_GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
_ON_GPU_0 = "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]"
_IO = '''input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]'''


def _config(*sections: str, max_batch_size: int = 0) -> ModelConfig:
    text = "\n".join(['backend: "python"', f"max_batch_size: {max_batch_size}", _IO, *sections])
    return normalize(parse_config_text(text, "/m/config.pbtxt"), "m", gpus=(0, 1))


def test_a_model_asking_for_gpu_inputs_with_every_instance_on_the_device_takes_them() -> None:
    config = _config(_GPU_INPUTS, _ON_GPU_0)
    assert accepts_device_inputs(config, 0)
    assert not accepts_device_inputs(config, 1)  # another device: through the host


@pytest.mark.parametrize("sections", [
    pytest.param((_ON_GPU_0,), id="default FORCE_CPU_ONLY_INPUT_TENSORS (yes)"),
    pytest.param((_ON_GPU_0, _GPU_INPUTS.replace('"no"', '"yes"')), id="yes"),
    pytest.param((_GPU_INPUTS, "instance_group [ { kind: KIND_CPU count: 1 } ]"), id="CPU instances"),
    pytest.param((_GPU_INPUTS, "instance_group [ { kind: KIND_GPU count: 1 } ]"), id="GPU instances on every device"),
    pytest.param((_GPU_INPUTS, _ON_GPU_0, "instance_group [ { kind: KIND_CPU count: 1 } ]"),
                 id="a CPU group besides"),
    pytest.param((_GPU_INPUTS, _ON_GPU_0, "response_cache { enable: true }"), id="response cache"),
])
def test_everything_else_gets_host_copies(sections: tuple[str, ...]) -> None:
    assert not accepts_device_inputs(_config(*sections), 0)


@pytest.mark.parametrize("scheduling", ["dynamic_batching { }", "sequence_batching { }"])
def test_a_batching_model_gets_host_copies(scheduling: str) -> None:
    assert not accepts_device_inputs(_config(_GPU_INPUTS, _ON_GPU_0, scheduling, max_batch_size=4), 0)


def test_an_ensemble_gets_host_copies() -> None:
    text = f'''platform: "ensemble"
max_batch_size: 0
{_IO}
{_GPU_INPUTS}
ensemble_scheduling {{ step [ {{ model_name: "m2" model_version: -1
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }} ] }}'''
    assert not accepts_device_inputs(normalize(parse_config_text(text, "/e/config.pbtxt"), "e", gpus=(0,)), 0)


def test_a_request_whose_gpu_inputs_the_serving_version_no_longer_takes_is_refused() -> None:
    gpu_input = Tensor("IN", "FP32", (4,), b"", device=DeviceRef(("m_0_0", 1), 0, 0, 16, b"h" * 64))
    request = InferRequest("m", inputs=[gpu_input])
    check_device_inputs(request, _config(_GPU_INPUTS, _ON_GPU_0))  # still takes them: nothing raised
    with pytest.raises(ServerError, match="no longer takes GPU inputs on device 0"):
        check_device_inputs(request, _config(_ON_GPU_0))
    assert gpu_input.nbytes == 16  # validation sizes a GPU input by its export, not its (empty) data
