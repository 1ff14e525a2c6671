"""ResponseStream.answer: the one response of a default-mode request, whether its responses come
before or after the caller asks for it. A stub that died as a request was sent fails the stream
at once, before the scheduler attaches its answer: that error must reach the client, not an
empty success (the chaos soak saw gRPC clients get a response with no outputs)."""

from __future__ import annotations

import asyncio

import pytest

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferResponse, Tensor
from pystub_backend.backend.response_stream import ResponseStream
from pystub_backend.ipc.status import Status


class _Released:
    def __init__(self) -> None:
        self.names: list[str] = []

    def response(self, name: str) -> InferResponse:
        tensor = Tensor("OUTPUT0", "BYTES", (1,), name.encode())
        return InferResponse("m", "1", "id", [tensor], release=lambda: self.names.append(name))


def _answered(stream: ResponseStream) -> asyncio.Future[InferResponse]:
    future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
    stream.answer(future)
    return future


def _stream() -> ResponseStream:
    return ResponseStream("id", "m", lambda: None)


def test_a_failure_before_the_answer_is_asked_for_raises_it() -> None:
    async def scenario() -> None:
        stream = _stream()
        stream.fail(ServerError("Stub process 'm_0' is not healthy.", Status.UNAVAILABLE))
        future = _answered(stream)
        with pytest.raises(ServerError, match="not healthy"):
            await asyncio.wait_for(future, 5)

    asyncio.run(scenario())


def test_responses_before_the_answer_is_asked_for_keep_the_first() -> None:
    async def scenario() -> None:
        released = _Released()
        stream = _stream()
        stream.put(released.response("first"), False)
        stream.put(released.response("second"), True)
        answer = await asyncio.wait_for(_answered(stream), 5)
        assert answer.outputs[0].data == b"first"
        assert released.names == ["second"]  # the extra one is given back, the answer is not

    asyncio.run(scenario())


def test_responses_after_the_answer_is_asked_for_keep_the_first() -> None:
    async def scenario() -> None:
        released = _Released()
        stream = _stream()
        future = _answered(stream)
        stream.put(released.response("first"), False)
        stream.put(released.response("second"), True)
        answer = await asyncio.wait_for(future, 5)
        assert answer.outputs[0].data == b"first" and released.names == ["second"]

    asyncio.run(scenario())


def test_an_error_after_a_response_still_answers_with_the_response() -> None:
    async def scenario() -> None:
        released = _Released()
        stream = _stream()
        stream.put(released.response("first"), False)
        stream.fail(ServerError("gone", Status.UNAVAILABLE))
        answer = await asyncio.wait_for(_answered(stream), 5)
        assert answer.outputs[0].data == b"first" and released.names == []

    asyncio.run(scenario())
