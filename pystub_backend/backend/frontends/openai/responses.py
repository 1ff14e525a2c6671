"""The responses of a request's choices (one model request each), in the order they arrive.

    next()    (choice, response), (choice, None) once that choice's stream has ended, and None
              once every stream has
    end(i)    stop reading choice i (the server cut its text at a stop string and cancelled it)
    close()   stop reading them all; what was read and not taken is released

One choice reads its stream directly; several are read by a task each into one queue.
"""

from __future__ import annotations

import asyncio

from pystub_backend.backend.inference import InferResponse
from pystub_backend.backend.response_stream import ResponseStream

__all__ = ["ChoiceResponses"]

_Item = tuple[int, InferResponse | None]


class ChoiceResponses:
    def __init__(self, streams: list[ResponseStream]) -> None:
        self._streams = streams
        self._open = set(range(len(streams)))
        self._queue: asyncio.Queue[_Item] | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        if len(streams) > 1:
            self._queue = asyncio.Queue()
            self._tasks = {index: asyncio.ensure_future(self._pump(index, stream))
                           for index, stream in enumerate(streams)}

    async def _pump(self, index: int, stream: ResponseStream) -> None:
        assert self._queue is not None
        while (response := await stream.next()) is not None:
            self._queue.put_nowait((index, response))
        self._queue.put_nowait((index, None))

    async def next(self) -> _Item | None:
        while self._open:
            if self._queue is None:
                item: _Item = (0, await self._streams[0].next())
            else:
                item = await self._queue.get()
            index, response = item
            if index not in self._open:  # an ended choice's late response
                if response is not None:
                    response.release()
                continue
            if response is None:
                self._open.discard(index)
            return item
        return None

    def end(self, index: int) -> None:
        self._open.discard(index)
        task = self._tasks.pop(index, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        self._open.clear()
        while self._queue is not None and not self._queue.empty():
            _, response = self._queue.get_nowait()
            if response is not None:
                response.release()
