"""The HTTP frontend's routes, status codes and headers, then the real tritonclient against it.

The server under test is `create_http_app` over `EchoCore`, an in-test core whose models return
their inputs as outputs (INPUTn -> OUTPUTn) without pruning, so the frontend's pruning shows,
served by the inference port's listener on 127.0.0.1 and asked by aiohttp's client.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.codec import INFERENCE_HEADER
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.http.server import create_http_app
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor

_T = TypeVar("_T")

_METADATA = {
    "name": "identity", "versions": ["1"], "platform": "python",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
}
_CONFIG = {
    "name": "identity", "backend": "python", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


class EchoCore:
    """A `FrontendCore` with models `identity` (version 1), `boom` (raises) and `busy` (503)."""

    def __init__(self) -> None:
        self.server_name = "pystub-test"
        self.server_version = "0.0.1"
        self.extensions = ["binary_tensor_data", "statistics", "model_repository"]
        self.live = True
        self.ready = True
        self.requests: list[InferRequest] = []
        self.releases = 0
        self.index_calls: list[bool] = []

    def _check(self, name: str, version: str) -> None:
        if name not in ("identity", "boom", "busy", "bad_output"):
            raise ServerError(f"Request for unknown model: '{name}' is not found", Status.NOT_FOUND)
        if version not in ("", "1"):
            raise ServerError(
                f"Request for unknown model: '{name}' version {version} is not found",
                Status.NOT_FOUND,
            )

    def is_live(self) -> bool:
        return self.live

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return False

    def target(self, name: str, version: str = "") -> Any:
        return None  # no model is decoupled: the frontend asks the core to look it up

    def is_ready(self) -> bool:
        return self.ready

    async def model_ready(self, name: str, version: str = "") -> bool:
        return name == "identity" and version in ("", "1")

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name, version)
        return {**_METADATA, "name": name}

    def model_config(self, name: str, version: str = "") -> Any:
        raise ServerError("not used over HTTP", Status.UNSUPPORTED)

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name, version)
        return {**_CONFIG, "name": name}

    async def infer(self, request: InferRequest, target: Any = None) -> InferResponse:
        self._check(request.model_name, request.model_version)
        self.requests.append(request)
        if request.model_name == "boom":
            raise RuntimeError("kaboom")
        if request.model_name == "busy":
            raise ServerError("model 'busy' is not at ready state", Status.UNAVAILABLE)
        outputs = [Tensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, t.shape, t.data)
                   for t in request.inputs]
        if request.model_name == "bad_output":
            outputs = [Tensor("OUTPUT0", "FP32", (2,), b"abc")]  # 3 bytes cannot be FP32 [2]
        return InferResponse(request.model_name, "1", request.id, outputs,
                             {"echo": True}, release=self._release)

    def _release(self) -> None:
        self.releases += 1

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        self.index_calls.append(ready_only)
        return [{"name": "identity", "version": "1", "state": "READY", "reason": ""}]

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            self._check(name, version)
        return [{"name": name or "identity", "version": version or "1",
                 "inference_count": len(self.requests)}]


class Client:
    """aiohttp's client session for one server: paths relative to it, and its port."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.port = port

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.session.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.session.post(path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.session.request(method, path, **kwargs)


Scenario = Callable[[Client, EchoCore], Awaitable[_T]]


def _serve(scenario: Scenario[_T], core: EchoCore | None = None, **options: Any) -> _T:
    """Run `scenario` against a fresh server on 127.0.0.1; returns what it returns."""
    core = core or EchoCore()

    async def main() -> _T:
        listener = HttpListener(create_http_app(core, **options))
        port = await listener.start_tcp("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", auto_decompress=False) as session:
                return await scenario(Client(session, port), core)
        finally:
            await listener.stop()

    return asyncio.run(main())


async def _get(client: Client, path: str) -> tuple[int, bytes, Any]:
    async with client.get(path) as response:
        return response.status, await response.read(), response.headers


async def _post(client: Client, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    # aiohttp's client asks for gzip by default, which the server honours.
    headers = {"Accept-Encoding": "identity", **(headers or {})}
    async with client.post(path, data=body, headers=headers) as response:
        return response.status, await response.read(), response.headers


def _error_of(status: int, body: bytes, headers: Any) -> tuple[int, str]:
    assert headers["Content-Type"].startswith("application/json")
    document = json.loads(body)
    assert list(document) == ["error"]
    return status, document["error"]


# -- routes ----------------------------------------------------------------------------------------


def test_health_reflects_the_core() -> None:
    async def scenario(client: Client, core: EchoCore) -> list[tuple[int, bytes]]:
        results = []
        for live, ready in ((True, True), (False, False)):
            core.live, core.ready = live, ready
            for path in ("/v2/health/live", "/v2/health/ready"):
                status, body, _ = await _get(client, path)
                results.append((status, body))
        return results

    assert _serve(scenario) == [(200, b""), (200, b""), (400, b""), (400, b"")]


def test_server_and_model_metadata_config_and_ready() -> None:
    async def scenario(client: Client, core: EchoCore) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path in ("/v2", "/v2/models/identity", "/v2/models/identity/versions/1",
                     "/v2/models/identity/config", "/v2/models/identity/versions/1/config"):
            status, body, headers = await _get(client, path)
            assert status == 200 and headers["Content-Type"].startswith("application/json")
            out[path] = json.loads(body)
        for path in ("/v2/models/identity/ready", "/v2/models/identity/versions/1/ready",
                     "/v2/models/nope/ready", "/v2/models/identity/versions/2/ready"):
            status, body, headers = await _get(client, path)
            out[path] = (status, body)
        return out

    out = _serve(scenario)
    assert out["/v2"] == {"name": "pystub-test", "version": "0.0.1",
                          "extensions": ["binary_tensor_data", "statistics", "model_repository"]}
    assert out["/v2/models/identity"] == out["/v2/models/identity/versions/1"] == _METADATA
    assert out["/v2/models/identity/config"] == _CONFIG
    assert out["/v2/models/identity/versions/1/config"] == _CONFIG
    assert out["/v2/models/identity/ready"] == (200, b"")
    assert out["/v2/models/identity/versions/1/ready"] == (200, b"")
    not_ready = (400, b'{"error":"Model version not ready"}')
    assert out["/v2/models/nope/ready"] == out["/v2/models/identity/versions/2/ready"] == not_ready


def test_lookup_errors_unknown_routes_and_wrong_methods() -> None:
    async def scenario(client: Client, core: EchoCore) -> list[Any]:
        requests = [("GET", "/v2/models/nope"), ("GET", "/v2/models/identity/versions/7/config"),
                    ("GET", "/v2/nothing"), ("GET", "/v2/models/identity/versions/x"),
                    ("GET", "/v2/models/identity/infer"), ("POST", "/v2/health/live"),
                    ("DELETE", "/v2/models/identity")]
        results = []
        for method, path in requests:
            async with client.request(method, path) as response:
                results.append((*_error_of(response.status, await response.read(),
                                           response.headers), response.headers.get("Allow")))
        return results

    assert _serve(scenario) == [
        (404, "Request for unknown model: 'nope' is not found", None),
        (404, "Request for unknown model: 'identity' version 7 is not found", None),
        (404, "Not Found", None),
        (404, "Not Found", None),
        (405, "Method Not Allowed", "POST"),
        (405, "Method Not Allowed", "GET,HEAD"),
        (405, "Method Not Allowed", "GET,HEAD"),
    ]


def test_statistics_routes() -> None:
    async def scenario(client: Client, core: EchoCore) -> list[Any]:
        results = []
        for path in ("/v2/models/stats", "/v2/models/identity/stats",
                     "/v2/models/identity/versions/1/stats"):
            status, body, _ = await _get(client, path)
            results.append((status, json.loads(body)))
        return results

    stats = [(200, {"model_stats": [{"name": "identity", "version": v, "inference_count": 0}]})
             for v in ("1", "1", "1")]
    assert _serve(scenario) == stats


def test_repository_index() -> None:
    async def scenario(client: Client, core: EchoCore) -> list[Any]:
        results: list[Any] = []
        for path, body in (("/v2/repository/index", b""),
                           ("/v2/repository/index", b'{"ready": true}'),
                           ("/v2/repository/models/index", b"{}")):
            status, reply, _ = await _post(client, path, body)
            results.append((status, json.loads(reply)))
        status, reply, headers = await _post(client, "/v2/repository/index", b'{"ready": 1}')
        results.append(_error_of(status, reply, headers))
        status, reply, headers = await _post(client, "/v2/repository/index", b"{")
        results.append(_error_of(status, reply, headers)[0])
        results.append(core.index_calls)
        return results

    index = [{"name": "identity", "version": "1", "state": "READY", "reason": ""}]
    assert _serve(scenario) == [(200, index), (200, index), (200, index),
                                (400, "'ready' must be a boolean"), 400, [False, True, False]]


# -- inference over raw HTTP -----------------------------------------------------------------------


def _infer_json(**extra: Any) -> bytes:
    document = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                            "data": [[1.5, 2]]}], **extra}
    return json.dumps(document).encode()


def test_infer_json_request_gets_json_response_and_releases_once() -> None:
    async def scenario(client: Client, core: EchoCore) -> Any:
        status, body, headers = await _post(client, "/v2/models/identity/versions/1/infer",
                                            _infer_json(id="q"))
        assert core.requests[0].model_version == "1" and core.requests[0].id == "q"
        return status, headers["Content-Type"], json.loads(body), core.releases

    status, content_type, document, releases = _serve(scenario)
    assert (status, content_type, releases) == (200, "application/json", 1)
    assert document == {"model_name": "identity", "model_version": "1", "id": "q",
                        "parameters": {"echo": True},
                        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 2],
                                     "data": [1.5, 2.0]}]}


def test_infer_binary_request_with_binary_and_pruned_outputs() -> None:
    a = np.arange(4, dtype=np.float32)
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                    "parameters": {"binary_data_size": 16}},
                   {"name": "INPUT1", "datatype": "INT32", "shape": [1], "data": [3]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()

    async def scenario(client: Client, core: EchoCore) -> Any:
        return await _post(client, "/v2/models/identity/infer", header + a.tobytes(),
                           {"Inference-Header-Content-Length": str(len(header)),
                            "Content-Type": "application/octet-stream"})

    status, body, headers = _serve(scenario)
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    length = int(headers["Inference-Header-Content-Length"])
    document = json.loads(body[:length])
    assert [o["name"] for o in document["outputs"]] == ["OUTPUT0"]
    assert document["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert body[length:] == a.tobytes()


def test_raw_request_uses_the_model_metadata() -> None:
    a = np.arange(4, dtype=np.float32)

    async def scenario(client: Client, core: EchoCore) -> Any:
        reply = await _post(client, "/v2/models/identity/infer", a.tobytes(),
                            {"Inference-Header-Content-Length": "0"})
        return reply, core.requests[0].inputs[0]

    (status, body, headers), tensor = _serve(scenario)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", (1, 4))
    length = int(headers["Inference-Header-Content-Length"])
    assert status == 200 and json.loads(body[:length])["outputs"][0]["shape"] == [1, 4]
    assert body[length:] == a.tobytes()


def test_raw_request_for_an_unknown_model_is_404() -> None:
    async def scenario(client: Client, core: EchoCore) -> Any:
        return _error_of(*await _post(client, "/v2/models/nope/infer", b"1234",
                                      {"Inference-Header-Content-Length": "0"}))

    assert _serve(scenario) == (404, "Request for unknown model: 'nope' is not found")


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(encoding: str) -> None:
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    decompress = gzip.decompress if encoding == "gzip" else zlib.decompress

    async def scenario(client: Client, core: EchoCore) -> Any:
        return await _post(client, "/v2/models/identity/infer", compress(_infer_json()),
                           {"Content-Encoding": encoding, "Accept-Encoding": encoding})

    status, body, headers = _serve(scenario)
    assert status == 200 and headers["Content-Encoding"] == encoding
    assert json.loads(decompress(body))["outputs"][0]["data"] == [1.5, 2.0]


@pytest.mark.parametrize(
    "body, headers, expected",
    [
        (b"{nope", {}, (400, "failed to parse the request JSON buffer")),
        (_infer_json(), {INFERENCE_HEADER: "9999"}, (400, "inference header size should be in range")),
        (_infer_json(), {INFERENCE_HEADER: "-3"}, (400, "invalid Inference-Header")),
        (b"garbage", {"Content-Encoding": "gzip"}, (400, "failed to decompress")),
        (_infer_json(), {"Content-Encoding": "br"}, (501, "unsupported Content-Encoding")),
    ],
)
def test_malformed_infer_requests(body: bytes, headers: dict[str, str],
                                  expected: tuple[int, str]) -> None:
    async def scenario(client: Client, core: EchoCore) -> Any:
        return _error_of(*await _post(client, "/v2/models/identity/infer", body, headers))

    status, message = _serve(scenario)
    assert status == expected[0] and expected[1] in message


def test_core_errors_map_to_statuses_and_unexpected_ones_to_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(client: Client, core: EchoCore) -> Any:
        results = []
        for model in ("nope", "busy", "boom", "bad_output"):
            results.append(_error_of(*await _post(client, f"/v2/models/{model}/infer",
                                                  _infer_json())))
        return results, core.releases

    with caplog.at_level(logging.ERROR, logger="pystub_backend.backend.frontends.http.server"):
        results, releases = _serve(scenario)
    assert results[0] == (404, "Request for unknown model: 'nope' is not found")
    assert results[1] == (503, "model 'busy' is not at ready state")
    assert results[2] == (500, "kaboom")
    assert results[3][0] == 500
    assert releases == 1  # bad_output's response is released although encoding failed
    assert "kaboom" in caplog.text and "Traceback" in caplog.text


@pytest.mark.parametrize("chunked", [False, True])
def test_body_above_the_limit_is_refused(chunked: bool) -> None:
    body = _infer_json() + b" " * 2000

    async def scenario(client: Client, core: EchoCore) -> Any:
        async def chunks() -> Any:
            yield body

        data: Any = chunks() if chunked else body
        async with client.post("/v2/models/identity/infer", data=data) as response:
            error = _error_of(response.status, await response.read(), response.headers)
            return error, core.requests

    (status, message), requests = _serve(scenario, max_input_size=1024)
    assert status == 400 and "maximum input size of 1024 bytes" in message and requests == []


def test_decompressed_body_above_the_limit_is_refused() -> None:
    bomb = gzip.compress(_infer_json() + b" " * 100_000)

    async def scenario(client: Client, core: EchoCore) -> Any:
        return _error_of(*await _post(client, "/v2/models/identity/infer", bomb,
                                      {"Content-Encoding": "gzip"}))

    status, message = _serve(scenario, max_input_size=4096)
    assert status == 400 and "maximum input size of 4096" in message


# -- the real tritonclient -------------------------------------------------------------------------


def _client_inputs(binary: bool) -> tuple[list[Any], np.ndarray, np.ndarray]:
    floats = np.arange(8, dtype=np.float32).reshape(2, 4)
    strings = np.array([[b"hello"], ["wörld".encode()]], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"),
              httpclient.InferInput("INPUT1", [2, 1], "BYTES")]
    inputs[0].set_data_from_numpy(floats, binary_data=binary)
    inputs[1].set_data_from_numpy(strings, binary_data=binary)
    return inputs, floats, strings


@pytest.mark.parametrize("binary", [True, False])
def test_aio_tritonclient_identity(binary: bool) -> None:
    async def scenario(client: Client, core: EchoCore) -> None:
        url = f"127.0.0.1:{client.port}"
        async with aioclient.InferenceServerClient(url) as triton:
            assert await triton.is_server_live() and await triton.is_server_ready()
            assert await triton.is_model_ready("identity")
            assert not await triton.is_model_ready("nope")
            assert (await triton.get_server_metadata())["name"] == "pystub-test"
            assert await triton.get_model_metadata("identity", "1") == _METADATA
            assert await triton.get_model_config("identity") == _CONFIG
            inputs, floats, strings = _client_inputs(binary)
            outputs = [aioclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                       aioclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
            for requested in (outputs, None):
                result = await triton.infer("identity", inputs, outputs=requested,
                                            request_id="r7")
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), floats)
                texts = result.as_numpy("OUTPUT1")
                assert texts.shape == (2, 1)
                assert [t if isinstance(t, bytes) else t.encode() for t in texts.ravel()] == \
                    list(strings.ravel())
                assert result.get_response()["id"] == "r7"
            only = await triton.infer("identity", inputs, outputs=outputs[1:])
            assert only.as_numpy("OUTPUT0") is None
            zipped = await triton.infer("identity", inputs, request_compression_algorithm="gzip",
                                        response_compression_algorithm="deflate")
            np.testing.assert_array_equal(zipped.as_numpy("OUTPUT0"), floats)
            stats = await triton.get_inference_statistics("identity")
            assert stats["model_stats"][0]["inference_count"] == 4
            index = await triton.get_model_repository_index()
            assert index[0]["state"] == "READY"
            with pytest.raises(InferenceServerException, match="unknown model: 'nope'") as info:
                await triton.infer("nope", inputs)
            assert info.value.status() == "404"
        assert core.releases == 4

    _serve(scenario)


def test_sync_tritonclient_in_a_thread() -> None:
    def use_client(port: int) -> None:
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert triton.is_server_live()
            assert triton.get_model_metadata("identity")["inputs"][0]["name"] == "INPUT0"
            assert triton.get_model_config("identity")["max_batch_size"] == 8
            for binary in (True, False):
                inputs, floats, _ = _client_inputs(binary)
                result = triton.infer("identity", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), floats)
            with pytest.raises(InferenceServerException, match="version 3 is not found"):
                triton.get_model_metadata("identity", "3")  # 404 from the core
        finally:
            triton.close()
            # geventhttpclient made a gevent hub for this thread; its epoll and eventfd would
            # outlive the thread (and fail the fd leak check) unless the loop is destroyed.
            gevent.get_hub().destroy(destroy_loop=True)

    async def scenario(client: Client, core: EchoCore) -> None:
        loop = asyncio.get_running_loop()
        port = client.port
        assert port is not None
        await loop.run_in_executor(None, use_client, port)

    _serve(scenario)
