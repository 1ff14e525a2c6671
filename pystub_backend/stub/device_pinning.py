"""`PYSTUB_PIN_GPU: "yes"` (a model config parameter): each GPU instance's stub sees only its own GPU.

By default a stub sees every GPU the server sees, as under Triton, and the model addresses its
device as `cuda:<model_instance_device_id>`; `torch.device("cuda")` (the current device, 0 at
start) then lands on GPU 0 whatever the instance's GPU, and every library that initializes CUDA on
the current device puts a context there (hundreds of MiB per stub). Pinned, the stub's
CUDA_VISIBLE_DEVICES names the instance's GPU alone, set before the model is imported: "cuda",
"cuda:0" and `model_instance_device_id` (then "0") all mean that GPU, and no context is made on
another. The server's own id of the GPU stays what it reports (`/v2/pystub/stubs`, metrics, BLS,
client regions: devices.numbering translates at the model's edge).
"""

from __future__ import annotations

import json
import os

from pystub_backend.devices.numbering import pin
from pystub_backend.stub.loader import LoadError

__all__ = ["PARAMETER", "pinned_args"]

PARAMETER = "PYSTUB_PIN_GPU"


def pinned_args(args: dict[str, str]) -> dict[str, str]:
    """`initialize`'s arguments as the model sees them: pinned to the instance's GPU when its config
    asks for it (and it is a GPU instance), else as they are. Raises LoadError for a value other
    than "yes" or "no", or a GPU the stub's CUDA_VISIBLE_DEVICES does not have."""
    parameters = json.loads(args.get("model_config") or "{}").get("parameters") or {}
    value = (parameters.get(PARAMETER) or {}).get("string_value", "no")
    if value not in ("yes", "no"):
        raise LoadError(f"Incorrect value for {PARAMETER}: '{value}' (expected 'yes' or 'no')")
    if value == "no" or args.get("model_instance_kind") != "GPU":
        return args
    try:
        pin(os.environ, int(args["model_instance_device_id"]))
    except ValueError as exc:
        raise LoadError(f"{PARAMETER}: {exc}") from None
    return {**args, "model_instance_device_id": "0"}
