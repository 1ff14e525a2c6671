"""The servicer context of a call on the h2 stack: what pystub's servicers use of
`grpc.aio.ServicerContext` (metadata, peer, status and details, trailers, abort, deadline,
cancellation, done callbacks, and `write`/`read` for streams)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc.aio import AbortError

from pystub_backend.backend.frontends.grpc.h2.wire import Metadata

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.grpc.h2.call import ServerCall

__all__ = ["H2ServicerContext"]

_Serializer = Callable[[Any], bytes] | None
_Deserializer = Callable[[bytes], Any] | None


class H2ServicerContext:
    """One call's context. `code()` is None until a status is set (as grpc.aio's)."""

    __slots__ = ("_call", "_code", "_details", "_trailing", "_callbacks", "_serialize", "_deserialize")

    def __init__(self, call: ServerCall) -> None:
        self._call = call
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._trailing: Sequence[tuple[str, str | bytes]] = ()
        self._callbacks: list[Callable[[Any], None]] = []
        self._serialize: _Serializer = None
        self._deserialize: _Deserializer = None

    def bind(self, serialize: _Serializer, deserialize: _Deserializer) -> None:
        """The handler's message codecs, for `write` and `read`."""
        self._serialize, self._deserialize = serialize, deserialize

    # -- what the call carried -------------------------------------------------------------------
    def invocation_metadata(self) -> Metadata:
        return self._call.metadata

    def peer(self) -> str:
        return self._call.peer

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._call.finished

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    # -- the status --------------------------------------------------------------------------------
    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str | None:
        return self._details

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._trailing

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Sequence[tuple[str, str | bytes]] = ()) -> None:
        """End the call with `code`: raises AbortError, which the call turns into its status."""
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a status other than OK")
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise AbortError("abort() was called")

    def set_compression(self, compression: object) -> None:
        pass  # the listener's compression level decides, as for every call

    def disable_next_message_compression(self) -> None:
        pass

    # -- streams -----------------------------------------------------------------------------------
    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._call.send_headers(initial_metadata)

    async def write(self, message: Any) -> None:
        """Send one response message; waits while the client's window and our queue are full."""
        payload = message if self._serialize is None else self._serialize(message)
        await self._call.send_message(payload)

    async def read(self) -> Any:
        """The next request message of a streaming call (grpc.aio.EOF when the client is done)."""
        payload = await self._call.next_request()
        if payload is None:
            return grpc.aio.EOF
        return payload if self._deserialize is None else self._deserialize(payload)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    def run_done_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
