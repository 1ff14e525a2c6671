"""The floor's HTTP/1.1 front: KServe v2 over httptools, the JSON header with orjson, binary tensors.

An inference request (the binary-tensor extension) is one body of two parts:

    POST /v2/models/identity_fp32[/versions/1]/infer
    Inference-Header-Content-Length: H
    body: H bytes of JSON header {"inputs": [{"name", "datatype", "shape",
          "parameters": {"binary_data_size": n}}], ...} then each input's n bytes in order

and the answer has the same form (the outputs' `binary_data_size`, then their bytes). Every
output goes back binary: the floor serves the binary extension only; JSON tensors are refused.

httptools calls this protocol back as it parses (`on_url`, `on_header`, `on_body`,
`on_message_complete`); a complete inference goes to the model process at once and its answer
is written from the link's callback. Requests pipelined on one connection are answered in order,
because the model process answers in the order it received them.

Besides inference it answers what the harness and perf_analyzer ask first: readiness and
liveness, server and model metadata, the model config, and statistics (success and failure
counts: the bench checks that every request its load generator counted was a success).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import orjson
from compare.bare_messages import CONFIG, METADATA, MODEL
from model_link import ModelLink

_INFER_PATHS = {f"/v2/models/{MODEL}/infer".encode(), f"/v2/models/{MODEL}/versions/1/infer".encode()}
_SERVER = orjson.dumps({"name": "floor", "version": "0", "extensions": ["binary_tensor_data", "statistics"]})
_STATIC = {  # GET path -> JSON body
    b"/v2": _SERVER, b"/v2/health/live": b"", b"/v2/health/ready": b"",
    f"/v2/models/{MODEL}/ready".encode(): b"", f"/v2/models/{MODEL}/versions/1/ready".encode(): b"",
    f"/v2/models/{MODEL}".encode(): orjson.dumps(METADATA), f"/v2/models/{MODEL}/config".encode(): orjson.dumps(CONFIG)}
_STATS = {f"/v2/models/{MODEL}/stats".encode(), f"/v2/models/{MODEL}/versions/1/stats".encode()}
_TIMED = ("success", "queue", "compute_input", "compute_infer", "compute_output")
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}


class HttpConnection(asyncio.Protocol):
    def __init__(self, link: ModelLink) -> None:
        self._link = link
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []

    # -- the socket ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # answers still coming for this connection are dropped

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(400, b'{"error": "malformed HTTP request"}', keep_alive=False)

    # -- httptools' callbacks, in the order it makes them ------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl's (perf_analyzer's) large bodies

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self._parser.should_keep_alive()
        path, method = self._url.partition(b"?")[0], self._parser.get_method()
        if method == b"POST" and path in _INFER_PATHS:
            self._infer(b"".join(self._body), keep_alive)
        elif method == b"GET" and path in _STATIC:
            self._send(200, _STATIC[path], keep_alive)
        elif method == b"GET" and path in _STATS:
            self._send(200, self._statistics(), keep_alive)
        else:
            self._send(404, orjson.dumps({"error": f"the floor does not serve {method.decode()} {path.decode()}"}),
                       keep_alive)

    # -- inference ---------------------------------------------------------------------------------------
    def _infer(self, body: bytes, keep_alive: bool) -> None:
        try:
            tensors, request_id = _tensors(body, self._headers.get(b"inference-header-content-length"))
            self._link.submit(tensors, lambda error, outputs: self._answer(error, outputs, request_id, keep_alive))
        except (ValueError, KeyError, TypeError) as error:  # orjson.JSONDecodeError is a ValueError
            self._link.failed += 1
            self._send(400, orjson.dumps({"error": f"{type(error).__name__}: {error}"}), keep_alive)

    def _answer(self, error: str | None, outputs: list[list], request_id: str | None, keep_alive: bool) -> None:
        if error is not None:
            self._send(400, orjson.dumps({"error": error}), keep_alive)
            return
        document: dict[str, Any] = {"model_name": MODEL, "model_version": "1", "outputs": [
            {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(data)}}
            for name, datatype, shape, data in outputs]}
        if request_id is not None:
            document["id"] = request_id
        head = orjson.dumps(document)
        self._send(200, b"".join([head, *(output[3] for output in outputs)]), keep_alive,
                   b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %d\r\n" % len(head))

    def _statistics(self) -> bytes:
        """Triton's shape, every field perf_analyzer reads present; only the two counts are kept."""
        served, failed = self._link.succeeded, self._link.failed
        counts = {key: {"count": served, "ns": 0} for key in _TIMED}
        counts.update(fail={"count": failed, "ns": 0}, cache_hit={"count": 0, "ns": 0},
                      cache_miss={"count": 0, "ns": 0})
        return orjson.dumps({"model_stats": [{"name": MODEL, "version": "1", "last_inference": 0,
                                              "inference_count": served, "execution_count": served,
                                              "inference_stats": counts, "batch_stats": []}]})

    def _send(self, status: int, body: bytes, keep_alive: bool,
              headers: bytes = b"Content-Type: application/json\r\n") -> None:
        if self._transport is None:
            return
        connection = b"" if keep_alive else b"Connection: close\r\n"
        self._transport.write(b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\n%s\r\n%s" % (
            status, _REASONS[status], headers, len(body), connection, body))
        if not keep_alive:
            self._transport.close()


def _tensors(body: bytes, header_length: bytes | None) -> tuple[list[list], str | None]:
    """The request's inputs as the model link sends them, and its id. Raises ValueError, KeyError,
    TypeError for a request the floor cannot serve."""
    end = int(header_length) if header_length is not None else len(body)
    header = orjson.loads(body[:end])
    tensors = []
    for tensor in header["inputs"]:
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            raise ValueError("the floor serves binary tensors only (binary_data_size)")
        if end + size > len(body):
            raise ValueError(f"input {tensor['name']} has {size} bytes past the end of the body")
        tensors.append([tensor["name"], tensor["datatype"], tensor["shape"], body[end:end + size]])
        end += size
    for output in header.get("outputs", ()):
        if output.get("parameters", {}).get("binary_data") is False:
            raise ValueError("the floor answers binary tensors only")
    return tensors, header.get("id")
