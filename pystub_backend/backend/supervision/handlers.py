"""The table of frame handlers that backend features add for every stub (BLS, metrics, sequences...).

    features/install.install_features(handlers)   calls each feature module's `register(handlers)`
    feature.register(handlers)                     handlers.on_frame(MessageClass, handler)
    supervision.frames.FrameLink                   frames it does not handle itself →
                                                   handlers.frame_handler(kind)

The stub side is built the same way (pystub_backend.stub.handlers.StubHandlers, filled by
pystub_backend.stub.features.install_features).

A handler is `handler(stub, message)`; it runs on the event loop and must not block. `message` is of
the class it was registered for (a member of pystub_backend.ipc.messages.to_backend.ToBackend; mypy
checks each `on_frame` call); `stub` is the `StubProcess` that sent the frame; `stub.services`
(supervision.services.StubServices) names what the rest of the server a handler may use.
Registration is an explicit call made where the table is built, never an import side effect, so a
reader finds every handler from `install_features`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from pystub_backend.ipc.messages.to_backend import ToBackend

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["Handler", "BackendHandlers"]

_Message = TypeVar("_Message", bound=ToBackend)

# A handler of one message class: `Handler[MultiplexLoaded]` takes (stub, MultiplexLoaded).
Handler = Callable[["StubProcess", _Message], None]


class BackendHandlers:
    """Message class → handler. Built once per server (features.install), read by every stub."""

    def __init__(self) -> None:
        # Each handler is stored under the class it takes and only called with messages of that
        # class (`frame_handler(type(message))`), so the table may forget which class that was.
        self._handlers: dict[type, Handler[ToBackend]] = {}

    def on_frame(self, kind: type[_Message], handler: Handler[_Message]) -> None:
        """Handle frames of `kind` with `handler`. Raises ValueError when `kind` has one already."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler: {self._handlers[kind].__qualname__}")
        self._handlers[kind] = cast("Handler[ToBackend]", handler)

    def frame_handler(self, kind: type[ToBackend]) -> Handler[ToBackend] | None:
        return self._handlers.get(kind)

    def handled_kinds(self) -> set[type]:
        """Every message class some feature handles."""
        return set(self._handlers)
