"""Which BLS targets take a caller's GPU input tensors as they are (mapped by CUDA IPC, no copy).

A caller's GPU input stays on its device only when nothing between the caller and the target's
`execute` reads its bytes, since the server holds no CUDA context and cannot copy it later:

- the target asks for GPU inputs: `FORCE_CPU_ONLY_INPUT_TENSORS: "no"` (Triton's default, "yes",
  hands every input over on the CPU);
- every instance of the target runs on the caller's device (another device: through the host);
- no server path reads input bytes: no dynamic or sequence batcher (batches, shape-tensor keys),
  no response cache (its hash), no ensemble (its steps).

The caller's stub asks before placing its inputs (ModelControl "device_inputs"); the server checks
again against the version that serves the call (`check_device_inputs`), so a model reloaded in
between gets no GPU input it cannot take: the call fails, never with wrong data.
"""

from __future__ import annotations

from pystub_backend.backend.config.model_config import ModelConfig, config_parameters
from pystub_backend.backend.config.placement import placements
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.response_cache import cache_enabled
from pystub_backend.backend.inference import InferRequest
from pystub_backend.ipc.status import Status

__all__ = ["accepts_device_inputs", "check_device_inputs"]


def accepts_device_inputs(config: ModelConfig, device_id: int) -> bool:
    """Whether a model with this (normalized) config takes GPU inputs on `device_id` as they are."""
    if config_parameters(config).get("FORCE_CPU_ONLY_INPUT_TENSORS", "yes") != "no":
        return False
    if config.platform == "ensemble" or config.WhichOneof("scheduling_choice") is not None:
        return False
    if cache_enabled(config):
        return False
    found = placements(config)
    return bool(found) and all(p.kind == "GPU" and p.device_id == device_id for p in found)


def check_device_inputs(request: InferRequest, config: ModelConfig) -> None:
    """Raises ServerError (UNAVAILABLE) when the request carries GPU inputs the model serving it
    cannot take as they are (it changed since the caller asked)."""
    for tensor in request.inputs:
        if tensor.device is not None and not accepts_device_inputs(config, tensor.device.device_id):
            raise ServerError(f"model '{request.model_name}' no longer takes GPU inputs on device "
                              f"{tensor.device.device_id} as they are (it was reloaded): call it again",
                              Status.UNAVAILABLE)
