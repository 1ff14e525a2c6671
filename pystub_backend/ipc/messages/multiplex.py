"""Model multiplexing messages (kinds 50-59) and the rules for a multiplexed model id.

    backend -> stub                       stub -> backend
    ---------------                       ---------------
    MultiplexConfigure (cap)              MultiplexLoaded (id, seconds)
                                          MultiplexLoadFailed (id, seconds, error)
                                          MultiplexUnloaded (id, seconds)
                                          MultiplexUsage (hits, waits, recent ids)

The backend sends MultiplexConfigure to every new stub incarnation before its first EXECUTE, so
the sub-model cache exists before a request can ask for it. The stub reports every change of its
cache in the order the changes happened; the backend mirrors the set of ids each stub holds from
these frames (it routes by them) and keeps the counters and latencies.

The id travels as the request parameter `multiplexed_model_id` (HTTP, gRPC) or, over HTTP, as
the header `serve_multiplexed_model_id`. It is a non-empty string of at most 256 characters.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pystub_backend.ipc.wire import message

__all__ = [
    "MODEL_ID_PARAMETER",
    "MODEL_ID_HEADER",
    "MAX_MODEL_ID_LENGTH",
    "model_id_problem",
    "MultiplexConfigure",
    "MultiplexLoaded",
    "MultiplexLoadFailed",
    "MultiplexUnloaded",
    "MultiplexUsage",
]

MODEL_ID_PARAMETER = "multiplexed_model_id"
MODEL_ID_HEADER = "serve_multiplexed_model_id"
MAX_MODEL_ID_LENGTH = 256


def model_id_problem(value: Any) -> str | None:
    """Why `value` is not a valid multiplexed model id, or None when it is one."""
    if not isinstance(value, str):
        return f"'{MODEL_ID_PARAMETER}' must be a string, got {type(value).__name__}"
    if not value:
        return f"'{MODEL_ID_PARAMETER}' must not be empty"
    if len(value) > MAX_MODEL_ID_LENGTH:
        return f"'{MODEL_ID_PARAMETER}' must be at most {MAX_MODEL_ID_LENGTH} characters, got {len(value)}"
    return None


@message(50)
class MultiplexConfigure(NamedTuple):
    cap: int  # sub-models the instance may hold at once (MAX_MULTIPLEXED_MODELS)


@message(51)
class MultiplexLoaded(NamedTuple):
    model_id: str
    seconds: float  # how long `load_multiplexed` took


@message(52)
class MultiplexLoadFailed(NamedTuple):
    model_id: str
    seconds: float
    error: str


@message(53)
class MultiplexUnloaded(NamedTuple):
    model_id: str
    seconds: float  # how long `unload_multiplexed` took (0 when the model has none)


@message(54)
class MultiplexUsage(NamedTuple):
    hits: int  # lookups answered from the cache since the last report
    waits: int  # lookups that joined a load already in progress for their id
    recent: list[str]  # ids used since the last report, least recently used first
