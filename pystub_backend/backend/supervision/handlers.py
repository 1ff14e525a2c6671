"""The table of frame handlers that backend features add for every stub (BLS, metrics, sequences...).

    features/install.install_features(handlers)   calls each feature module's `register(handlers)`
    feature.register(handlers)                     handlers.on_frame(MessageClass, handler)
    supervision.frames.FrameLink                   frames it does not handle itself →
                                                   handlers.frame_handler(kind)

The stub side is built the same way (pystub_backend.stub.handlers.StubHandlers, filled by
pystub_backend.stub.features.install_features).

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

__all__ = ["Handler", "BackendHandlers"]

# The message is the decoded NamedTuple of the registered class; each handler annotates its own.
Handler = Callable[["StubProcess", Any], None]


class BackendHandlers:
    """Message class → handler. Built once per server (features.install), read by every stub."""

    def __init__(self) -> None:
        self._handlers: dict[type, Handler] = {}

    def on_frame(self, kind: type, handler: Handler) -> None:
        """Handle frames of `kind` with `handler`. Raises ValueError when `kind` has one already."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler: {self._handlers[kind].__qualname__}")
        self._handlers[kind] = handler

    def frame_handler(self, kind: type) -> Handler | None:
        return self._handlers.get(kind)

    def handled_kinds(self) -> set[type]:
        """Every message class some feature handles."""
        return set(self._handlers)
