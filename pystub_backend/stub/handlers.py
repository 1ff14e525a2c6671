"""Frame handlers that features add to the stub (BLS responses, metrics acks, sequence eviction...).

`@on_receiver(MessageClass)` registers `handler(stub, message)` to run on the receiver thread, at
once, even while `execute` runs (it must not block: hand long work to a thread);
`@on_main(MessageClass)` registers one to run on the main thread, in order with EXECUTE frames.
`@on_phase(phase)` registers `hook(stub)` to run on the main thread when the stub enters a phase:
"initializing" (before the model's `initialize`), "ready" (after it succeeded), "finalizing"
(before `finalize`); features install and remove their pb_utils hooks there.
`@before_send` registers `hook(stub, message)` to run on the sending thread just before each frame
the stub sends (it may send frames of its own first, e.g. buffered metric changes, so that they
reach the backend before the response that follows them; it must be fast when it has nothing to do).
Register in a module that `pystub_backend.stub.features.install` imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["on_receiver", "on_main", "receiver_handler", "main_handler", "on_phase", "notify_phase", "PHASES",
           "before_send", "send_hooks"]

Handler = Callable[[Any, Any], None]
_RECEIVER: dict[type, Handler] = {}
_MAIN: dict[type, Handler] = {}
PHASES = ("initializing", "ready", "finalizing")
_PHASE_HOOKS: dict[str, list[Callable[[Any], None]]] = {phase: [] for phase in PHASES}
_SEND_HOOKS: list[Handler] = []


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


def on_phase(phase: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register `hook(stub)` for a phase of `PHASES`. Raises ValueError for an unknown phase."""
    if phase not in _PHASE_HOOKS:
        raise ValueError(f"unknown stub phase {phase!r}; expected one of {PHASES}")

    def register(hook: Callable[[Any], None]) -> Callable[[Any], None]:
        _PHASE_HOOKS[phase].append(hook)
        return hook
    return register


def notify_phase(stub: Any, phase: str) -> None:
    """Run the hooks of `phase` in registration order (main thread). A failing hook is logged and
    does not stop the others or the stub."""
    for hook in _PHASE_HOOKS[phase]:
        try:
            hook(stub)
        except Exception as exc:  # noqa: BLE001 - a feature's bug must not take the stub down
            stub.log_error(f"stub phase hook {getattr(hook, '__qualname__', hook)} ({phase}) failed: "
                           f"{type(exc).__name__}: {exc}")


def before_send(hook: Handler) -> Handler:
    """Register `hook(stub, message)` to run before each frame the stub sends (any thread)."""
    _SEND_HOOKS.append(hook)
    return hook


def send_hooks() -> list[Handler]:
    """The registered before-send hooks (the stub reads this list once, at start)."""
    return _SEND_HOOKS
