"""`POST /v1/embeddings`: one inference request per input string (sent together, so a model with
dynamic batching batches them), answered as OpenAI's CreateEmbeddingResponse.

`encoding_format` "float" gives lists of numbers; "base64" (the `openai` client's default) the
little-endian float32 bytes, base64-encoded, as OpenAI sends them. `dimensions` is the model's own
size, or, for a model that declares `matryoshka`, any size up to it: the vector's beginning,
renormalised to unit length (as OpenAI's text-embedding-3 and vLLM's Matryoshka models answer).
`usage` counts tokens with a tokenizer, else words.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from aiohttp import web

import pystub_backend.backend.frontends.openai.documents as documents
from pystub_backend.backend.frontends.http.access_log import MODEL_KEY, REQUEST_ID_KEY
from pystub_backend.backend.frontends.openai.contract import EmbeddingContract, embedding_contract, embedding_vector
from pystub_backend.backend.frontends.openai.errors import invalid
from pystub_backend.backend.frontends.openai.plan import count_tokens
from pystub_backend.backend.frontends.openai.tokens import TokenCounter
from pystub_backend.backend.inference import FrontendCore, InferResponse
from pystub_backend.backend.telemetry.token_latency import TokenMetrics

__all__ = ["embeddings", "embedding_inputs"]

_FORMATS = ("float", "base64")
_MAX_INPUTS = 2048  # OpenAI's limit of strings per request


def embedding_inputs(document: dict[str, Any]) -> list[str]:
    """The strings to embed. Raises OpenAIError(400)."""
    given = document.get("input")
    if given is None:
        raise invalid("'input' is required", "input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise invalid("'input' must be a string or a non-empty list of strings (token ids are not supported)",
                      "input")
    if len(texts) > _MAX_INPUTS:
        raise invalid(f"'input' holds {len(texts)} strings, at most {_MAX_INPUTS} are allowed", "input")
    return texts


def _encoding(document: dict[str, Any]) -> str:
    encoding = document.get("encoding_format") or "float"
    if encoding not in _FORMATS:
        raise invalid(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", "encoding_format")
    return str(encoding)


def _dimensions(document: dict[str, Any], contract: EmbeddingContract) -> int | None:
    """The size asked for, when it differs from the model's. Raises OpenAIError(400)."""
    dimensions = document.get("dimensions")
    if dimensions is None or dimensions == contract.size:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise invalid(f"'dimensions' must be a positive integer, got {dimensions!r}", "dimensions")
    if not contract.matryoshka:
        size = f"its size, {contract.size}" if contract.size is not None else "its own size"
        raise invalid(f"model '{contract.model}' gives vectors of {size}; other 'dimensions' need a model that "
                      "declares matryoshka (docs/openai.md)", "dimensions")
    if contract.size is not None and dimensions > contract.size:
        raise invalid(f"'dimensions' {dimensions} exceeds model '{contract.model}''s size, {contract.size}",
                      "dimensions")
    return dimensions


def _shortened(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    if dimensions is None:
        return vector
    if dimensions > vector.size:
        raise invalid(f"'dimensions' {dimensions} exceeds the model's vector of {vector.size}", "dimensions")
    head = vector[:dimensions]
    norm = float(np.linalg.norm(head))
    return head / norm if norm else head


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    return base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()


def _data(responses: list[InferResponse | BaseException], encoding: str, dimensions: int | None
          ) -> list[dict[str, Any]]:
    """The embeddings of every response; raises the first failure. Releases every response."""
    try:
        data = []
        for index, response in enumerate(responses):
            if isinstance(response, BaseException):
                raise response
            vector = _shortened(embedding_vector(response), dimensions)
            data.append({"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)})
        return data
    finally:
        for response in responses:
            if not isinstance(response, BaseException):
                response.release()


async def embeddings(core: FrontendCore, metrics: TokenMetrics, counter: TokenCounter, request: web.Request,
                     document: dict[str, Any]) -> web.Response:
    """Raises OpenAIError / ServerError (the first failed input's)."""
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a served model", "model")
    texts, encoding = embedding_inputs(document), _encoding(document)
    contract = embedding_contract(core, model)
    dimensions = _dimensions(document, contract)
    request[MODEL_KEY] = model
    request_id = request[REQUEST_ID_KEY] = documents.new_id("embd")
    failed = True
    try:
        calls = [core.infer(contract.request(text, f"{request_id}-{index}")) for index, text in enumerate(texts)]
        data = _data(await asyncio.gather(*calls, return_exceptions=True), encoding, dimensions)
        failed = False
    finally:
        metrics.request(model, "embeddings", failed)
    tokens = sum([await count_tokens(counter, text, special_tokens=True) for text in texts])
    return web.json_response({"object": "list", "data": data, "model": model,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
