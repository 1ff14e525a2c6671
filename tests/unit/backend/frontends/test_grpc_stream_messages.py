"""The stream messages of a decoupled request's responses: built from one template per request,
they must equal the messages built field by field, whatever changes between responses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pystub_backend.backend.frontends.grpc import stream
from pystub_backend.backend.inference import InferResponse, Tensor
from pystub_backend.backend.response_stream import ResponseStream


def _response(values: list[float], *, request_id: str = "7", name: str = "OUTPUT0",
              parameters: dict | None = None, tensor_parameters: dict | None = None) -> InferResponse:
    data = memoryview(np.asarray(values, dtype=np.float32).tobytes())
    tensor = Tensor(name, "FP32", (len(values),), data, tensor_parameters or {})
    return InferResponse("stream_fp32", "1", request_id, [tensor], parameters or {})


@pytest.mark.parametrize("final", [False, True])
def test_template_messages_equal_the_field_by_field_ones(final: bool) -> None:
    messages = stream._Messages()
    for index in range(3):
        response = _response([index] * 4)
        built = messages.message(response, final)
        assert built == stream._message(response, final)
        assert np.frombuffer(built.infer_response.raw_output_contents[0], np.float32).tolist() == [index] * 4


def test_a_response_that_differs_from_the_last_gets_its_own_message() -> None:
    messages = stream._Messages()
    variants = [_response([1.0, 2.0]), _response([1.0, 2.0, 3.0]), _response([4.0], name="OTHER"),
                _response([5.0], request_id="8"), _response([6.0], parameters={"token": "x"}),
                _response([7.0], tensor_parameters={"note": 1}), _response([8.0, 9.0])]
    for final in (False, True, False):
        for response in variants:
            assert messages.message(response, final) == stream._message(response, final)


def test_take_ready_hands_over_what_is_queued_in_order_and_keeps_the_end() -> None:
    async def scenario() -> list[list[int]]:
        responses = ResponseStream("r", "m", lambda: None)
        for index in range(3):
            responses.put(_response([index]), final=False)
        first = await responses.next()
        assert first is not None
        batches = [[int(np.frombuffer(r.outputs[0].data, np.float32)[0]) for r in [first, *responses.take_ready()]]]
        responses.put(_response([3]), final=True)
        batches.append([int(np.frombuffer(r.outputs[0].data, np.float32)[0]) for r in responses.take_ready()])
        assert responses.take_ready() == []
        assert await responses.next() is None  # the final one was handed over: the stream has ended
        return batches

    assert asyncio.run(scenario()) == [[0, 1, 2], [3]]


def test_write_queue_bounds_its_items_and_wakes_a_waiting_producer() -> None:
    async def scenario() -> None:
        queue = stream._WriteQueue()
        for index in range(stream._OUT_QUEUE):
            await queue.put(index, 1)
        blocked = asyncio.ensure_future(queue.put("late", 1))
        await asyncio.sleep(0)
        assert not blocked.done()  # full: the producer waits for the writer
        assert await queue.get() == 0
        await asyncio.wait_for(blocked, timeout=10)
        taken = [await queue.get() for _ in range(stream._OUT_QUEUE)]
        assert taken == [*range(1, stream._OUT_QUEUE), "late"]
        huge = stream.STREAM_WINDOW_BYTES * 2
        await asyncio.wait_for(queue.put("big", huge), timeout=10)  # an empty queue takes one of any size
        assert await queue.get() == "big"

    asyncio.run(scenario())


def test_a_producer_cancelled_after_its_wakeup_passes_it_on() -> None:
    async def scenario() -> None:
        queue = stream._WriteQueue()
        for index in range(stream._OUT_QUEUE):
            await queue.put(index, 1)
        first = asyncio.ensure_future(queue.put("first", 1))
        second = asyncio.ensure_future(queue.put("second", 1))
        await asyncio.sleep(0)
        assert await queue.get() == 0  # room for one: the first producer is woken ...
        first.cancel()  # ... and leaves before it runs: the second must not wait forever
        await asyncio.wait_for(second, timeout=10)
        assert first.cancelled()
        assert [await queue.get() for _ in range(stream._OUT_QUEUE)] == [*range(1, stream._OUT_QUEUE), "second"]

    asyncio.run(scenario())
