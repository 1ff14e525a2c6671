"""The LLM and embedding contracts of the OpenAI port: inputs shaped from the model's own
metadata (vLLM's dims [1] and [1, 1], batching or not), only the inputs a model declares, what a
model declares in its config (structured outputs, context length, tool-call parser, matryoshka) and
outputs (logprobs), and a refusal naming what an off-contract model lacks."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.frontends.openai.contract import embedding_contract, llm_contract
from pystub_backend.backend.frontends.openai.errors import OpenAIError
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.inference import tensor_to_numpy


class _Metadata:
    """The core services a contract reads: a model's metadata, as the core renders it, and its config."""

    def __init__(self, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]],
                 backend: str = "python", **parameters: str) -> None:
        self._document = {"name": "m", "inputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in inputs],
                          "outputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in outputs]}
        self._config = model_config_pb2.ModelConfig(name="m", backend=backend)
        for key, value in parameters.items():
            self._config.parameters[key].string_value = value

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._document

    def model_config(self, name: str, version: str = "") -> model_config_pb2.ModelConfig:
        return self._config


_TEXT_OUT = [("text_output", "BYTES", [-1])]


@pytest.mark.parametrize(("shape", "sent"), [([1], (1,)), ([-1, 1], (1, 1)), ([1, 1], (1, 1)), ([-1], (1,))])
def test_inputs_take_the_model_s_shape(shape: list[int], sent: tuple[int, ...]) -> None:
    core = _Metadata([("text_input", "BYTES", shape), ("stream", "BOOL", shape)], _TEXT_OUT)
    generation = GenerationRequest("m", ["hi there"], stream=True)
    request = llm_contract(core, "m").request("hi there", generation, {}, "id-1")  # type: ignore[arg-type]
    assert [(t.name, t.shape) for t in request.inputs] == [("text_input", sent), ("stream", sent)]
    assert tensor_to_numpy(request.inputs[0]).reshape(-1).tolist() == [b"hi there"]
    assert request.id == "id-1" and request.model_name == "m"


def test_declared_inputs_only_and_their_values() -> None:
    core = _Metadata([("text_input", "BYTES", [1]), ("sampling_parameters", "BYTES", [1]),
                      ("exclude_input_in_output", "BOOL", [1]), ("max_tokens", "INT32", [1])], _TEXT_OUT)
    generation = GenerationRequest("m", ["p"], max_tokens=9, echo=True)
    contract = llm_contract(core, "m")  # type: ignore[arg-type]
    inputs = {t.name: t for t in contract.request("p", generation, {"max_tokens": 9, "top_p": 0.5}, "x").inputs}
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


@pytest.mark.parametrize(("backend", "parameters", "structured"), [
    ("python", {}, False), ("python", {"structured_outputs": "true"}, True), ("vllm", {}, True),
    ("vllm", {"structured_outputs": "false"}, False), ("python", {"structured_outputs": "yes"}, True)])
def test_structured_outputs_are_declared_in_the_config(backend: str, parameters: dict[str, str],
                                                       structured: bool) -> None:
    core = _Metadata([("text_input", "BYTES", [1])], _TEXT_OUT, backend, **parameters)
    assert llm_contract(core, "m").structured_outputs is structured  # type: ignore[arg-type]


def test_context_length_parser_and_logprobs_are_declared() -> None:
    core = _Metadata([("text_input", "BYTES", [1]), ("return_logprobs", "BOOL", [1])],
                     [*_TEXT_OUT, ("logprobs", "BYTES", [-1])], max_model_len="4096", tool_call_parser="mistral")
    contract = llm_contract(core, "m")  # type: ignore[arg-type]
    assert (contract.max_model_len, contract.tool_call_parser, contract.logprobs) == (4096, "mistral", True)
    asked = contract.request("p", GenerationRequest("m", ["p"], logprobs=2), {}, "x").inputs
    assert [bytes(t.data) for t in asked if t.name == "return_logprobs"] == [b"\x01"]
    plain = llm_contract(_Metadata([("text_input", "BYTES", [1])], _TEXT_OUT), "m")  # type: ignore[arg-type]
    assert (plain.max_model_len, plain.tool_call_parser, plain.logprobs) == (None, "", False)
    with pytest.raises(OpenAIError, match="max_model_len 'lots'"):
        llm_contract(_Metadata([("text_input", "BYTES", [1])], _TEXT_OUT, max_model_len="lots"), "m")  # type: ignore[arg-type]


@pytest.mark.parametrize(("shape", "size"), [([8], 8), ([-1, 8], 8), ([-1], None), ([-1, -1], None), ([2, 4], 8)])
def test_embedding_size_from_the_output_shape(shape: list[int], size: int | None) -> None:
    core = _Metadata([("text_input", "BYTES", [1])], [("embedding", "FP32", shape)], matryoshka="true")
    contract = embedding_contract(core, "m")  # type: ignore[arg-type]
    assert (contract.size, contract.matryoshka) == (size, True)
