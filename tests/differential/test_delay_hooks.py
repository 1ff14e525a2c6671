"""Triton's test hooks (TRITONSERVER_DELAY_*, pystub_backend/backend/delay_hooks.py): both servers
run with the same variables (PAIR_ENV) and must delay the same things.

Nothing here depends on how fast the machine is: a hold is shown by counts (the pending-request
gauge reaching 2 while the first request is still unanswered, one execute getting all three), a
delay by a client deadline shorter than it (which always passes first) and by a lower bound on
the time an answer took (no load makes a delay shorter).
"""

from __future__ import annotations

import queue
import re
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from calls import agree, both, grpc_infer, http_infer
from oracle import Endpoint, Pair

PAIR_MODELS = ("held_batch", "seq_acc", "add_sub")
HOLD = 3
GRPC_PROCESS_S, GRPC_COMPLETE_S, GRPC_OTHER_S = 2.5, 2.5, 2
PAIR_ENV = {"TRITONSERVER_DELAY_SCHEDULER": str(HOLD),
            "TRITONSERVER_DELAY_GRPC_PROCESS": str(int(GRPC_PROCESS_S * 1000)),
            "TRITONSERVER_DELAY_GRPC_COMPLETE": str(int(GRPC_COMPLETE_S * 1000)),
            "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": str(GRPC_OTHER_S)}
_DEADLINE = 60.0
ADD_SUB = [("INPUT0", np.arange(4, dtype=np.float32), "FP32"), ("INPUT1", np.ones(4, np.float32), "FP32")]


def _pending(endpoint: Endpoint, model: str) -> int:
    with urllib.request.urlopen(endpoint.metrics_url, timeout=_DEADLINE) as response:
        text = response.read().decode()
    match = re.search(rf'^nv_inference_pending_request_count{{model="{model}",version="1"}} (\d+)', text, re.M)
    return int(match.group(1)) if match else 0


def _wait_pending(endpoint: Endpoint, model: str, count: int) -> None:
    deadline = time.monotonic() + _DEADLINE
    while (seen := _pending(endpoint, model)) < count:
        assert time.monotonic() < deadline, f"{endpoint.name}: '{model}' never had {count} pending (saw {seen})"
        time.sleep(0.1)


class _Request(threading.Thread):
    """One HTTP inference in its own thread; `answer` once done."""

    def __init__(self, endpoint: Endpoint, model: str, name: str, value: int, **options: object) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.model, self.name, self.value, self.options = endpoint, model, name, value, options
        self.answer: object = None
        self.start()

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.endpoint.http_url, network_timeout=_DEADLINE)
        try:
            tensor = httpclient.InferInput(self.name, [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[self.value]], np.int32))
            result = client.infer(self.model, [tensor], **self.options)
            self.answer = result.as_numpy("BATCH" if self.model == "held_batch" else "OUTPUT").reshape(-1).tolist()
        except Exception as error:  # noqa: BLE001 - compared as data
            self.answer = f"{type(error).__name__}: {error}"
        finally:
            client.close()

    def result(self) -> object:
        self.join(_DEADLINE)
        assert not self.is_alive(), f"{self.endpoint.name}: no answer from '{self.model}' within {_DEADLINE} s"
        return self.answer


def _held(endpoint: Endpoint, model: str, name: str, options: list[dict]) -> dict:
    """The first HOLD requests sent one by one, each once the ones before are pending; then one more."""
    requests = []
    for index, extra in enumerate(options[:HOLD]):
        if index:
            _wait_pending(endpoint, model, index)
        requests.append(_Request(endpoint, model, name, index + 1, **extra))
    first_done_early = requests[0].answer is not None
    held = [request.result() for request in requests]
    after = _Request(endpoint, model, name, 7, **options[HOLD]).result()
    return {"first_answered_before_the_last_came": first_done_early, "held": held, "after": after}


def test_dynamic_batcher_holds_until_enough_are_queued(pair: Pair) -> None:
    triton, pystub = both(pair, _held, "held_batch", "INPUT0", [{}] * (HOLD + 1))
    assert triton == {"first_answered_before_the_last_came": False, "held": [[3], [3], [3]], "after": [1]}, triton
    agree(triton, pystub)


def test_sequence_batcher_holds_until_enough_are_queued(pair: Pair) -> None:
    sequences = [{"sequence_id": 100 + i, "sequence_start": True, "sequence_end": True} for i in range(HOLD + 1)]
    triton, pystub = both(pair, _held, "seq_acc", "INPUT", sequences)
    assert triton["first_answered_before_the_last_came"] is False, triton
    agree(triton, pystub)


def test_a_model_without_a_batcher_is_not_held(pair: Pair) -> None:
    """One request to a model of the default scheduler: answered (held, it would never be)."""
    agree(*both(pair, http_infer, "add_sub", ADD_SUB, ["OUTPUT0"]))


def _timed(call: object) -> tuple[object, float]:
    started = time.monotonic()
    answer = call()  # type: ignore[operator]
    return answer, time.monotonic() - started


def _unary(endpoint: Endpoint) -> dict:
    short = grpc_infer(endpoint, "add_sub", ADD_SUB, ["OUTPUT0"], timeout=1.0)
    answer, took = _timed(lambda: grpc_infer(endpoint, "add_sub", ADD_SUB, ["OUTPUT0"]))
    return {"deadline_1s": short, "answer": answer, "took_at_least_the_delay": took >= GRPC_PROCESS_S}


def test_grpc_inference_waits_before_the_model(pair: Pair) -> None:
    triton, pystub = both(pair, _unary)
    assert triton["deadline_1s"] == {"timeout": 1.0} and triton["took_at_least_the_delay"], triton
    agree(triton, pystub)


def _stream(endpoint: Endpoint) -> list[bool]:
    """Two requests on one stream: each response at least one more delay after the stream began."""
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    answers: queue.Queue = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), error)))
        started = time.monotonic()
        for _ in range(2):
            inputs = []
            for name, data, datatype in ADD_SUB:
                tensor = grpcclient.InferInput(name, list(data.shape), datatype)
                tensor.set_data_from_numpy(data)
                inputs.append(tensor)
            client.async_stream_infer("add_sub", inputs)
        late = []
        for count in (1, 2):
            at, error = answers.get(timeout=_DEADLINE)
            assert error is None, f"{endpoint.name}: {error}"
            late.append(at - started >= count * GRPC_COMPLETE_S)
        return late
    finally:
        client.stop_stream()
        client.close()


def test_grpc_stream_responses_are_written_late_one_after_the_other(pair: Pair) -> None:
    triton, pystub = both(pair, _stream)
    assert triton == [True, True], triton
    agree(triton, pystub)


def _other(endpoint: Endpoint) -> dict:
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    try:
        try:
            short = client.is_server_live(client_timeout=0.5)
        except Exception as error:  # noqa: BLE001 - compared as data
            short = str(error).split("]")[0] + "]"
        live, took = _timed(lambda: client.is_server_live(client_timeout=_DEADLINE))
        metadata, took_again = _timed(lambda: client.get_model_metadata("add_sub", client_timeout=_DEADLINE).name)
        return {"deadline_half_second": short, "live": live, "metadata": metadata,
                "both_took_at_least_the_delay": min(took, took_again) >= GRPC_OTHER_S}
    finally:
        client.close()


def test_other_grpc_calls_answer_late(pair: Pair) -> None:
    triton, pystub = both(pair, _other)
    assert triton["deadline_half_second"] == "[StatusCode.DEADLINE_EXCEEDED]", triton
    assert triton["both_took_at_least_the_delay"], triton
    agree(triton, pystub)
