"""Frame handlers that features add to the stub (BLS responses, metrics acks, sequence eviction...).

`@on_receiver(MessageClass)` registers `handler(stub, message)` to run on the receiver thread, at
once, even while `execute` runs (it must not block: hand long work to a thread);
`@on_main(MessageClass)` registers one to run on the main thread, in order with EXECUTE frames.
Register in a module that `pystub.features` imports.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["on_receiver", "on_main", "receiver_handler", "main_handler"]

Handler = Callable[[Any, Any], None]
_RECEIVER: dict[type, Handler] = {}
_MAIN: dict[type, Handler] = {}


def _register(table: dict[type, Handler], kind: type) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        if kind in _RECEIVER or kind in _MAIN:
            raise ValueError(f"{kind.__name__} already has a stub handler")
        table[kind] = handler
        return handler
    return register


def on_receiver(kind: type) -> Callable[[Handler], Handler]:
    return _register(_RECEIVER, kind)


def on_main(kind: type) -> Callable[[Handler], Handler]:
    return _register(_MAIN, kind)


def receiver_handler(kind: type) -> Handler | None:
    return _RECEIVER.get(kind)


def main_handler(kind: type) -> Handler | None:
    return _MAIN.get(kind)
