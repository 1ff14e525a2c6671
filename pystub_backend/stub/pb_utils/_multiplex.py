"""Model multiplexing (pystub extension): the sub-model of a request, from the instance's cache.

    def load_multiplexed(self, model_id): return build(model_id)      # sync or async
    def execute(self, requests):
        sub_model = pb_utils.get_multiplexed_model(request)           # loads on a miss

The id is the request parameter `multiplexed_model_id` (HTTP also takes the header
`serve_multiplexed_model_id`); the cache lives in the stub (`pystub_backend.stub.features.multiplex`).
"""

from __future__ import annotations

import json
from typing import Any

from pystub_backend.ipc.messages.multiplex import MODEL_ID_PARAMETER, model_id_problem

from . import _runtime
from ._errors import TritonModelException

__all__ = ["get_multiplexed_model_id", "get_multiplexed_model", "async_get_multiplexed_model"]


def get_multiplexed_model_id(request: Any) -> str:
    """The request's `multiplexed_model_id` parameter, or "" when it has none."""
    try:
        parameters = json.loads(request.parameters() or "{}")
    except ValueError:
        return ""
    value = parameters.get(MODEL_ID_PARAMETER, "") if isinstance(parameters, dict) else ""
    return value if isinstance(value, str) else str(value)


def get_multiplexed_model(request_or_id: Any) -> Any:
    """The sub-model for a request (its `multiplexed_model_id`) or for an id string, loaded by the
    model's `load_multiplexed` on a miss. Blocks while the sub-model loads.

    Raises TritonModelException when multiplexing is not enabled (config parameter
    MAX_MULTIPLEXED_MODELS), the id is missing or invalid, or the load fails; and when called
    inside a coroutine (use `async_get_multiplexed_model` there).
    """
    return _cache().get(_model_id(request_or_id))


async def async_get_multiplexed_model(request_or_id: Any) -> Any:
    """`get_multiplexed_model` for an `async def execute`: other coroutines run while it loads.
    Raises like `get_multiplexed_model`."""
    return await _cache().async_get(_model_id(request_or_id))


def _cache() -> _runtime.Multiplexer:
    cache = _runtime.multiplexer()
    if cache is None:
        raise TritonModelException("model multiplexing is not enabled for this model: set the config "
                                   "parameter MAX_MULTIPLEXED_MODELS")
    return cache


def _model_id(request_or_id: Any) -> str:
    model_id = request_or_id if isinstance(request_or_id, str) else get_multiplexed_model_id(request_or_id)
    if not isinstance(request_or_id, str) and model_id == "":
        raise TritonModelException(f"the request has no '{MODEL_ID_PARAMETER}' parameter")
    problem = model_id_problem(model_id)
    if problem is not None:
        raise TritonModelException(problem)
    return model_id
