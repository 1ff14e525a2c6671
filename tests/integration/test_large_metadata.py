"""Request metadata of any size the protocol allows reaches the stub.

A control frame holds at most 128 KiB; a request with a 140 KB id, 20,000 requested outputs or
200 KB of parameters does not fit one. Such a frame travels in the p2s arena (a SPILLED frame,
pystub_backend.ipc.spill) and the request is served like any other. Before that, it failed with
`frame of N bytes exceeds the 131072-byte limit`, and with dynamic batching so did the unrelated
requests batched with it.

The storm: 450 requests over HTTP and gRPC (tritonclient, 16 threads), a third of them with
oversize metadata, through a dynamically batching model, so large and normal requests share
execute calls. Every normal request succeeds with the right output; every large one succeeds and
gets its own id back (or, with thousands of inputs the model does not have, 400 before anything is
allocated); afterwards the arenas, the backend's /dev/shm entries and `in_flight` are back at their
baseline.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import Backend, make_repository, module_backend
from tritonclient.utils import InferenceServerException

MODEL = "batch_probe"
REQUESTS = 450  # 50 of each kind; sized to finish well inside the per-test timeout at load 30
THREADS = 16
BIG_ID = 140_000
MANY_OUTPUTS = 20_000
BIG_PARAMETER = 200_000
# Refused by validation; Triton's text names every input, and much above this many it outgrows
# what a gRPC client accepts in the percent-encoded grpc-message trailer (16 KiB): a limit of that
# text, not of the frames.
MANY_INPUTS = 300
# A 16 MiB p2s segment holds every spilled frame of 16 concurrent requests without growing the
# arena, so /dev/shm can be compared entry by entry.
SHM_DEFAULT = 16 << 20


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("large_metadata"), MODEL)
    config = repository / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 100000",
                                                 "max_queue_delay_microseconds: 20000"))
    with module_backend(Backend(repository, f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT}")) as started:
        yield started


def stub_rows(backend: Backend) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{backend.http_url}/v2/pystub/stubs", timeout=30) as response:
        return [row for row in json.loads(response.read())["stubs"] if row["model"] == MODEL]


def accounting(backend: Backend) -> tuple[int, int, int, list[str]]:
    """(p2s bytes in use, s2p bytes in use, requests in flight, the backend's /dev/shm entries)."""
    rows = stub_rows(backend)
    return (sum(r["arena_used_bytes"] for r in rows), sum(r["s2p_used_bytes"] for r in rows),
            sum(r["in_flight"] for r in rows), sorted(backend.shm_entries()))


def wait_for_baseline(backend: Backend, baseline: tuple[int, int, int, list[str]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := accounting(backend)) != baseline:
        assert time.monotonic() < deadline, f"not back at the baseline {baseline} after {timeout} s: {now}"
        time.sleep(0.1)


class Clients(threading.local):
    """One HTTP and one gRPC client per thread (a tritonclient is not shared between threads)."""

    opened: list[Any] = []  # every thread's clients, to close at the end

    def __init__(self, backend: Backend) -> None:
        self.http = httpclient.InferenceServerClient(backend.http_url, network_timeout=120)
        self.grpc = grpcclient.InferenceServerClient(backend.grpc_url)
        self.opened.extend((self.http, self.grpc))

    def close(self) -> None:
        for client in self.opened:
            client.close()
        self.opened.clear()


def build(protocol: str, kind: str, value: float) -> dict[str, Any]:
    """The arguments of `client.infer` for one request of `kind`."""
    module = httpclient if protocol == "http" else grpcclient
    data = np.full((1, 4), value, np.float32)
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    arguments: dict[str, Any] = {"model_name": MODEL, "inputs": [tensor], "request_id": f"{kind}-{value}"}
    if kind == "big_id":
        arguments["request_id"] = f"{value}-" + "i" * BIG_ID
    elif kind == "many_outputs":
        arguments["outputs"] = [module.InferRequestedOutput("OUTPUT0") for _ in range(MANY_OUTPUTS)]
    elif kind == "big_parameter":
        arguments["parameters"] = {"note": "p" * BIG_PARAMETER}
    elif kind == "many_inputs":
        extra = []
        for index in range(MANY_INPUTS):
            other = module.InferInput(f"EXTRA{index}", [1, 1], "FP32")
            other.set_data_from_numpy(np.zeros((1, 1), np.float32))
            extra.append(other)
        arguments["inputs"] = [tensor, *extra]
    return arguments


KINDS = ("normal", "big_id", "normal", "many_outputs", "normal", "big_parameter", "normal", "normal",
         "many_inputs")


def one(clients: Clients, index: int) -> tuple[str, str, Any]:
    """Send request `index`; (kind, protocol, result): the response's (id, OUTPUT0, REQUESTS) or
    the InferenceServerException."""
    protocol = "http" if index % 2 else "grpc"
    kind = KINDS[index % len(KINDS)]
    value = float(index % 500)
    client = clients.http if protocol == "http" else clients.grpc
    arguments = build(protocol, kind, value)
    try:
        result = client.infer(**arguments)
    except InferenceServerException as exc:
        return kind, protocol, exc
    response = result.get_response()
    response_id = response["id"] if protocol == "http" else response.id
    requests_in_call = result.as_numpy("REQUESTS")
    batched = int(requests_in_call[0][0]) if requests_in_call is not None else 0
    return kind, protocol, (response_id, arguments["request_id"], result.as_numpy("OUTPUT0"), value, batched)


def test_oversize_metadata_is_served_and_never_fails_its_batch(backend: Backend) -> None:
    clients = Clients(backend)
    try:
        check_storm(backend, clients)
    finally:
        clients.close()


def check_storm(backend: Backend, clients: Clients) -> None:
    for index in range(2 * len(KINDS)):  # warm up: every kind once per protocol, arenas at their size
        one(clients, index)
    wait_for_baseline(backend, baseline := (0, 0, 0, accounting(backend)[3]))
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(lambda i: one(clients, i), range(REQUESTS)))
    shared = 0
    for kind, protocol, result in outcomes:
        if kind == "many_inputs":  # not in the model's config: refused before anything is allocated
            assert isinstance(result, InferenceServerException), (kind, protocol)
            assert str(result.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), result
            assert f"expected 1 inputs but got {MANY_INPUTS + 1} inputs" in result.message(), result.message()[:300]
            continue
        assert not isinstance(result, InferenceServerException), (kind, protocol, str(result)[:300])
        response_id, request_id, output, value, batched = result
        assert response_id == request_id, (kind, protocol)
        np.testing.assert_array_equal(output, np.full((1, 4), 2 * value, np.float32))
        if kind in ("big_id", "big_parameter") and batched > 1:
            shared += 1  # this oversize request ran in one execute call with others
    assert shared > 0, "no oversize request was batched with another one: the batch case went untested"
    wait_for_baseline(backend, baseline)
    assert "Traceback" not in backend.log()


@pytest.fixture(scope="module")
def echo_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("param_echo"), "param_echo")
    with module_backend(Backend(repository)) as started:
        yield started


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_large_parameters_travel_both_ways(echo_backend: Backend, protocol: str) -> None:
    """300 KB of request parameters reach the model; 300 KB of response parameters come back (a
    SPILLED frame from the stub, through s2p); the arenas are back at their baseline after."""
    module = httpclient if protocol == "http" else grpcclient
    client = (httpclient.InferenceServerClient(echo_backend.http_url, network_timeout=120) if protocol == "http"
              else grpcclient.InferenceServerClient(echo_backend.grpc_url))
    try:
        for pad in (16, 300_000, 16):
            tensor = module.InferInput("PAD_BYTES", [1], "INT32")
            tensor.set_data_from_numpy(np.array([pad], np.int32))
            result = client.infer("param_echo", [tensor], parameters={"sent": "s" * 300_000})
            response = result.get_response()
            if protocol == "http":
                parameters = {key: value for key, value in response["parameters"].items()}
            else:
                parameters = {key: value.string_param for key, value in response.parameters.items()}
            assert parameters["pad"] == "p" * pad
            assert json.loads(parameters["echo"]) == {"sent": "s" * 300_000}
    finally:
        client.close()
    rows = [row for row in json.loads(urllib.request.urlopen(  # noqa: S310 - loopback test server
        f"http://{echo_backend.http_url}/v2/pystub/stubs", timeout=30).read())["stubs"]]
    deadline = time.monotonic() + 30
    while any(r["arena_used_bytes"] or r["s2p_used_bytes"] or r["in_flight"] for r in rows):
        assert time.monotonic() < deadline, rows
        time.sleep(0.1)
        with urllib.request.urlopen(f"http://{echo_backend.http_url}/v2/pystub/stubs", timeout=30) as answer:
            rows = json.loads(answer.read())["stubs"]


def test_an_error_echoing_a_large_id_reaches_a_grpc_client_as_itself(echo_backend: Backend) -> None:
    """Validation errors start with `[request id: <id>]`: with a 140 KB id the status details
    would outgrow what a gRPC client accepts (it then reports RESOURCE_EXHAUSTED); they are cut."""
    client = grpcclient.InferenceServerClient(echo_backend.grpc_url)
    try:
        tensor = grpcclient.InferInput("PAD_BYTES", [1], "FP32")  # the model wants INT32
        tensor.set_data_from_numpy(np.array([1], np.float32))
        with pytest.raises(InferenceServerException) as error:
            client.infer("param_echo", [tensor], request_id="i" * BIG_ID)
        assert str(error.value.status()) == "StatusCode.INVALID_ARGUMENT", error.value
        assert error.value.message().startswith("[request id: iiii") and "characters cut]" in error.value.message()
    finally:
        client.close()
