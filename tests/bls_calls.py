"""The call every BLS test makes: the bls_driver-shaped models take an FP32 `IN` and request
parameters, and answer `OUT` and a JSON `INFO` of what they did."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import tritonclient.http as httpclient


def drive(backend_url: str, params: dict[str, Any], data: np.ndarray | None = None, model: str = "bls_driver",
          network_timeout: float = 300.0) -> tuple[np.ndarray, dict[str, Any]]:
    """Infer `model` at `backend_url` (HTTP) with `IN` = `data` (default 0..3); (OUT, INFO)."""
    data = np.arange(4, dtype=np.float32) if data is None else data
    client = httpclient.InferenceServerClient(backend_url, network_timeout=network_timeout)
    try:
        tensor = httpclient.InferInput("IN", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        result = client.infer(model, [tensor], parameters=params)
        return result.as_numpy("OUT"), json.loads(result.as_numpy("INFO")[0])
    finally:
        client.close()
