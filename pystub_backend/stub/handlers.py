"""The table of frame handlers and hooks that features add to the stub (BLS responses, metrics
acks, sequence eviction...), filled explicitly, never by import side effect.

The stub builds one `StubHandlers` and passes it to `pystub_backend.stub.features.install_features`,
which calls each feature module's `register(handlers)`. A feature registers:

    handlers.on_receiver(Kind, handler)  `handler(stub, message)` runs on the receiver thread, at
                                         once, even while `execute` runs (it must not block: hand
                                         long work to a thread)
    handlers.on_main(Kind, handler)      runs on the main thread, in order with EXECUTE frames
    handlers.on_phase(phase, hook)       `hook(stub)` runs on the main thread when the stub enters a
                                         phase: "initializing" (before the model's `initialize`),
                                         "ready" (after it succeeded), "finalizing" (before
                                         `finalize`); features install and remove pb_utils hooks there.
                                         A shared-weights template adds "forking" (stop the threads
                                         a feature started: it forks only with one thread) and its
                                         children "forked" (forget what was bound to the template's
                                         stub, before the child's own "initializing")
    handlers.awaits_reply(Kind)          a frame of `Kind` the stub sends is answered by a frame
                                         that some thread waits for (BLS, metric queries...): when
                                         it goes out, a thread must read the channel (stub/reader.py)
    handlers.before_send(hook)           `hook(stub, message)` runs on the sending thread just before
                                         each frame the stub sends (it may send frames of its own
                                         first, e.g. buffered metric changes, so that they reach the
                                         backend before the response that follows them; it must be
                                         fast when it has nothing to do)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["StubHandlers", "Handler", "PhaseHook", "PHASES"]

# The first argument is the stub (stub/stub.py's Stub): features receive it as Any, because the stub
# installs them and a feature naming its type would make the two import each other.
Handler = Callable[[Any, Any], None]
PhaseHook = Callable[[Any], None]
PHASES = ("initializing", "ready", "finalizing", "forking", "forked")


class StubHandlers:
    """What features hook into one stub: frame handlers by message class, phase hooks, send hooks."""

    def __init__(self) -> None:
        self._receiver: dict[type, Handler] = {}
        self._main: dict[type, Handler] = {}
        self._phase_hooks: dict[str, list[PhaseHook]] = {phase: [] for phase in PHASES}
        self._send_hooks: list[Handler] = []
        self._reply_kinds: set[type] = set()

    # -- registration (features' `register(handlers)`) ---------------------------------------------
    def on_receiver(self, kind: type, handler: Handler) -> None:
        """Handle `kind` on the receiver thread. Raises ValueError when `kind` has a handler."""
        self._add(self._receiver, kind, handler)

    def on_main(self, kind: type, handler: Handler) -> None:
        """Handle `kind` on the main thread. Raises ValueError when `kind` has a handler."""
        self._add(self._main, kind, handler)

    def on_phase(self, phase: str, hook: PhaseHook) -> None:
        """Run `hook(stub)` when the stub enters `phase`. Raises ValueError for an unknown phase."""
        if phase not in self._phase_hooks:
            raise ValueError(f"unknown stub phase {phase!r}; expected one of {PHASES}")
        self._phase_hooks[phase].append(hook)

    def awaits_reply(self, kind: type) -> None:
        """Frames of `kind` that the stub sends are answered by a frame some thread waits for."""
        self._reply_kinds.add(kind)

    def before_send(self, hook: Handler) -> None:
        """Run `hook(stub, message)` before each frame the stub sends (any thread)."""
        self._send_hooks.append(hook)

    def _add(self, table: dict[type, Handler], kind: type, handler: Handler) -> None:
        if kind in self._receiver or kind in self._main:
            raise ValueError(f"{kind.__name__} already has a stub handler")
        table[kind] = handler

    # -- lookup (the stub) ---------------------------------------------------------------------------
    def receiver_handler(self, kind: type) -> Handler | None:
        return self._receiver.get(kind)

    def main_handler(self, kind: type) -> Handler | None:
        return self._main.get(kind)

    def handled_kinds(self) -> set[type]:
        """Every message class some feature handles."""
        return set(self._receiver) | set(self._main)

    def reply_kinds(self) -> frozenset[type]:
        """The kinds registered with `awaits_reply` (the stub reads them once, at start)."""
        return frozenset(self._reply_kinds)

    def send_hooks(self) -> tuple[Handler, ...]:
        """The before-send hooks in registration order (the stub reads them once, at start)."""
        return tuple(self._send_hooks)

    def notify_phase(self, stub: Any, phase: str) -> None:
        """Run the hooks of `phase` in registration order (main thread). A failing hook is logged
        and does not stop the others or the stub."""
        for hook in self._phase_hooks[phase]:
            try:
                hook(stub)
            except Exception as exc:  # noqa: BLE001 - a feature's bug must not take the stub down
                stub.log_error(f"stub phase hook {getattr(hook, '__qualname__', hook)} ({phase}) failed: "
                               f"{type(exc).__name__}: {exc}")
