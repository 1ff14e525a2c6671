"""Which client connection a request came from, so that a scheduler learns when that client is gone.

A frontend opens a link where a client's connection has a life of its own, and sets it as the
current link of the task serving it (a context variable: tasks that task starts inherit it):

    gRPC ModelStreamInfer   one link per stream; closed when the stream ends (the client closed it,
                            cancelled it, or its connection dropped)
    HTTP /infer,            one link per request; closed if the connection drops while the
    generate_stream         request is in flight (frontends/http/request_link.py)

A scheduler reads `current()` while admitting a request and `watch`es the link; `close()` runs the
watchers' callbacks once, on the event loop. `detach()` drops them silently (the request ended
normally; the client may come back on another connection). The sequence batcher uses this to evict
a sequence whose client went away without sending END.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Hashable
from typing import Protocol

__all__ = ["ClientLink", "Link", "CURRENT", "current", "open_link", "cancel_when_gone"]

log = logging.getLogger("pystub.scheduler")

class Link(Protocol):
    """What a scheduler may do with a client's link: be told when the client goes. `ClientLink`
    is one; the HTTP port's requests are their own (frontends/http/messages.py)."""

    closed: bool

    def watch(self, key: Hashable, callback: Callable[[], object]) -> None:
        """Call `callback()` when the client goes away (now, if it already has)."""

    def unwatch(self, key: Hashable) -> None: ...


# The link of the request the running task serves; a frontend sets it (`open_link`, or `.set` of
# a link of its own).
CURRENT: contextvars.ContextVar[Link | None] = contextvars.ContextVar("pystub_client_link", default=None)


class ClientLink:
    def __init__(self, on_first_watch: Callable[[], None] | None = None) -> None:
        self._watchers: dict[Hashable, Callable[[], object]] = {}
        self._on_first_watch = on_first_watch
        self.closed = False

    def watch(self, key: Hashable, callback: Callable[[], object]) -> None:
        """Call `callback()` when the client goes away (now, if it already has)."""
        if self.closed:
            callback()
            return
        self._watchers[key] = callback
        if self._on_first_watch is not None:
            start, self._on_first_watch = self._on_first_watch, None
            start()

    def unwatch(self, key: Hashable) -> None:
        self._watchers.pop(key, None)

    def close(self) -> None:
        """The client is gone: run every watcher's callback once."""
        if self.closed:
            return
        self.closed = True
        watchers, self._watchers = self._watchers, {}
        for callback in watchers.values():
            try:
                callback()
            except Exception:  # one watcher's bug must not keep the others from hearing it
                log.exception("a client-link watcher failed")

    def detach(self) -> None:
        """The link's work ended normally: forget the watchers without calling them."""
        self._watchers.clear()
        self._on_first_watch = None


def current() -> Link | None:
    """The link of the client whose request the running task serves, if its frontend set one."""
    return CURRENT.get()


def open_link(on_first_watch: Callable[[], None] | None = None) -> ClientLink:
    """A new link, current for the rest of the running task and for the tasks it starts from now
    on. The caller closes it when the client is gone. (No context reset: an async generator may be
    finalized in another task, where a reset would fail; the task's context dies with it.)"""
    link = ClientLink(on_first_watch)
    CURRENT.set(link)
    return link


def cancel_when_gone(link: ClientLink) -> None:
    """Cancel the running task when `link`'s client goes (aiohttp leaves a handler running): what
    it awaits is cancelled with it, down to the model (is_cancelled())."""
    task = asyncio.current_task()
    if task is not None:
        link.watch(task, task.cancel)
