"""The LLM and embedding contracts of the OpenAI port: inputs shaped from the model's own
metadata (vLLM's dims [1] and [1, 1], batching or not), only the inputs a model declares, and a
refusal naming what an off-contract model lacks."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from pystub_backend.backend.frontends.openai.contract import embedding_contract, llm_contract
from pystub_backend.backend.frontends.openai.errors import OpenAIError
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.inference import tensor_to_numpy


class _Metadata:
    """The one core service a contract reads: a model's metadata, as the core renders it."""

    def __init__(self, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]]) -> None:
        self._document = {"name": "m", "inputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in inputs],
                          "outputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in outputs]}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._document


_TEXT_OUT = [("text_output", "BYTES", [-1])]


@pytest.mark.parametrize(("shape", "sent"), [([1], (1,)), ([-1, 1], (1, 1)), ([1, 1], (1, 1)), ([-1], (1,))])
def test_inputs_take_the_model_s_shape(shape: list[int], sent: tuple[int, ...]) -> None:
    core = _Metadata([("text_input", "BYTES", shape), ("stream", "BOOL", shape)], _TEXT_OUT)
    request = llm_contract(core, "m").request(GenerationRequest("m", "hi there", stream=True), "id-1")  # type: ignore[arg-type]
    assert [(t.name, t.shape) for t in request.inputs] == [("text_input", sent), ("stream", sent)]
    assert tensor_to_numpy(request.inputs[0]).reshape(-1).tolist() == [b"hi there"]
    assert request.id == "id-1" and request.model_name == "m"


def test_declared_inputs_only_and_their_values() -> None:
    core = _Metadata([("text_input", "BYTES", [1]), ("sampling_parameters", "BYTES", [1]),
                      ("exclude_input_in_output", "BOOL", [1]), ("max_tokens", "INT32", [1])], _TEXT_OUT)
    generation = GenerationRequest("m", "p", max_tokens=9, echo=True, sampling={"max_tokens": 9, "top_p": 0.5})
    inputs = {t.name: t for t in llm_contract(core, "m").request(generation, "x").inputs}  # type: ignore[arg-type]
    assert set(inputs) == {"text_input", "sampling_parameters", "exclude_input_in_output", "max_tokens"}
    assert json.loads(tensor_to_numpy(inputs["sampling_parameters"]).reshape(-1)[0]) == {"max_tokens": 9, "top_p": 0.5}
    assert bytes(inputs["exclude_input_in_output"].data) == b"\x00"  # echo: the prompt stays in the output
    assert struct.unpack("<i", bytes(inputs["max_tokens"].data)) == (9,)


def test_off_contract_models_are_refused_naming_what_is_missing() -> None:
    core = _Metadata([("INPUT0", "FP32", [4])], [("OUTPUT0", "FP32", [4])])
    with pytest.raises(OpenAIError) as caught:
        llm_contract(core, "m")  # type: ignore[arg-type]
    message = caught.value.message
    assert caught.value.status == 400 and caught.value.param == "model"
    assert "input 'text_input' (BYTES) and output 'text_output' (BYTES)" in message
    assert "inputs INPUT0; outputs OUTPUT0" in message
    with pytest.raises(OpenAIError, match=r"output 'embedding' \(FP32/FP16/FP64\)"):
        embedding_contract(_Metadata([("text_input", "BYTES", [1])], _TEXT_OUT), "m")  # type: ignore[arg-type]


def test_a_text_input_of_the_wrong_type_is_off_contract() -> None:
    with pytest.raises(OpenAIError, match="input 'text_input' \\(BYTES\\)"):
        llm_contract(_Metadata([("text_input", "FP32", [1])], _TEXT_OUT), "m")  # type: ignore[arg-type]
