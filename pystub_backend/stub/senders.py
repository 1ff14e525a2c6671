"""The stub's side of each request in flight: its response sender, its cancellation flag, and its
send window.

Flow control: a request may have at most `CREDIT_WINDOW` data responses the backend has not yet
released, and may start no new one while `WINDOW_BYTES` of output bytes or more are unreleased (so
one response of any size always goes: the bound is WINDOW_BYTES plus one response). The backend
returns one credit per response it releases, and releases a response only once its client's
connection has taken it (the frontends' stream windows). A sender whose window is full waits up to
the send timeout and then fails with a clear error, so a model producing faster than its client
reads cannot grow anyone's memory without bound.

Cancellation: the backend pushes CANCEL frames; `is_cancelled()` reads the flag (no round trip).
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable
from typing import Any

from pystub_backend.ipc.arena import ArenaWriter
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.records import WireRequest, WireResponse, error_to_wire
from pystub_backend.ipc.status import Status
from pystub_backend.ipc.tensors import wire_nbytes
from pystub_backend.stub import pb_utils
from pystub_backend.stub.translate import response_to_wire

__all__ = ["RequestState", "RequestRegistry", "SendWindow", "CREDIT_WINDOW", "WINDOW_BYTES"]

CREDIT_WINDOW = 64  # the backend's ResponseStream uses the same number
WINDOW_BYTES = 256 << 10  # unreleased output bytes after which a request's sender waits
_FINAL = msg.RESPONSE_FINAL


class SendWindow:
    """The unreleased data responses of one request: their sizes, oldest first. A credit from the
    backend retires the oldest (responses of one request are released in the order sent; if one
    is not, the sum still returns to zero once all are)."""

    __slots__ = ("_changed", "_sizes", "_bytes", "_wide")

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._sizes: collections.deque[int] = collections.deque()
        self._bytes = 0
        self._wide = False  # cancelled: nothing the sender sends is kept any more, never wait

    def _has_room(self) -> bool:
        return self._wide or (len(self._sizes) < CREDIT_WINDOW and self._bytes < WINDOW_BYTES)

    def has_room(self) -> bool:
        with self._changed:
            return self._has_room()

    def wait_room(self, timeout: float) -> bool:
        """Whether the window has room for one more response within `timeout` s."""
        with self._changed:
            return self._changed.wait_for(self._has_room, timeout)

    def sent(self, nbytes: int) -> None:
        with self._changed:
            self._sizes.append(nbytes)
            self._bytes += nbytes

    def credit(self) -> None:
        with self._changed:
            if self._sizes:
                self._bytes -= self._sizes.popleft()
            self._changed.notify_all()

    def open_wide(self) -> None:
        with self._changed:
            self._wide = True
            self._changed.notify_all()

    @property
    def unreleased(self) -> tuple[int, int]:
        """(responses, bytes) sent and not yet released by the backend."""
        with self._changed:
            return len(self._sizes), self._bytes


class RequestState:
    """One request in flight; also its request's `SenderSource` (pb_utils asks it for the sender
    when the model first wants one). Slotted, and weakly referable (client_shm ties a request's
    output regions to it)."""

    __slots__ = ("rid", "requested", "registry", "final", "cancelled", "credits", "response_sender",
                 "__weakref__")

    def __init__(self, rid: int, requested: set[str], registry: RequestRegistry | None = None,
                 final: bool = False) -> None:
        self.rid = rid
        self.requested = requested
        self.registry = registry
        self.final = final
        self.cancelled = False
        # Made on first use (RequestRegistry.window_of): only a model that sends through the sender
        # (decoupled, or answering early) uses one; a window per request cost the rest ~2-3 us.
        self.credits: SendWindow | None = None
        # Made on first use too (RequestRegistry.sender_of): the closure, the sender and its weakref
        # finalizer cost ~5 us, and a model that returns its responses never asks for the sender.
        # Weak: the request holds its sender, whose finalizer must run when the request is dropped.
        self.response_sender: weakref.ref[Any] | None = None

    def sender(self) -> Any:
        assert self.registry is not None
        return self.registry.sender_of(self)

    def is_cancelled(self) -> bool:
        return self.cancelled


class RequestRegistry:
    def __init__(self, instance: str, send: Callable[[Any], None], writer: ArenaWriter,
                 decoupled: Callable[[], bool], send_timeout: float,
                 need_reader: Callable[[], None] = lambda: None) -> None:
        self._instance = instance
        self._send = send
        self._writer = writer
        self._decoupled = decoupled
        self._send_timeout = send_timeout
        self._need_reader = need_reader  # credits arrive in RELEASE frames: someone must read them
        self._states: dict[int, RequestState] = {}
        self._lock = threading.Lock()

    # -- frames from the backend (receiver thread) ------------------------------------------------
    def on_credits(self, rids: list[int]) -> None:
        with self._lock:
            windows = [self._window_locked(state) for rid in rids if (state := self._states.get(rid))]
        for window in windows:
            window.credit()

    def on_cancel(self, rids: list[int]) -> None:
        with self._lock:
            for rid in rids:
                state = self._states.get(rid)
                if state is not None:
                    state.cancelled = True
                    self._window_locked(state).open_wide()  # a sender waiting for room must not wait any more

    def window_of(self, state: RequestState) -> SendWindow:
        """The request's send window, made on first use."""
        with self._lock:
            return self._window_locked(state)

    @staticmethod
    def _window_locked(state: RequestState) -> SendWindow:
        if state.credits is None:
            state.credits = SendWindow()
        return state.credits

    # -- requests ------------------------------------------------------------------------------------
    def open(self, wire: WireRequest) -> RequestState:
        """The state of a request that arrived; its sender is made when first asked for (`sender_of`)."""
        state = RequestState(wire.rid, set(wire.requested_outputs), self)
        with self._lock:
            self._states[state.rid] = state
        return state

    def sender_of(self, state: RequestState) -> Any:
        """The request's one sender, made on the first call (from any thread)."""
        with self._lock:
            sender = state.response_sender() if state.response_sender is not None else None
            if sender is None:
                sender = self._make_sender(state)
                state.response_sender = weakref.ref(sender)
            return sender

    def _make_sender(self, state: RequestState) -> Any:
        def send(response: Any, flags: int) -> None:
            self._send_response(state, response, flags)

        sender = pb_utils.InferenceResponseSender(send, lambda: state.cancelled, decoupled=self._decoupled())
        # pystub goes further than Triton (docs/reference/model-api.md#decoupled-mode-and-senders): a sender dropped
        # before FINAL fails its request instead of leaving the client waiting forever.
        weakref.finalize(sender, self._sender_dropped, state).atexit = False
        return sender

    def _send_response(self, state: RequestState, response: Any, flags: int) -> None:
        if state.final:  # failed on the model's behalf (stalled client), or already answered
            raise pb_utils.TritonModelException("Unable to send response. Response sender has been closed.")
        carries_data = response is not None and not response.has_error() and not state.cancelled
        if carries_data and not self._wait_room(state):
            if state.cancelled:  # the client left while we waited: Triton's words for a gone client
                raise pb_utils.TritonModelException("Unable to send response. Response sender has been closed.")
            count, nbytes = self.window_of(state).unreleased
            text = (f"Unable to send response: the client has not read the last {count} responses ({nbytes} "
                    f"bytes) of this request for {self._send_timeout:g} s.")
            self._fail(state, text)  # the client learns why, whatever the model does next
            raise pb_utils.TritonModelException(text)
        wire = response_to_wire(state.rid, response, flags, state.requested, self._writer)
        if carries_data and not flags & _FINAL:  # the backend credits data responses but the final one
            self.window_of(state).sent(sum(wire_nbytes(tensor) for tensor in wire.outputs))
        self._send(msg.Response(wire))
        if flags & _FINAL:
            self.close(state)

    def _wait_room(self, state: RequestState) -> bool:
        window = self.window_of(state)
        if window.has_room():
            return True
        self._need_reader()
        return window.wait_room(self._send_timeout)

    def close(self, state: RequestState) -> None:
        """The request got its final response (sent, returned, or failed by the batch)."""
        state.final = True
        with self._lock:
            self._states.pop(state.rid, None)

    def _sender_dropped(self, state: RequestState) -> None:
        if not state.final:
            self._fail(state, f"Response sender of model '{self._instance}' was destroyed before it sent the "
                              f"final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL).")

    def _fail(self, state: RequestState, text: str) -> None:
        """End the request with an INTERNAL error response carrying `text`."""
        self.close(state)
        try:
            self._send(msg.Response(WireResponse(state.rid, _FINAL, error_to_wire(Status.INTERNAL, text), [], "{}")))
        except OSError:
            pass
