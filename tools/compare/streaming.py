"""The streaming cells: a decoupled model's responses (as an LLM sends tokens) read by S clients.

    model      stream_fp32 (decoupled): input COUNT (INT32 [1]); sends COUNT responses of OUTPUT0
               (FP32 [4], 16 B, the index of the response in every element), then a flags-only FINAL
    grpc       S streams (`ModelStreamInfer`, one channel each), one request at a time per stream
    sse        S HTTP clients on `/v2/models/stream_fp32/generate_stream`, one request at a time each

Each client sends its next request as soon as the last one's final response has arrived, so S
requests stream at all times. The window counts responses (not requests) and reads the CPU time
of the server's leader process (pystub's backend, tritonserver) and of its descendants (the stubs)
from /proc at both ends, and the load generator's own CPU (getrusage): the load generator must
spend less per response than the server does, or the cell measures the client. The client parses
no protobuf or JSON per response on the hot path: gRPC responses are checked for the final flag
by their raw bytes, SSE events are counted by their separator; one request per window is checked
in full (count, order, values), so a broken server cannot look fast.
"""

from __future__ import annotations

import asyncio
import queue
import time
from pathlib import Path

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from compare import cpu, stopping
from compare.loadgen import Point, Sample, percentile

MODEL = "stream_fp32"
PROTOCOLS = ("grpc", "sse")
# the map entry {"triton_final_response": InferParameter(bool_param=True)} as it is on the wire
_FINAL_TRUE = b"triton_final_response\x12\x02\x08\x01"
_ERROR_TAG = 0x0A  # ModelStreamInferResponse.error_message, field 1, length-delimited

_MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            for index in range(count):
                output = pb_utils.Tensor("OUTPUT0", np.full(4, index, dtype=np.float32))
                sender.send(pb_utils.InferenceResponse([output]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_CONFIG = '''name: "stream_fp32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


def write_model(models: Path) -> None:
    """The decoupled model, into the repository pystub and Triton share."""
    (models / MODEL / "1").mkdir(parents=True, exist_ok=True)
    (models / MODEL / "1" / "model.py").write_text(_MODEL_PY)
    (models / MODEL / "config.pbtxt").write_text(_CONFIG)


class _Counter:
    """Responses seen by every client (the gRPC clients are threads: `+=` under the GIL may lose an
    increment now and then when two threads race; negligible against thousands per second)."""

    responses = 0


def _stream_request(count: int, index: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=str(index))
    # the flags-only final then arrives as an empty response: how a stream client knows a request ended
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([count], dtype=np.int32).tobytes())
    return request


async def _check_grpc(url: str, count: int) -> None:
    """One request read in full: `count` responses in order, then the final. Raises RuntimeError."""
    async with grpc.aio.insecure_channel(url) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
        await call.write(_stream_request(count, 0))
        seen = 0
        async for message in call:
            if message.error_message:
                raise RuntimeError(f"{MODEL} failed over gRPC: {message.error_message}")
            response = message.infer_response
            if response.parameters["triton_final_response"].bool_param:
                break
            values = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
            if values.tolist() != [float(seen)] * 4:
                raise RuntimeError(f"{MODEL} answered {values.tolist()} as response {seen} over gRPC")
            seen += 1
        await call.done_writing()
        if seen != count:
            raise RuntimeError(f"{MODEL} sent {seen} responses over gRPC, not {count}")


def _grpc_stream_thread(url: str, count: int, counter: _Counter, stop: list[bool], latencies: list[float]) -> None:
    """One stream on its own channel, one request at a time until `stop[0]`; counts every response.

    grpc's blocking API on a thread of its own, with raw bytes both ways: reading a message costs
    it a fraction of what an awaited `read()` of grpc.aio costs, and the load generator must not be
    the bottleneck."""
    requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    request = _stream_request(count, 1).SerializeToString()
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     request_serializer=None, response_deserializer=None)(iter(requests.get, None))
        try:
            while not stop[0]:
                began = time.perf_counter()
                requests.put(request)
                for message in call:
                    if message[0] == _ERROR_TAG:
                        raise RuntimeError(f"the server sent an error: {message[:200]!r}")
                    if _FINAL_TRUE in message:
                        break
                    counter.responses += 1
                else:
                    raise RuntimeError("the server ended the stream")
                latencies.append(time.perf_counter() - began)
        finally:
            requests.put(None)
            call.cancel()


async def _check_sse(session: aiohttp.ClientSession, url: str, count: int) -> None:
    import json

    async with session.post(f"http://{url}/v2/models/{MODEL}/generate_stream", json={"COUNT": count}) as reply:
        body = await reply.read()
    events = [json.loads(chunk[len(b"data: "):]) for chunk in body.split(b"\n\n") if chunk.strip()]
    if reply.status != 200 or len(events) != count:
        raise RuntimeError(f"{MODEL} sent {len(events)} events over SSE, not {count} (status {reply.status})")
    if [event["OUTPUT0"] for event in events[:3]] != [[float(i)] * 4 for i in range(min(3, count))]:
        raise RuntimeError(f"{MODEL} answered {events[:3]} over SSE")


async def _sse_client(session: aiohttp.ClientSession, url: str, count: int, counter: _Counter, stop: list[bool],
                      latencies: list[float]) -> None:
    target = f"http://{url}/v2/models/{MODEL}/generate_stream"
    body = b'{"COUNT": %d}' % count
    while not stop[0]:
        began = time.perf_counter()
        async with session.post(target, data=body, headers={"Content-Type": "application/json"}) as reply:
            if reply.status != 200:
                raise RuntimeError(f"generate_stream answered {reply.status}")
            tail = b""
            async for chunk in reply.content.iter_any():
                tail += chunk
                events = tail.count(b"\n\n")
                if events:
                    counter.responses += events
                    tail = tail[tail.rfind(b"\n\n") + 2:]
        latencies.append(time.perf_counter() - began)


async def measure(url: str, server_pid: int, point: Point, responses: int, warmup: float, seconds: float) -> Sample:
    """Responses/s of `point.concurrency` streams of `responses` each, with CPU per response
    (server leader, its descendants, the load generator). Raises RuntimeError on a wrong answer."""
    counter, stop, latencies = _Counter(), [False], []
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
                                    headers={"Accept-Encoding": "identity"})
    async with session:
        if point.protocol == "grpc":
            await _check_grpc(url, responses)
            clients = [asyncio.to_thread(_grpc_stream_thread, url, responses, counter, stop, latencies)
                       for _ in range(point.concurrency)]
        else:
            await _check_sse(session, url, responses)
            clients = [_sse_client(session, url, responses, counter, stop, latencies)
                       for _ in range(point.concurrency)]
        tasks = [asyncio.ensure_future(client) for client in clients]
        try:
            await _sleep_watching(tasks, warmup)
            began, count0, cpu0 = time.perf_counter(), counter.responses, cpu.now(server_pid)
            await _sleep_watching(tasks, seconds)
            elapsed, done, cpu1 = time.perf_counter() - began, counter.responses - count0, cpu.now(server_pid)
            stop[0] = True
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=60 + responses / 100)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if not done:
        raise RuntimeError("no response arrived in the window")
    per = cpu.per_request_us(cpu0, cpu1, done)
    latencies.sort()
    return Sample(throughput=done / elapsed, p50_ms=1000 * percentile(latencies, 0.5),
                  p99_ms=1000 * percentile(latencies, 0.99), count=done,
                  cpu_server_us=per[0], cpu_children_us=per[1], cpu_client_us=per[2])


async def _sleep_watching(tasks: list[asyncio.Task], seconds: float) -> None:
    """Sleep `seconds`, raising at once what a client raised (a wrong answer, a dropped stream)."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        stopping.check()
        finished, _ = await asyncio.wait(tasks, timeout=min(left, 0.2), return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            task.result()
            raise RuntimeError("a streaming client stopped early")
