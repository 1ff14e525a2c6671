"""The table of frame handlers that features add to a stub's exchange (BLS, metrics, sequences...).

    features/install.install_features(handlers)   calls each feature module's `register(handlers)`
    feature.register(handlers)                     handlers.add(MessageClass, handler)
    StubExchange                                   frames it does not handle itself → handlers.get

A handler is `handler(stub, message)`; it runs on the event loop and must not block. `stub` is the
`StubProcess` that sent the frame; `stub.services` (supervision.services.StubServices) names what
the rest of the server a handler may use. Registration is an explicit call made where the table is
built, never an import side effect, so a reader finds every handler from `install_features`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["FrameHandler", "FrameHandlers"]

# The message is the decoded NamedTuple of the registered class; each handler annotates its own.
FrameHandler = Callable[["StubProcess", Any], None]


class FrameHandlers:
    """Message class → handler. Built once per server (features.install), read by every stub."""

    def __init__(self) -> None:
        self._handlers: dict[type, FrameHandler] = {}

    def add(self, kind: type, handler: FrameHandler) -> None:
        """Handle frames of `kind` with `handler`. Raises ValueError when `kind` has one already."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler: {self._handlers[kind].__qualname__}")
        self._handlers[kind] = handler

    def get(self, kind: type) -> FrameHandler | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[type]:
        """Every message class with a handler, in registration order."""
        return list(self._handlers)
