"""pb_utils.InferenceResponseSender rules (API.md 6.6, 7) and ResponseIterator."""

from __future__ import annotations

import threading

import pytest

from pystub_backend.stub.pb_utils import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL as FINAL,
)
from pystub_backend.stub.pb_utils import (
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
    TritonModelException,
)

UNSUPPORTED_FLAG = "Unable to send response. Unsupported flag provided."
NEEDS_RESPONSE = "Inference Response object must be provided when the response flags is set to zero."
MORE_THAN_ONE = "Unable to send response. Non-decoupled model cannot send more than one response."
FINAL_FIRST = "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
CLOSED = "Unable to send response. Response sender has been closed."


class Recorder:
    def __init__(self):
        self.sent = []

    def __call__(self, response, flags):
        self.sent.append((response, flags))


def _sender(decoupled):
    recorder = Recorder()
    return InferenceResponseSender(recorder, lambda: False, decoupled=decoupled), recorder


def _raises(call, text):
    with pytest.raises(TritonModelException) as exc:
        call()
    assert str(exc.value) == text


@pytest.mark.parametrize("decoupled", [False, True])
def test_argument_rules_apply_in_both_modes(decoupled):
    sender, recorder = _sender(decoupled)
    _raises(lambda: sender.send(InferenceResponse(), flags=2), UNSUPPORTED_FLAG)
    _raises(lambda: sender.send(None, flags=3), UNSUPPORTED_FLAG)
    _raises(lambda: sender.send(), NEEDS_RESPONSE)
    _raises(lambda: sender.send(None, 0), NEEDS_RESPONSE)
    assert recorder.sent == []
    assert not sender._responded and not sender._closed


def test_default_mode_one_response_then_final():
    sender, recorder = _sender(False)
    first = InferenceResponse()
    sender.send(first)
    assert sender._responded and not sender._closed
    _raises(lambda: sender.send(InferenceResponse()), MORE_THAN_ONE)
    _raises(lambda: sender.send(InferenceResponse(), FINAL), MORE_THAN_ONE)
    sender.send(flags=FINAL)
    assert sender._closed
    _raises(lambda: sender.send(flags=FINAL), CLOSED)
    _raises(lambda: sender.send(InferenceResponse()), MORE_THAN_ONE)  # checked before "closed"
    assert recorder.sent == [(first, 0), (None, FINAL)]


def test_default_mode_response_with_final():
    sender, recorder = _sender(False)
    response = InferenceResponse()
    sender.send(response, FINAL)
    assert sender._responded and sender._closed
    _raises(lambda: sender.send(flags=FINAL), CLOSED)
    assert recorder.sent == [(response, FINAL)]


def test_default_mode_final_before_response():
    sender, recorder = _sender(False)
    _raises(lambda: sender.send(flags=FINAL), FINAL_FIRST)
    assert recorder.sent == [] and not sender._closed


def test_decoupled_mode_many_responses_then_flags_only_final():
    sender, recorder = _sender(True)
    responses = [InferenceResponse() for _ in range(3)]
    for response in responses:
        sender.send(response)
    sender.send(flags=FINAL)
    assert sender._responded and sender._closed
    _raises(lambda: sender.send(InferenceResponse()), CLOSED)
    _raises(lambda: sender.send(flags=FINAL), CLOSED)
    assert recorder.sent == [(r, 0) for r in responses] + [(None, FINAL)]


def test_decoupled_mode_final_only():
    sender, recorder = _sender(True)
    sender.send(flags=FINAL)
    assert sender._closed and not sender._responded
    assert recorder.sent == [(None, FINAL)]


def test_wrong_argument_types():
    sender, _ = _sender(True)
    with pytest.raises(TypeError):
        sender.send("not a response")
    with pytest.raises(TypeError):
        sender.send(InferenceResponse(), flags=-1)


def test_delivery_failure_propagates_and_still_counts():
    def failing(response, flags):
        raise TritonModelException("An error occurred while sending a response.")

    sender = InferenceResponseSender(failing, lambda: False, decoupled=False)
    _raises(lambda: sender.send(InferenceResponse(), FINAL), "An error occurred while sending a response.")
    assert sender._closed  # the original updates its state before delivering


def test_is_cancelled_asks_until_true_then_caches():
    answers = iter([False, False, True])
    calls = []

    def ask():
        calls.append(1)
        return next(answers)

    sender = InferenceResponseSender(Recorder(), ask, decoupled=True)
    assert [sender.is_cancelled() for _ in range(5)] == [False, False, True, True, True]
    assert len(calls) == 3


def test_sends_from_many_threads_are_serialized():
    inside = []
    order = []
    lock = threading.Lock()

    def deliver(response, flags):
        with lock:
            inside.append(1)
            assert len(inside) == 1  # never two deliveries at once
        order.append(flags)
        with lock:
            inside.pop()

    sender = InferenceResponseSender(deliver, lambda: False, decoupled=True)
    threads = [threading.Thread(target=lambda: [sender.send(InferenceResponse()) for _ in range(50)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sender.send(flags=FINAL)
    assert order == [0] * 200 + [FINAL]


# -- ResponseIterator -----------------------------------------------------------------------------

def test_response_iterator_yields_until_final_and_replays():
    responses = [InferenceResponse() for _ in range(3)]
    feed = iter([(responses[0], False), (responses[1], False), (responses[2], True)])
    iterator = ResponseIterator(lambda: next(feed))
    assert list(iterator) == responses
    with pytest.raises(StopIteration):
        next(iterator)
    assert list(iterator) == responses  # re-iterating replays the cache


def test_response_iterator_cancel():
    cancelled = []
    feed = iter([(InferenceResponse(), False), (InferenceResponse(), True)])
    iterator = ResponseIterator(lambda: next(feed), lambda: cancelled.append(1))
    next(iterator)
    iterator.cancel()
    assert cancelled == [1]
    next(iterator)
    iterator.cancel()  # finished: nothing left to cancel
    assert cancelled == [1]
