"""The trace extension's settings: Triton vs pystub over HTTP and gRPC.

Both servers run with the default trace settings (mode triton, level OFF). Updates here either
fail (and change nothing) or set a model's own setting and clear it again, so the tier's other
files see the defaults.
"""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from calls import agree, both, raw
from oracle import Endpoint, Pair

PAIR_MODELS = ("add_sub",)

_GLOBAL = "/v2/trace/setting"


def _answer(endpoint: Endpoint, method: str, path: str, body: object = None) -> tuple[int, Any]:
    reply = raw(endpoint, method, path, body)  # type: ignore[arg-type]
    return reply.status, reply.json()


@pytest.mark.parametrize("path", [_GLOBAL, "/v2/models/add_sub/trace/setting", "/v2/models/no_such_model/trace/setting",
                                  "/v2/models/loadable/trace/setting"])
def test_get(pair: Pair, path: str) -> None:
    triton, pystub = both(pair, _answer, "GET", path)
    agree(triton, pystub)


REFUSED = {
    "count_not_a_number": {"trace_count": "abc"},
    "count_below_minus_one": {"trace_count": "-5"},
    "file": {"trace_file": "/tmp/elsewhere.json"},
    "not_a_string": {"trace_rate": 3},
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_update(pair: Pair, case: str) -> None:
    triton, pystub = both(pair, _answer, "POST", _GLOBAL, REFUSED[case])
    agree(triton, pystub)
    agree(*both(pair, _answer, "GET", _GLOBAL))  # nothing changed


def test_model_setting_and_clear(pair: Pair) -> None:
    path = "/v2/models/add_sub/trace/setting"
    agree(*both(pair, _answer, "POST", path, {"trace_rate": "7", "log_frequency": "3"}))
    agree(*both(pair, _answer, "GET", path))
    agree(*both(pair, _answer, "GET", _GLOBAL))  # the global settings are not the model's
    agree(*both(pair, _answer, "POST", path, {"trace_rate": None, "log_frequency": None}))
    agree(*both(pair, _answer, "POST", "/v2/models/no_such_model/trace/setting", {"trace_rate": "7"}))


def test_grpc_model_setting_and_clear(pair: Pair) -> None:
    def call(endpoint: Endpoint, settings: dict[str, Any] | None) -> object:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            if settings is None:
                return client.get_trace_settings("add_sub", as_json=True)
            return client.update_trace_settings("add_sub", settings, as_json=True)
        finally:
            client.close()

    agree(*both(pair, call, {"trace_count": "5"}))
    agree(*both(pair, call, None))
    agree(*both(pair, call, {"trace_count": None}))
