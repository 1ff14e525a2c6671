"""Which client connection an HTTP request came from: `http_request_link` opens the `ClientLink`
(backend/client_link.py) of one request, so that a scheduler learns when that client is gone.

The link closes if the connection drops while the request is in flight: the connection's protocol
calls back from its `connection_lost` (`lost_callbacks`: the inference port's HttpConnection, and
the aiohttp listeners' TimedRequestHandler; a handler is not cancelled by either); a protocol
without that hook is polled, once someone watches the link.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

from pystub_backend.backend.client_link import ClientLink, as_current

__all__ = ["http_request_link", "HTTP_POLL_SECONDS"]

HTTP_POLL_SECONDS = 0.1


class LinkedRequest(Protocol):
    """What a request must show: its connection's transport (None once gone) and protocol."""

    @property
    def transport(self) -> asyncio.BaseTransport | None: ...

    @property
    def protocol(self) -> object: ...


@contextlib.contextmanager
def http_request_link(request: LinkedRequest, poll_seconds: float = HTTP_POLL_SECONDS) -> Iterator[ClientLink]:
    """A link for one request, current in the block: closed if its connection drops before the
    block ends, detached when the block ends."""
    poller: list[asyncio.Task[None]] = []

    async def poll() -> None:
        while request.transport is not None:
            await asyncio.sleep(poll_seconds)
        link.close()

    hooks: dict[object, Callable[[], None]] | None = getattr(request.protocol, "lost_callbacks", None)
    if hooks is not None:
        link = ClientLink()
        hooks[link] = link.close
        if request.transport is None:  # gone already
            link.close()
    else:
        link = ClientLink(on_first_watch=lambda: poller.append(asyncio.ensure_future(poll())))
    with as_current(link):
        try:
            yield link
        finally:
            if hooks is not None:
                hooks.pop(link, None)
            for task in poller:
                task.cancel()
            link.detach()
