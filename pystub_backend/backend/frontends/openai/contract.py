"""The model contracts of the OpenAI port: which tensor names a model must declare, and the
`InferRequest` built for it.

LLM (Triton's OpenAI frontend and vLLM's backend use the same names):

    input  text_input               BYTES  the prompt, unchanged                        required
    input  stream                   BOOL   true for `stream: true`                      used if declared
    input  sampling_parameters      BYTES  JSON: temperature, top_p, max_tokens, ...    used if declared
    input  exclude_input_in_output  BOOL   true unless a completion asks for `echo`     used if declared
    input  max_tokens               INT32  the request's max_tokens (TensorRT-LLM's)    used if declared
    input  return_num_input_tokens, return_num_output_tokens  BOOL  (vLLM's)            used if declared
    output text_output              BYTES  the text of each response                    required
    output num_input_tokens, num_output_tokens  UINT32/INT32: `usage`, when the model sends them
                                    (per response: a stream's num_output_tokens add up)

Embeddings:

    input  text_input  BYTES  one string per request
    output embedding   FP32 (FP16, FP64)  the vector

Every input is shaped from the model's own metadata, with 1 for each variable dimension (and for
the batch dimension), so vLLM's `dims: [1]` and `dims: [1, 1]` both work. A model without the
required names is refused (400) with a message naming what it lacks and what it declares.

What a model declares beyond the names, in its config's `parameters` (string values):

    structured_outputs  "true"      it follows `guided_decoding` in its sampling parameters
                                    (structured.py); a model of backend "vllm" does unless "false"
    max_model_len       "N"         its context length, over --max-model-len
    tool_call_parser    "NAME"      the parser of its tool calls, over --tool-call-parser
    matryoshka          "true"      an embedding model whose vectors may be truncated (`dimensions`)

and, as outputs: `logprobs` (BYTES, logprobs.py), with `return_logprobs` (BOOL) if it wants asking.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from pystub_backend.backend.config.model_config import config_parameters
from pystub_backend.backend.frontends.openai.errors import OpenAIError
from pystub_backend.backend.frontends.openai.request_body import GenerationRequest
from pystub_backend.backend.inference import FrontendCore, InferRequest, InferResponse, Tensor, tensor_to_numpy
from pystub_backend.ipc.bytes_codec import serialize_bytes

__all__ = ["LlmContract", "EmbeddingContract", "llm_contract", "embedding_contract", "response_text",
           "response_logprobs", "token_counts", "embedding_vector"]

_TEXT_IN, _TEXT_OUT, _EMBEDDING, _LOGPROBS = "text_input", "text_output", "embedding", "logprobs"
_FLOATS = ("FP32", "FP16", "FP64")


@dataclass(frozen=True)
class _Spec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # variable dimensions (and the batch dimension) as 1


def _specs(entries: list[dict[str, Any]]) -> dict[str, _Spec]:
    return {e["name"]: _Spec(e["name"], e["datatype"], tuple(1 if d < 0 else d for d in e["shape"])) for e in entries}


def _refusal(model: str, what: str, missing: list[str], metadata: dict[str, Any]) -> OpenAIError:
    inputs = ", ".join(e["name"] for e in metadata["inputs"]) or "none"
    outputs = ", ".join(e["name"] for e in metadata["outputs"]) or "none"
    return OpenAIError(400, f"model '{model}' does not follow the {what} contract of the OpenAI API: it lacks "
                            f"{' and '.join(missing)} (it declares inputs {inputs}; outputs {outputs}); "
                            "see docs/openai.md", "model")


def _missing(inputs: dict[str, _Spec], outputs: dict[str, _Spec], wanted_in: str, wanted_out: str,
             out_types: tuple[str, ...]) -> list[str]:
    missing = []
    if inputs.get(wanted_in) is None or inputs[wanted_in].datatype != "BYTES":
        missing.append(f"input '{wanted_in}' (BYTES)")
    if outputs.get(wanted_out) is None or outputs[wanted_out].datatype not in out_types:
        missing.append(f"output '{wanted_out}' ({'/'.join(out_types)})")
    return missing


def _tensor(spec: _Spec, data: bytes) -> Tensor:
    return Tensor(spec.name, spec.datatype, spec.shape, data)


def _scalar(spec: _Spec, value: bool | int) -> Tensor:
    formats = {"BOOL": "?", "INT32": "<i", "INT64": "<q", "UINT32": "<I"}
    if spec.datatype not in formats:
        raise OpenAIError(400, f"input '{spec.name}' must be BOOL or INT32, the model declares {spec.datatype}")
    return _tensor(spec, struct.pack(formats[spec.datatype], value))


@dataclass(frozen=True)
class LlmContract:
    """An LLM model's inputs as the OpenAI port fills them, and what it declares."""

    model: str
    inputs: dict[str, _Spec]
    structured_outputs: bool = False
    logprobs: bool = False
    max_model_len: int | None = None
    tool_call_parser: str = ""

    def request(self, prompt: str, generation: GenerationRequest, sampling: dict[str, Any],
                request_id: str) -> InferRequest:
        inputs = self.inputs
        tensors = [_tensor(inputs[_TEXT_IN], serialize_bytes([prompt.encode()]))]
        if "stream" in inputs:
            tensors.append(_scalar(inputs["stream"], generation.stream))
        if "sampling_parameters" in inputs:
            text = json.dumps(sampling, allow_nan=False).encode()
            tensors.append(_tensor(inputs["sampling_parameters"], serialize_bytes([text])))
        if "exclude_input_in_output" in inputs:
            tensors.append(_scalar(inputs["exclude_input_in_output"], not generation.echo))
        if "max_tokens" in inputs and generation.max_tokens is not None:
            tensors.append(_scalar(inputs["max_tokens"], generation.max_tokens))
        for name in ("return_num_input_tokens", "return_num_output_tokens"):
            if name in inputs:
                tensors.append(_scalar(inputs[name], True))
        if "return_logprobs" in inputs:
            tensors.append(_scalar(inputs["return_logprobs"], generation.logprobs is not None))
        return InferRequest(self.model, "", request_id, tensors)


def _declared(parameters: dict[str, str], key: str, default: bool = False) -> bool:
    value = parameters.get(key, "").strip().lower()
    return default if not value else value in ("true", "1", "yes", "on")


def _length(model: str, parameters: dict[str, str]) -> int | None:
    text = parameters.get("max_model_len", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise OpenAIError(500, f"model '{model}' declares max_model_len {text!r}: not a positive integer")
    return int(text)


def llm_contract(core: FrontendCore, model: str) -> LlmContract:
    """Raises ServerError(NOT_FOUND) for an unknown model, OpenAIError(400) for one off contract."""
    metadata = core.model_metadata(model)
    inputs, outputs = _specs(metadata["inputs"]), _specs(metadata["outputs"])
    missing = _missing(inputs, outputs, _TEXT_IN, _TEXT_OUT, ("BYTES",))
    if missing:
        raise _refusal(model, "LLM", missing, metadata)
    config = core.model_config(model)
    parameters = config_parameters(config)
    return LlmContract(model, inputs, _declared(parameters, "structured_outputs", config.backend == "vllm"),
                       _LOGPROBS in outputs and outputs[_LOGPROBS].datatype == "BYTES", _length(model, parameters),
                       parameters.get("tool_call_parser", "").strip())


@dataclass(frozen=True)
class EmbeddingContract:
    model: str
    text_input: _Spec
    size: int | None = None  # the vector's length where the model's output shape fixes it
    matryoshka: bool = False  # a shorter vector is its beginning, renormalised

    def request(self, text: str, request_id: str) -> InferRequest:
        return InferRequest(self.model, "", request_id, [_tensor(self.text_input, serialize_bytes([text.encode()]))],
                            [])


def embedding_contract(core: FrontendCore, model: str) -> EmbeddingContract:
    """Raises ServerError(NOT_FOUND) for an unknown model, OpenAIError(400) for one off contract."""
    metadata = core.model_metadata(model)
    inputs, outputs = _specs(metadata["inputs"]), _specs(metadata["outputs"])
    missing = _missing(inputs, outputs, _TEXT_IN, _EMBEDDING, _FLOATS)
    if missing:
        raise _refusal(model, "embedding", missing, metadata)
    shape = next(e["shape"] for e in metadata["outputs"] if e["name"] == _EMBEDDING)
    dims = shape[1:] if shape and shape[0] == -1 else shape  # without the batch dimension
    size = int(np.prod(dims)) if dims and all(d > 0 for d in dims) else None
    return EmbeddingContract(model, inputs[_TEXT_IN], size,
                             _declared(config_parameters(core.model_config(model)), "matryoshka"))


def _output(response: InferResponse, name: str) -> Tensor | None:
    return next((tensor for tensor in response.outputs if tensor.name == name), None)


def response_text(response: InferResponse) -> str:
    """The text of one response (every element of text_output, joined); "" when it has none."""
    tensor = _output(response, _TEXT_OUT)
    if tensor is None:
        return ""
    return "".join(bytes(item).decode("utf-8", "replace") for item in tensor_to_numpy(tensor).reshape(-1))


def response_logprobs(response: InferResponse) -> bytes | None:
    """The response's `logprobs` element (logprobs.py reads it), or None."""
    tensor = _output(response, _LOGPROBS)
    if tensor is None or not tensor.nbytes:
        return None
    return bytes(tensor_to_numpy(tensor).reshape(-1)[0])


def token_counts(response: InferResponse) -> tuple[int | None, int | None]:
    """(num_input_tokens, num_output_tokens) where the model sent them (vLLM's outputs)."""
    counts: list[int | None] = []
    for name in ("num_input_tokens", "num_output_tokens"):
        tensor = _output(response, name)
        counts.append(int(tensor_to_numpy(tensor).reshape(-1)[0]) if tensor is not None and tensor.nbytes else None)
    return counts[0], counts[1]


def embedding_vector(response: InferResponse) -> np.ndarray:
    """The embedding of one response as float32, flattened. Raises OpenAIError(500) without one."""
    tensor = _output(response, _EMBEDDING)
    if tensor is None:
        raise OpenAIError(500, f"model '{response.model_name}' sent no '{_EMBEDDING}' output")
    return tensor_to_numpy(tensor).astype(np.float32).reshape(-1)
