"""Which client connection an HTTP request came from: `with http_request_link(request) as link:`
opens the `ClientLink` (backend/client_link.py) of one request, current in the running task, so
that a scheduler learns when that client is gone.

The link closes if the connection drops while the block runs: the connection's protocol calls back
from its `connection_lost` (`lost_callbacks`: the inference port's HttpConnection, and the aiohttp
listeners' TimedRequestHandler; neither cancels a handler by itself); a protocol without that hook
is polled, once someone watches the link. When the block ends the link is detached (the request
ended normally: its watchers are dropped unheard).

A class, not a generator context manager: it runs on every inference, and contextlib's machinery
cost 5 us of it (the link stays current after the block: each request has its own task).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol

from pystub_backend.backend.client_link import ClientLink, open_link

__all__ = ["http_request_link", "HTTP_POLL_SECONDS"]

HTTP_POLL_SECONDS = 0.1


class LinkedRequest(Protocol):
    """What a request must show: its connection's transport (None once gone) and protocol."""

    @property
    def transport(self) -> asyncio.BaseTransport | None: ...

    @property
    def protocol(self) -> object: ...


class http_request_link:  # noqa: N801 - used as the context manager function it replaced
    """The link of one request for the `with` block (see the module docstring)."""

    __slots__ = ("_request", "_poll_seconds", "_hooks", "_link", "_poller")

    def __init__(self, request: LinkedRequest, poll_seconds: float = HTTP_POLL_SECONDS) -> None:
        self._request = request
        self._poll_seconds = poll_seconds
        self._poller: asyncio.Task[None] | None = None

    def __enter__(self) -> ClientLink:
        request = self._request
        hooks: dict[object, object] | None = getattr(request.protocol, "lost_callbacks", None)
        self._hooks = hooks
        if hooks is None:
            link = self._link = open_link(on_first_watch=self._start_polling)
            return link
        link = self._link = open_link()
        hooks[link] = link.close
        if request.transport is None:  # gone already
            link.close()
        return link

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._hooks is not None:
            self._hooks.pop(self._link, None)
        if self._poller is not None:
            self._poller.cancel()
        self._link.detach()

    def _start_polling(self) -> None:
        self._poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while self._request.transport is not None:
            await asyncio.sleep(self._poll_seconds)
        self._link.close()
