"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern` in RE2's syntax: Triton vs pystub.

Both servers get the same patterns (PAIR_FLAGS), one case-sensitive (`(?-i)`), one case-blind
and unanchored; params_echo returns the parameters its request carried (as the model reads them:
one JSON object, the last of two same-named entries), so a case compares which headers arrived,
under which names, with which values, over HTTP (names as sent) and gRPC (keys lowercase), unary
and streamed.
"""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from calls import agree, both
from oracle import Endpoint, Pair

PAIR_MODELS = ("params_echo",)
PAIR_FLAGS = ("--http-header-forward-pattern=(?-i)PREFIX_.*|x-(a|b)", "--grpc-header-forward-pattern=prefix_|^x-t")
_TIMEOUT = 60.0

HEADERS = {
    "mixed_case": {"PREFIX_a": "1", "prefix_b": "2", "xPREFIX_c": "3", "Prefix_D": "4", "PREFIX_": "5"},
    "alternatives": {"x-a": "1", "x-ab": "2", "X-B": "3", "x-c": "4", "my-x-tenant": "5", "x-trace": "6"},
    "none_match": {"other": "1", "PREFIX": "2"},
}


def _input(module: object) -> list:
    tensor = module.InferInput("INPUT0", [1], "INT32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([0], np.int32))
    return [tensor]


def _http(endpoint: Endpoint, headers: dict[str, str], parameters: dict | None = None) -> dict:
    client = httpclient.InferenceServerClient(endpoint.http_url, network_timeout=_TIMEOUT)
    try:
        result = client.infer("params_echo", _input(httpclient), headers=dict(headers), parameters=parameters)
        return json.loads(result.as_numpy("PARAMS")[0])
    finally:
        client.close()


def _grpc(endpoint: Endpoint, headers: dict[str, str]) -> dict:
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    try:
        metadata = {name.lower(): value for name, value in headers.items()}  # gRPC keys are lowercase
        result = client.infer("params_echo", _input(grpcclient), headers=metadata, client_timeout=_TIMEOUT)
        return json.loads(result.as_numpy("PARAMS")[0])
    finally:
        client.close()


def _grpc_stream(endpoint: Endpoint, headers: dict[str, str]) -> dict:
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    results: queue.Queue = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)),
                            headers={name.lower(): value for name, value in headers.items()})
        client.async_stream_infer("params_echo", _input(grpcclient))
        result, error = results.get(timeout=_TIMEOUT)
        assert error is None, f"{endpoint.name}: {error}"
        return json.loads(result.as_numpy("PARAMS")[0])
    finally:
        client.stop_stream()
        client.close()


CALLS = {"http": _http, "grpc": _grpc, "grpc_stream": _grpc_stream}


@pytest.mark.parametrize("protocol", sorted(CALLS))
@pytest.mark.parametrize("case", sorted(HEADERS))
def test_forwarded_headers(pair: Pair, case: str, protocol: str) -> None:
    agree(*both(pair, CALLS[protocol], HEADERS[case]))


def test_a_header_and_a_parameter_of_one_name(pair: Pair) -> None:
    """Triton appends the header after the request's own parameter; the model reads the last."""
    agree(*both(pair, _http, {"PREFIX_x": "header"}, {"PREFIX_x": "parameter", "kept": "yes"}))
