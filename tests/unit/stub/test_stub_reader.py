"""Who reads the stub's channel (pystub_backend/stub/reader.py): the main thread while idle, the
receiver while a handler runs long or a reply is awaited; reading goes back only to a main thread
that waits. Real threads; the last part drives a real stub through hand-overs under load."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
from model_stub import execute, model_stub

from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.stub.reader import ReadOwnership

_LONG = 30.0  # s: a poll or park this long would fail the test's bound if it were waited out


class Receiver:
    """A thread that waits for its turn to read, as the stub's receiver does."""

    def __init__(self, reading: ReadOwnership) -> None:
        self.turn = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(reading,), daemon=True)
        self.thread.start()

    def _run(self, reading: ReadOwnership) -> None:
        reading.wait_for_turn()
        self.turn.set()

    def took_over_within(self, seconds: float) -> bool:
        return self.turn.wait(seconds)

    def end(self, reading: ReadOwnership) -> None:
        """Let the thread take its turn (a busy main thread that wants a reader) and join it."""
        reading.handler_started()
        reading.need_reader()
        assert self.turn.wait(10.0), "the receiver did not take its turn"
        self.thread.join(10.0)


def test_an_idle_main_thread_keeps_reading() -> None:
    reading = ReadOwnership(poll=0.005)
    receiver = Receiver(reading)
    reading.need_reader()  # main is not busy: it reads itself, nobody needs to take over
    assert not receiver.took_over_within(0.3)
    assert reading.main_may_read()
    receiver.end(reading)


def test_a_long_handler_is_taken_over_after_two_polls() -> None:
    reading = ReadOwnership(poll=0.02)
    receiver = Receiver(reading)
    started = time.monotonic()
    reading.handler_started()
    assert receiver.took_over_within(10.0), "a handler that runs on was never taken over"
    assert time.monotonic() - started >= 0.02  # the same handler was seen at two polls
    assert not reading.main_may_read()  # the receiver reads now: main waits on its queue


def test_a_thread_awaiting_a_reply_gets_a_reader_at_once() -> None:
    reading = ReadOwnership(poll=_LONG)
    receiver = Receiver(reading)
    reading.handler_started()
    assert not receiver.took_over_within(0.2)  # polls are _LONG apart: no takeover yet
    reading.need_reader()  # e.g. a BLS request went out from inside execute
    assert receiver.took_over_within(10.0)


def test_a_reply_awaited_while_main_reads_gets_the_receiver_with_the_next_handler() -> None:
    reading = ReadOwnership(poll=_LONG)
    receiver = Receiver(reading)
    reading.need_reader()  # a model's own thread sent a BLS request while main reads: main reads the reply...
    assert not receiver.took_over_within(0.2)
    reading.handler_started()  # ...unless main starts a long handler first
    assert receiver.took_over_within(10.0)


def test_reading_goes_back_only_to_a_main_thread_that_waits() -> None:
    reading = ReadOwnership(poll=_LONG)
    receiver = Receiver(reading)
    reading.handler_started()
    reading.need_reader()
    assert receiver.took_over_within(10.0)
    assert not reading.give_back()  # main is busy
    reading.handler_finished()
    assert not reading.give_back()  # main has not asked for work yet
    assert not reading.main_may_read()  # now it waits on the queue...
    assert reading.give_back()  # ...so the receiver hands reading back
    assert reading.main_may_read()
    assert not reading.give_back()


def test_a_parked_receiver_is_woken_by_the_next_handler() -> None:
    reading = ReadOwnership(poll=0.01, idle_park=0.05, park_check=_LONG)
    receiver = Receiver(reading)
    time.sleep(0.3)  # no handler for longer than idle_park: the receiver parks for up to _LONG
    reading.handler_started()
    assert receiver.took_over_within(10.0), "the first handler after a quiet spell did not wake the receiver"


def test_a_handler_reading_for_its_reply_keeps_the_receiver_out() -> None:
    reading = ReadOwnership(poll=0.01)
    receiver = Receiver(reading)
    assert not reading.read_in_handler()  # no handler runs: main reads anyway
    reading.handler_started()
    assert reading.read_in_handler()  # a BLS call from execute: main reads its reply itself
    reading.need_reader()  # the same thread's request goes out: it needs no other reader
    assert not receiver.took_over_within(0.3)  # many polls: no takeover while the handler reads
    reading.stop_reading_in_handler()
    assert receiver.took_over_within(10.0)  # the handler runs on: taken over after two polls again


def test_a_reply_another_thread_awaits_while_the_handler_reads_gets_the_receiver_when_it_stops() -> None:
    reading = ReadOwnership(poll=_LONG)
    receiver = Receiver(reading)
    reading.handler_started()
    assert reading.read_in_handler()
    other = threading.Thread(target=reading.need_reader)  # e.g. a model's own thread sent a BLS request
    other.start()
    other.join(10.0)
    assert not receiver.took_over_within(0.2)  # the handler reads every frame meanwhile
    reading.stop_reading_in_handler()
    assert receiver.took_over_within(10.0)  # at once, not after a _LONG poll
    assert not reading.read_in_handler()  # the receiver reads now


def test_a_handler_does_not_read_for_itself_while_another_thread_awaits_a_frame() -> None:
    reading = ReadOwnership(poll=_LONG)
    receiver = Receiver(reading)
    reading.need_reader()
    reading.handler_started()  # rings: the receiver takes over for the waiting thread
    assert receiver.took_over_within(10.0)
    assert not reading.read_in_handler()


# -- a real stub through many hand-overs ------------------------------------------------------------
_MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(data[1]) / 1000.0)  # some handlers outlast the receiver's polls
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data.copy())]))
        return out
'''
_DELAYS_MS = [0, 0, 0, 25, 0, 0, 12, 0, 0, 40, 0, 3]


def test_every_frame_arrives_in_order_across_hand_overs(tmp_path: Path) -> None:
    """Short and long executes mixed, 8 in flight: reading passes between the main thread and the
    receiver many times; every request gets its own answer, none is lost or stuck."""
    async def main() -> None:
        async with model_stub(tmp_path, "handover", _MODEL) as stub:
            queue = list(range(240))

            async def client() -> None:
                while queue:
                    number = queue.pop()
                    data = np.array([number, _DELAYS_MS[number % len(_DELAYS_MS)]], dtype=np.int64)
                    request = InferRequest("handover", inputs=[Tensor("INPUT0", "INT64", (2,), data)])
                    (response,) = await asyncio.wait_for(execute(stub, [request]), 30.0)
                    output = np.frombuffer(response.outputs[0].data, dtype=np.int64)
                    assert output.tolist() == data.tolist(), f"request {number} got another's answer"
                    response.release()

            await asyncio.gather(*(client() for _ in range(8)))

    asyncio.run(main())
