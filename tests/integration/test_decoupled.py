"""Decoupled models, async execute, streaming frontends, cancellation and back-pressure."""

from __future__ import annotations

import json
import queue
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from stream_clients import Memory, SseStream, notes, wait_until
from tritonclient.utils import InferenceServerException

FINAL_TIMEOUT = 60


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("decoupled"), "repeat", "async_sleep", "sender_rules",
                                 "add_sub", "unary_cancel", "flood")
    with module_backend(Backend(repository, "--backend-config=python,stub-timeout-seconds=3")) as server:
        yield server


def repeat_inputs(count: int, delay_ms: int = 0) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_MS", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([count], np.int32))
    inputs[1].set_data_from_numpy(np.array([delay_ms], np.int32))
    return inputs


class StreamClient:
    """A tritonclient gRPC stream whose results land in a queue."""

    def __init__(self, backend: Backend, **stream_args) -> None:
        self.client = grpcclient.InferenceServerClient(backend.grpc_url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)), **stream_args)

    def take(self, timeout: float = FINAL_TIMEOUT):
        return self.results.get(timeout=timeout)

    def take_until_final(self, timeout: float = FINAL_TIMEOUT) -> list:
        items = []
        while True:
            result, error = self.take(timeout)
            items.append((result, error))
            if error is not None:
                return items
            if result.get_response().parameters["triton_final_response"].bool_param:
                return items

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def stubs(backend: Backend) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=10) as response:
        return {row["instance"]: row for row in json.loads(response.read())["stubs"]}


def test_stream_of_responses_in_order_with_final_flags(backend: Backend):
    stream = StreamClient(backend)
    try:
        stream.client.async_stream_infer("repeat", repeat_inputs(5), request_id="r1",
                                         enable_empty_final_response=True)
        items = stream.take_until_final()
    finally:
        stream.close()
    assert all(error is None for _, error in items)
    values = [int(r.as_numpy("OUT")[0]) for r, _ in items[:-1]]
    assert values == [0, 1, 2, 3, 4]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in items]
    assert finals == [False] * 5 + [True]
    last = items[-1][0].get_response()
    assert last.id == "r1" and last.model_name == "repeat" and len(last.outputs) == 0


def test_empty_final_is_sent_only_when_asked(backend: Backend):
    stream = StreamClient(backend)
    try:
        stream.client.async_stream_infer("repeat", repeat_inputs(2))  # no empty final asked for
        first = [stream.take(), stream.take()]
        stream.client.async_stream_infer("add_sub", _add_sub_inputs())  # a default model on the same stream
        third, error = stream.take()
    finally:
        stream.close()
    assert [int(r.as_numpy("OUT")[0]) for r, _ in first] == [0, 1]
    assert error is None and third.get_response().model_name == "add_sub"  # nothing in between
    assert third.get_response().parameters["triton_final_response"].bool_param


def _add_sub_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    return inputs


def test_ten_thousand_responses_arrive_complete_and_in_order(backend: Backend):
    stream = StreamClient(backend)
    started = time.monotonic()
    try:
        stream.client.async_stream_infer("repeat", repeat_inputs(10_000), enable_empty_final_response=True)
        items = stream.take_until_final()
    finally:
        stream.close()
    elapsed = time.monotonic() - started
    assert all(error is None for _, error in items)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in items[:-1]] == list(range(10_000))
    print(f"\n10,000 responses of one request in {elapsed:.2f} s ({10_000 / elapsed:,.0f} responses/s)")


def test_async_execute_overlaps_requests_on_one_instance(backend: Backend):
    stream = StreamClient(backend)
    started = time.monotonic()
    try:
        for index in range(8):
            tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
            tensor.set_data_from_numpy(np.array([1.0], np.float32))
            stream.client.async_stream_infer("async_sleep", [tensor], request_id=str(index))
        results = [stream.take() for _ in range(8)]
    finally:
        stream.close()
    elapsed = time.monotonic() - started
    assert all(error is None for _, error in results)
    assert sorted(r.get_response().id for r, _ in results) == [str(i) for i in range(8)]
    assert elapsed < 2.0, elapsed
    print(f"\n8 requests that each await asyncio.sleep(1) on one instance: {elapsed:.2f} s")


def test_failed_coroutine_is_logged_with_its_traceback(backend: Backend):
    stream = StreamClient(backend)
    try:
        tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
        tensor.set_data_from_numpy(np.array([-1.0], np.float32))
        stream.client.async_stream_infer("async_sleep", [tensor])
        result, error = stream.take()
    finally:
        stream.close()
    assert error is not None  # the dropped sender fails the request instead of leaving it hanging
    backend.wait_for_log("ValueError: negative sleep requested")
    assert "Traceback" in backend.log()


def test_decoupled_execute_must_return_none(backend: Backend):
    stream = StreamClient(backend)
    try:
        stream.client.async_stream_infer("repeat", repeat_inputs(-1))
        _, error = stream.take()
    finally:
        stream.close()
    assert error is not None
    assert ("Python model 'repeat_0' is using the decoupled mode and the execute function must return None."
            in error.message())


def test_decoupled_send_after_final(backend: Backend):
    stream = StreamClient(backend)
    try:
        stream.client.async_stream_infer("repeat", repeat_inputs(-2), enable_empty_final_response=True)
        result, error = stream.take()
    finally:
        stream.close()
    assert error is None and result.get_response().parameters["triton_final_response"].bool_param
    backend.wait_for_log(r"repeat: Unable to send response. Response sender has been closed.")


def _sender_rules(backend: Backend, mode: int) -> str:
    client = httpclient.InferenceServerClient(backend.http_url)
    try:
        tensor = httpclient.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([mode], np.int32))
        return client.infer("sender_rules", [tensor]).as_numpy("TEXT")[0].decode()
    finally:
        client.close()


def test_sender_rules_of_default_mode(backend: Backend):
    assert _sender_rules(backend, 1) == ("Unable to send response. Non-decoupled model cannot send complete "
                                         "final before sending a response.")
    assert _sender_rules(backend, 2) == "first"
    backend.wait_for_log("sender_rules: Unable to send response. Non-decoupled model cannot send more than one "
                         "response.")
    assert _sender_rules(backend, 3) == "first"  # default mode: Triton reports "more than one" first
    backend.wait_for_log("sender_rules: Unable to send response. Non-decoupled model cannot send more than one "
                         "response.", count=2)
    assert _sender_rules(backend, 4) == "async default mode"
    assert _sender_rules(backend, 5) == "sent through the sender"


def test_unary_endpoints_refuse_decoupled_models(backend: Backend):
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("repeat", repeat_inputs(1))
    finally:
        client.close()
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    body = json.dumps({"inputs": [{"name": "COUNT", "shape": [1], "datatype": "INT32", "data": [1]},
                                  {"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [0]}]})
    request = urllib.request.Request(f"http://{backend.http_url}/v2/models/repeat/infer", data=body.encode())
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(request, timeout=30)
    assert http_error.value.code == 501
    assert json.loads(http_error.value.read()) == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"}


def _post(backend: Backend, path: str, document: dict) -> tuple[int, bytes, str]:
    request = urllib.request.Request(f"http://{backend.http_url}{path}", data=json.dumps(document).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers["Content-Type"]


def test_generate_and_generate_stream(backend: Backend):
    status, body, _ = _post(backend, "/v2/models/add_sub/generate",
                            {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": "g1"})
    assert status == 200
    assert json.loads(body) == {"id": "g1", "model_name": "add_sub", "model_version": "1",
                                "OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}
    status, body, content_type = _post(backend, "/v2/models/repeat/generate_stream",
                                       {"COUNT": 3, "DELAY_MS": 0})
    assert status == 200 and content_type.startswith("text/event-stream")
    events = [json.loads(chunk[len("data: "):]) for chunk in body.decode().split("\n\n") if chunk]
    assert [event["OUT"] for event in events] == [0, 1, 2]
    assert all(event["model_name"] == "repeat" for event in events)
    status, body, _ = _post(backend, "/v2/models/repeat/generate", {"COUNT": 3, "DELAY_MS": 0})
    assert status == 200 and json.loads(body) == {  # Triton 2.51's answer: 200 with the error as the body
        "error": "generate expects model to produce exactly 1 response, use generate stream for model that "
                 "generates various number of responses"}
    status, body, _ = _post(backend, "/v2/models/add_sub/generate", {"INPUT0": [1, 2], "INPUT1": [1, 1, 1, 1]})
    assert status == 400 and "INPUT0" in json.loads(body)["error"]


def test_generate_stream_keeps_every_event_in_order_when_the_model_outruns_the_writes(backend: Backend):
    # 1,000 responses sent without pause: far past the stub's window of 64, and many queue while a
    # write is in flight (several events then go in one write): each must still be its own event
    status, body, _ = _post(backend, "/v2/models/repeat/generate_stream", {"COUNT": 1000, "DELAY_MS": 0})
    assert status == 200
    chunks = body.decode().split("\n\n")
    assert chunks[-1] == "" and all(chunk.startswith("data: {") for chunk in chunks[:-1])
    assert [json.loads(chunk[len("data: "):])["OUT"] for chunk in chunks[:-1]] == list(range(1000))


def _cancel_time(backend: Backend, after: float) -> float:
    match = None
    deadline = time.monotonic() + 10
    while match is None and time.monotonic() < deadline:
        found = [float(m) for m in re.findall(r"repeat: cancelled at ([\d.]+)", backend.log())]
        match = next((t for t in found if t > after), None)
        time.sleep(0.02)
    assert match is not None, "the model never saw is_cancelled()"
    return match


def _wait_arena_free(backend: Backend, stub: str = "repeat_0") -> None:
    wait_until(lambda: stubs(backend)[stub]["arena_used_bytes"] == 0, 10, f"{stub}'s arena to be empty")


def test_grpc_stream_cancel_reaches_the_model_quickly(backend: Backend):
    stream = StreamClient(backend)
    stream.client.async_stream_infer("repeat", repeat_inputs(10_000, delay_ms=5))
    stream.take()
    cancelled_at = time.monotonic()
    stream.close(cancel=True)
    seen = _cancel_time(backend, cancelled_at)
    assert seen - cancelled_at < 0.1, seen - cancelled_at
    _wait_arena_free(backend)
    print(f"\ngRPC stream cancel seen by the model after {(seen - cancelled_at) * 1000:.1f} ms")


def test_http_generate_stream_disconnect_cancels(backend: Backend):
    body = json.dumps({"COUNT": 10_000, "DELAY_MS": 5}).encode()
    sock = socket.create_connection(("127.0.0.1", backend.ports["http"]), timeout=10)
    try:
        sock.sendall(b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data:" not in received:
            received += sock.recv(65536)
    finally:
        closed_at = time.monotonic()
        sock.close()
    seen = _cancel_time(backend, closed_at)
    assert seen - closed_at < 0.1, seen - closed_at
    _wait_arena_free(backend)


def test_a_client_that_does_not_read_cannot_grow_memory(backend: Backend, tmp_path: Path):
    # Responses of 64 KiB fill the kernel's socket buffers and the frontend's write buffer within tens
    # of responses, so the stub's send window is full at once even on a loaded machine (with 4-byte
    # responses it took tens of thousands); then `send` waits the stub timeout (3 s) and is refused.
    before = Memory.of(backend.pid)
    stream = SseStream(backend.http_url, "unread", tmp_path, size=64 * 1024)
    try:
        wait_until(lambda: "unread" in notes(tmp_path, "refused"), 60,
                   "the flood model's send to be refused for want of a reading client")
        grown = Memory.of(backend.pid).growth(before)
        assert grown.backend < 50 and grown.stubs < 50, f"grew by {grown}"
    finally:
        stream.leave()
    _wait_arena_free(backend, "flood_0_0")


def test_streams_leave_nothing_behind(backend: Backend):
    _wait_arena_free(backend)
    assert all(row["in_flight"] == 0 for row in stubs(backend).values())


def test_unary_grpc_cancel_reaches_a_running_execute(backend: Backend):
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], np.int32))
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("unary_cancel", [tensor], client_timeout=0.5)
        gave_up = time.monotonic()
    finally:
        client.close()
    assert "Deadline" in info.value.message() or "DEADLINE" in str(info.value.status())
    match = backend.wait_for_log(r"unary_cancel: cancelled at ([\d.]+)", timeout=10)
    assert float(match.group(1)) - gave_up < 0.2
