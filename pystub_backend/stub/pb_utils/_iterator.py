"""`ResponseIterator`: the responses of a decoupled BLS request (docs/reference/model-api.md#responseiterator).

The stub supplies `receive`, which blocks until the next response arrives and tells whether it
was the final one, and `cancel`. Iterating after the end replays the cached responses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._response import InferenceResponse

__all__ = ["ResponseIterator"]

Receive = Callable[[], "tuple[InferenceResponse, bool]"]


class ResponseIterator:
    """Yields responses until the one flagged final (which is yielded too and may be empty)."""

    def __init__(self, receive: Receive, cancel: Callable[[], None] | None = None) -> None:
        self._receive = receive
        self._cancel = cancel
        self._responses: list[InferenceResponse] = []
        self._finished = False
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[InferenceResponse]:
        if self._finished:
            return iter(list(self._responses))
        return self

    def __next__(self) -> InferenceResponse:
        """The next response; blocks until it arrives. Raises StopIteration after the final one."""
        with self._lock:
            if self._finished:
                raise StopIteration
            response, is_final = self._receive()
            self._responses.append(response)
            self._finished = bool(is_final)
            return response

    def cancel(self) -> None:
        """Ask the server to cancel the in-flight request; no-op once the final response came."""
        if not self._finished and self._cancel is not None:
            self._cancel()
