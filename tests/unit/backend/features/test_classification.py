"""backend.features.classification: top-N classes of an output, as Triton formats them.

The same behaviour is compared with real Triton 2.51 by tests/differential/test_infer.py
(`test_classification_*`); these cases pin the edges without a server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pystub_backend.backend.config.model_config import ModelConfig, normalize, parse_config_text
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.features.classification import class_counts, classify
from pystub_backend.backend.inference import InferRequest, InferResponse, RequestedOutput, Tensor, tensor_to_numpy
from pystub_backend.ipc.status import Status


def _config(max_batch_size: int, datatype: str = "TYPE_FP32", labels: str = "") -> ModelConfig:
    label = f', label_filename: "{labels}"' if labels else ""
    text = (f"max_batch_size: {max_batch_size}\n"
            f'input [ {{ name: "X", data_type: {datatype}, dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "Y", data_type: {datatype}, dims: [ -1 ]{label} }} ]\n')
    return normalize(parse_config_text(text, "config.pbtxt"), "m")


def _response(array: np.ndarray, datatype: str) -> InferResponse:
    return InferResponse("m", "1", outputs=[Tensor("Y", datatype, array.shape, array.tobytes())])


def _strings(response: InferResponse) -> tuple[tuple[int, ...], list[str]]:
    (tensor,) = response.outputs
    assert tensor.datatype == "BYTES"
    return tensor.shape, [item.decode() for item in tensor_to_numpy(tensor).reshape(-1)]


def test_batched_output_is_classified_per_entry_with_labels(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("zero\none\ntwo\n")
    values = np.array([[0.1, 0.7, 0.2, 0.0], [3, 1, 2, 5]], np.float32)
    classified = classify(_response(values, "FP32"), {"Y": 2}, _config(4, labels="labels.txt"), str(tmp_path))
    assert _strings(classified) == ((2, 2), ["0.700000:1:one", "0.200000:2:two", "5.000000:3", "3.000000:0:zero"])


def test_unbatched_integers_ties_and_a_count_beyond_the_values(tmp_path: Path) -> None:
    values = np.array([2, 7, 2], np.uint8)
    classified = classify(_response(values, "UINT8"), {"Y": 9}, _config(0, "TYPE_UINT8"), str(tmp_path))
    assert _strings(classified) == ((3,), ["7:1", "2:0", "2:2"])


def test_the_original_response_is_left_alone(tmp_path: Path) -> None:
    response = _response(np.array([1.0, 2.0], np.float32), "FP32")
    classify(response, {"Y": 1}, _config(0), str(tmp_path))
    assert response.outputs[0].datatype == "FP32"   # a cached response must not change


def test_an_output_without_order_is_refused(tmp_path: Path) -> None:
    response = _response(np.array([1.0], np.float16), "FP16")
    with pytest.raises(ServerError, match="class result not available for output 'Y' due to unsupported type 'FP16'"):
        classify(response, {"Y": 1}, _config(0, "TYPE_FP16"), str(tmp_path))


@pytest.mark.parametrize(("count", "wanted"), [(3, {"Y": 3}), (0, {}), (None, {})])
def test_class_counts(count: object, wanted: dict[str, int]) -> None:
    parameters = {} if count is None else {"classification": count}
    assert class_counts(InferRequest("m", outputs=[RequestedOutput("Y", parameters)])) == wanted  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [-1, True, "3", 1.5])
def test_a_bad_count_is_the_clients_mistake(count: object) -> None:
    with pytest.raises(ServerError, match="'classification' of output 'Y' must be a non-negative integer") as info:
        class_counts(InferRequest("m", outputs=[RequestedOutput("Y", {"classification": count})]))  # type: ignore[dict-item]
    assert info.value.status == Status.INVALID_ARG
