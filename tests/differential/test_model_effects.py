"""What a model's pb_utils calls show to clients: custom metrics as soon as they are made, the
responses of a non-decoupled model that sends through its response sender, and explicit loads
whose override config names a model the directory cannot hold.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from calls import agree, both, grpc_infer, grpc_stream, http_infer, raw
from oracle import Endpoint, Pair
from tritonclient.utils import InferenceServerException

# What a model's pb_utils calls do lives in the core and the stubs; the frontend workers' own
# protocol work is compared in test_infer.py and test_endpoints.py.
PYSTUB_VARIANTS_RUN = ("single-process",)
PAIR_MODELS = ("metric_maker", "send_twice")  # `loadable` is loaded through the repository API

HANG = 5.0   # seconds: how long a request Triton never answers is waited for


def _bytes(name: str, text: str) -> tuple[str, np.ndarray, str]:
    return (name, np.array([text.encode()], np.object_), "BYTES")


# -- custom metrics are on /metrics once made --------------------------------------------------------

def _made(endpoint: Endpoint, label: str) -> dict:
    """metric_maker creates the series labelled `label` and reads its own server's /metrics at once."""
    return http_infer(endpoint, "metric_maker", [_bytes("LABEL", label), _bytes("METRICS_URL", endpoint.metrics_url)],
                      ["LINES"])


@pytest.mark.parametrize("label", ["first", "second"])
def test_metrics_are_shown_when_made(pair: Pair, label: str) -> None:
    """Histogram (_count, _sum, every _bucket at 0), counter and gauge, before any value is set."""
    triton, pystub = both(pair, _made, label)
    assert triton["ok"]["LINES"][2], f"Triton showed no series: {triton}"
    agree(triton, pystub)


def test_family_without_metrics_is_not_shown(pair: Pair) -> None:
    def lines(endpoint: Endpoint) -> list[str]:
        _made(endpoint, "family_check")   # metric_maker is initialized, so its families exist
        text = raw(endpoint, "GET", "/metrics", port=endpoint.metrics_port).body.decode()
        return [line for line in text.splitlines() if "diff_made_unused" in line]
    agree(*both(pair, lines))


# -- a non-decoupled model that sends a second response ----------------------------------------------

def _stream(endpoint: Endpoint, mode: int) -> list[dict]:
    return grpc_stream(endpoint, "send_twice", [[("MODE", np.array([mode], np.int32), "INT32")]], ["OUT"])


def _second_send(endpoint: Endpoint) -> dict:
    """What the model's second send raised (MODE 2 answers it)."""
    return http_infer(endpoint, "send_twice", [("MODE", np.array([2], np.int32), "INT32")], ["OUT"])


CALLS = {"http": http_infer, "grpc": grpc_infer}


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc_stream"])
def test_second_send_of_non_decoupled_model(pair: Pair, protocol: str) -> None:
    """Both sends carry the final flag: the client gets the first response only; the second send
    raises in the model."""
    def run(endpoint: Endpoint) -> list:
        if protocol == "grpc_stream":
            answer: object = _stream(endpoint, 1)
        else:
            answer = CALLS[protocol](endpoint, "send_twice", [("MODE", np.array([1], np.int32), "INT32")], ["OUT"])
        return [answer, _second_send(endpoint)]
    triton, pystub = both(pair, run)
    assert triton[1]["ok"]["OUT"][2] == ["TritonModelException: Unable to send response. Non-decoupled model "
                                         "cannot send more than one response."]
    agree(triton, pystub)


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc_stream"])
def test_second_send_without_final_flag(pair: Pair, protocol: str) -> None:
    """Deliberate deviation (docs/triton-differences.md): sends without the final flag. Triton 2.51
    never answers such a request; pystub answers with the first response, as its one (final)
    response, and nothing after it. The second send raises in the model on both."""
    def triton_answer(endpoint: Endpoint) -> object:
        tensors = [("MODE", np.array([0], np.int32), "INT32")]
        if protocol != "grpc_stream":
            return CALLS[protocol](endpoint, "send_twice", tensors, ["OUT"], timeout=HANG)
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        received: list = []
        try:
            client.start_stream(callback=lambda result, error: received.append((result, error)),
                                stream_timeout=HANG)
            inputs = [grpcclient.InferInput("MODE", [1], "INT32")]
            inputs[0].set_data_from_numpy(tensors[0][1])
            client.async_stream_infer("send_twice", inputs, enable_empty_final_response=True)
        finally:
            client.stop_stream()   # waits until the stream's deadline ended it
            client.close()
        return {"responses before the stream's deadline": len([r for r, _ in received if r is not None])}
    triton = triton_answer(pair.triton)
    expected_timeout = ({"responses before the stream's deadline": 0} if protocol == "grpc_stream"
                        else {"timeout": HANG})
    assert triton == expected_timeout, triton
    first = {"OUT": ["object", [1], ["first"]]}
    if protocol == "grpc_stream":
        assert _stream(pair.pystub, 0) == [{"final": True, "outputs": first}]
    else:
        assert CALLS[protocol](pair.pystub, "send_twice", [("MODE", np.array([0], np.int32), "INT32")],
                               ["OUT"]) == {"ok": first}
    agree(_second_send(pair.triton), _second_send(pair.pystub))


# -- explicit loads naming another model -------------------------------------------------------------

def _config(name: str) -> str:
    return json.dumps({"name": name, "backend": "python", "max_batch_size": 0,
                       "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}]})


LOAD_NAMES = {"other_model": "other", "braces": "{loadable}", "slash": "a/b", "space": "load able", "dots": "..",
              "empty_name": "", "same_name": "loadable"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(LOAD_NAMES))
def test_load_with_config_naming_another_model(pair: Pair, case: str, protocol: str) -> None:
    def load(endpoint: Endpoint) -> list:
        config = _config(LOAD_NAMES[case])
        if protocol == "http":
            reply = raw(endpoint, "POST", "/v2/repository/models/loadable/load", {"parameters": {"config": config}})
            answer: list = [reply.status, reply.json()]
        else:
            client = grpcclient.InferenceServerClient(endpoint.grpc_url)
            try:
                client.load_model("loadable", config=config)
                answer = ["loaded"]
            except InferenceServerException as error:
                answer = [error.status(), error.message()]
            finally:
                client.close()
        ready = raw(endpoint, "GET", "/v2/models/loadable/ready").status
        raw(endpoint, "POST", "/v2/repository/models/loadable/unload")
        return [answer, ready]
    agree(*both(pair, load))


@pytest.mark.parametrize("name", ["a{b}", "no_such_model_here"])
def test_load_of_a_name_the_repository_cannot_hold(pair: Pair, name: str) -> None:
    def load(endpoint: Endpoint) -> list:
        reply = raw(endpoint, "POST", f"/v2/repository/models/{name}/load", {"parameters": {"config": _config(name)}})
        return [reply.status, reply.json()]
    agree(*both(pair, load))

