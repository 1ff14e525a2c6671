"""Frame handlers that features add to every StubProcess (BLS, metrics, sequences, ...).

A feature registers `handler(stub, message)` for a message class with `@handles(MessageClass)`;
StubProcess dispatches frames it does not handle itself to these. Handlers run on the event loop
and must not block. `stub.context` is what the creator of the stub passed in (the server core),
so a handler can reach the rest of the server.

Register in a module that `pystub_backend.backend.features.install` imports, so the handler exists in every process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["handles", "handler_for", "FrameHandler"]

FrameHandler = Callable[[Any, Any], None]
_HANDLERS: dict[type, FrameHandler] = {}


def handles(kind: type) -> Callable[[FrameHandler], FrameHandler]:
    def register(handler: FrameHandler) -> FrameHandler:
        if kind in _HANDLERS:
            raise ValueError(f"{kind.__name__} already has a handler: {_HANDLERS[kind].__qualname__}")
        _HANDLERS[kind] = handler
        return handler
    return register


def handler_for(kind: type) -> FrameHandler | None:
    return _HANDLERS.get(kind)
