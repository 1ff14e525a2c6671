"""pb_utils features, model by model: Triton vs pystub on the same requests.

Decoupled streams, BLS (plain and decoupled), sequences, dynamic batching, request and response
parameters, custom metrics, model control from a model, errors raised by models, generate and
generate_stream, repository load/unload, client system shared memory.
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from calls import agree, both, grpc_infer, grpc_stream, http_infer, raw
from deviations import agree_or_deviate
from oracle import Endpoint, Pair

ADD_SUB = [("INPUT0", np.arange(4, dtype=np.float32), "FP32"), ("INPUT1", np.ones(4, np.float32), "FP32")]

# The features (BLS, decoupled models, sequences, custom metrics, ...) live in the core and the
# stubs; the frontend workers' own protocol work is compared in test_infer.py and test_endpoints.py.
PYSTUB_VARIANTS_RUN = ("single-process",)


def _int(name: str, value: int) -> tuple[str, np.ndarray, str]:
    return (name, np.array([value], np.int32), "INT32")


def _post(endpoint: Endpoint, path: str, body: object) -> list:
    reply = raw(endpoint, "POST", path, body)  # type: ignore[arg-type]
    try:
        return [reply.status, reply.json()]
    except ValueError:
        return [reply.status, reply.body.decode(errors="replace")]


# -- errors raised by models ---------------------------------------------------------------------

RAISER_MODES = {0: "ok", 1: "raises_value_error", 2: "error_response", 3: "invalid_arg", 4: "unknown_output",
                5: "no_responses", 6: "wrong_output_dtype", 7: "model_exception", 8: "unavailable",
                9: "not_found", 10: "unsupported", 11: "returns_none", 12: "returns_string", 13: "already_exists",
                14: "raises_in_helper"}
HANG = 5.0   # seconds: how long a request Triton never answers is waited for
_TRACEBACK = re.compile(r"\n\nAt:\n.*", re.S)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", sorted(RAISER_MODES), ids=[RAISER_MODES[m] for m in sorted(RAISER_MODES)])
def test_model_errors(pair: Pair, mode: int, protocol: str) -> None:
    call = http_infer if protocol == "http" else grpc_infer
    triton, pystub = both(pair, call, "raiser", [_int("MODE", mode)], ["OUTPUT0"], timeout=HANG)
    if mode == 11:
        # Deliberate deviation: Triton 2.51 never answers a request whose execute returned None
        # (the client waits forever); pystub fails it with the response-sender error.
        assert triton == {"timeout": HANG}
        assert "was destroyed before it sent the final response" in pystub["error"]
        return
    agree(triton, pystub)


@pytest.mark.parametrize("mode", [1, 7], ids=["raises_value_error", "model_exception"])
def test_model_errors_without_traceback(pair: Pair, mode: int) -> None:
    """The same as above with Triton's "At: <traceback>" tail and instance name normalised away."""
    triton, pystub = both(pair, grpc_infer, "raiser", [_int("MODE", mode)], ["OUTPUT0"])
    for answer in (triton, pystub):
        answer["error"] = re.sub(r"'raiser_0(_0)?'", "'raiser'", _TRACEBACK.sub("", answer["error"]))
    agree(triton, pystub)


# -- decoupled ----------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [0, 1, 3, -1], ids=["zero", "one", "three", "error"])
def test_decoupled_stream(pair: Pair, count: int) -> None:
    triton, pystub = both(pair, grpc_stream, "repeat", [[_int("IN", count)]], ["OUT"],
                          expected_finals=2 if count < 0 else 1)
    agree(triton, pystub)


def test_decoupled_stream_two_requests(pair: Pair) -> None:
    """Each request's responses, in order, and the id they carry. Whether the two requests share
    one execute (and so how their responses interleave) depends on when the second arrives, in
    either server, so the interleaving is not compared."""
    triton, pystub = both(pair, grpc_stream, "repeat", [[_int("IN", 2)], [_int("IN", 1)]], ["OUT"], with_ids=True)
    agree(_by_request(triton), _by_request(pystub))


def _by_request(responses: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for response in responses:
        rest = dict(response)
        grouped.setdefault(rest.pop("id"), []).append(rest)
    return grouped


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_decoupled_unary_infer(pair: Pair, protocol: str) -> None:
    """A decoupled model called through the unary infer API."""
    call = http_infer if protocol == "http" else grpc_infer
    triton, pystub = both(pair, call, "repeat", [_int("IN", 1)], ["OUT"])
    agree(triton, pystub)


def test_stream_on_unary_model(pair: Pair) -> None:
    triton, pystub = both(pair, grpc_stream, "add_sub", [ADD_SUB], ["OUTPUT0", "OUTPUT1"])
    agree(triton, pystub)


# -- generate -------------------------------------------------------------------------------------

GENERATE_CASES = {
    "gen_ok": ("gen", "generate", {"text_input": "hello world"}),
    "gen_with_parameters": ("gen", "generate", {"text_input": "abc", "parameters": {"x": 1}}),
    "gen_missing_input": ("gen", "generate", {}),
    "gen_unknown_field": ("gen", "generate", {"text_input": "a", "bogus": 3}),
    "gen_bad_json": ("gen", "generate", b"{"),
    "gen_number_input": ("gen", "generate", {"text_input": 7}),
    "gen_unknown_model": ("no_such_model", "generate", {"text_input": "a"}),
    "gen_on_decoupled": ("gen_stream", "generate", {"text_input": "a b"}),
    "stream_ok": ("gen_stream", "generate_stream", {"text_input": "one two three"}),
    "stream_on_unary_model": ("gen", "generate_stream", {"text_input": "x y"}),
    "stream_missing_input": ("gen_stream", "generate_stream", {}),
}


@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
def test_generate(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    model, endpoint_name, body = GENERATE_CASES[case]
    triton, pystub = both(pair, _post, f"/v2/models/{model}/{endpoint_name}", body)
    if isinstance(triton[1], str):   # an event stream: compare the events' JSON
        triton[1], pystub[1] = (re.findall(r"data: (.*)", text) for text in (triton[1], pystub[1]))
        triton[1], pystub[1] = ([__import__("json").loads(e) for e in events] for events in (triton[1], pystub[1]))
    agree_or_deviate(request.node.name, triton, pystub)


# -- BLS ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["add_sub", "no_such_model", "raiser", "loadable"])
def test_bls(pair: Pair, target: str) -> None:
    tensors = [*ADD_SUB, ("MODEL", np.array([target.encode()], np.object_), "BYTES")]
    triton, pystub = both(pair, grpc_infer, "bls_caller", tensors, ["OUTPUT0", "OUTPUT1"])
    agree(triton, pystub)


@pytest.mark.parametrize("count", [0, 2, 5, -1], ids=["zero", "two", "five", "error"])
def test_bls_decoupled(pair: Pair, count: int) -> None:
    triton, pystub = both(pair, grpc_infer, "bls_stream", [_int("IN", count)], ["OUTS", "RESPONSES"], timeout=HANG)
    if count < 0:
        # Deliberate deviation: in Triton 2.51 a decoupled BLS call whose model sends an error
        # response and then the final flag never ends its iterator (the outer request hangs);
        # pystub ends it, and the model sees the error.
        assert triton == {"timeout": HANG}
        assert pystub == {"status": "StatusCode.INTERNAL", "error": "inner: negative count"}
        return
    agree(triton, pystub)


# -- sequences ------------------------------------------------------------------------------------

def _sequence(endpoint: Endpoint, steps: list[tuple[int, int, bool, bool]], protocol: str) -> list:
    """Send (correlation id, value, start, end) steps in order; each answer's OUTPUT and FLAGS."""
    answers = []
    call = http_infer if protocol == "http" else grpc_infer
    for cid, value, start, end in steps:
        tensors = [("INPUT", np.array([[value]], np.int32), "INT32")]
        answers.append(call(endpoint, "seq_acc", tensors, ["OUTPUT", "FLAGS"], sequence_id=cid,
                            sequence_start=start, sequence_end=end))
    return answers


SEQUENCES = {
    "one_sequence": [(101, 1, True, False), (101, 2, False, False), (101, 3, False, True)],
    "interleaved": [(201, 1, True, False), (202, 10, True, False), (201, 2, False, True), (202, 20, False, True)],
    "restart": [(301, 5, True, False), (301, 1, True, True)],
    "no_start": [(401, 1, False, False)],
    "no_correlation_id": [(0, 1, False, False)],
    "after_end": [(501, 1, True, True), (501, 1, False, True)],
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(SEQUENCES))
def test_sequence(pair: Pair, case: str, protocol: str) -> None:
    offset = 1000 if protocol == "grpc" else 0   # distinct correlation ids per protocol
    steps = [(cid + offset if cid else 0, v, s, e) for cid, v, s, e in SEQUENCES[case]]
    triton, pystub = both(pair, _sequence, steps, protocol)
    agree(triton, pystub)


def test_sequence_string_id(pair: Pair) -> None:
    def run(endpoint: Endpoint) -> list:
        return [http_infer(endpoint, "seq_acc", [("INPUT", np.array([[v]], np.int32), "INT32")], ["OUTPUT"],
                           sequence_id="seq-a", sequence_start=s, sequence_end=e)
                for v, s, e in ((4, True, False), (5, False, True))]
    triton, pystub = both(pair, run)
    agree(triton, pystub)


# -- dynamic batching -----------------------------------------------------------------------------

def _concurrent(endpoint: Endpoint, count: int) -> list:
    """`count` requests at once; each answer's OUTPUT0 and the largest BATCH seen."""
    answers: list = [None] * count
    def one(i: int) -> None:
        answers[i] = grpc_infer(endpoint, "dyn_batch", [("INPUT0", np.full((1, 2), i, np.float32), "FP32")],
                                ["OUTPUT0", "BATCH"])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(a is not None for a in answers), f"{endpoint.name}: a dyn_batch request did not answer in 60 s"
    return [[a["ok"]["OUTPUT0"] for a in answers], max(a["ok"]["BATCH"][2][0] for a in answers)]


@pytest.mark.parametrize("count", [1, 4])
def test_dynamic_batching(pair: Pair, count: int) -> None:
    triton, pystub = both(pair, _concurrent, count)
    agree(triton[0], pystub[0])
    assert triton[1] > 1 if count == 4 else triton[1] == 1
    agree(triton[1] > 1, pystub[1] > 1)


def test_dynamic_batching_too_large(pair: Pair) -> None:
    tensors = [("INPUT0", np.ones((9, 2), np.float32), "FP32")]
    triton, pystub = both(pair, grpc_infer, "dyn_batch", tensors, ["OUTPUT0"])
    agree(triton, pystub)


# -- parameters -----------------------------------------------------------------------------------

PARAMETERS = {"none": {}, "mixed": {"a": 1, "b": "two", "c": True}, "negative": {"n": -5},
              "float": {"f": 1.5}}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(PARAMETERS))
def test_request_parameters(pair: Pair, case: str, protocol: str) -> None:
    call = http_infer if protocol == "http" else grpc_infer
    triton, pystub = both(pair, call, "params_echo", [_int("INPUT0", 0)], ["PARAMS"], parameters=PARAMETERS[case])
    agree(triton, pystub)


def test_response_parameters(pair: Pair) -> None:
    """Deliberate deviation: pystub implements InferenceResponse(parameters=...) of newer Python
    backends; Triton 2.51's pb_utils has no such argument and fails the request."""
    triton, pystub = both(pair, _post, "/v2/models/params_echo/infer",
                          {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]})
    assert triton[0] == 500 and "incompatible constructor arguments" in triton[1]["error"]
    assert pystub[0] == 200 and pystub[1]["parameters"] == {"echo": True, "count": 3, "word": "ok"}


@pytest.mark.parametrize("name", ["sequence_id", "priority", "timeout", "binary_data_output"])
def test_reserved_parameters(pair: Pair, name: str, request: pytest.FixtureRequest) -> None:
    body = {"parameters": {name: 1}, "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [0]}]}
    triton, pystub = both(pair, _post, "/v2/models/params_echo/infer", body)
    agree_or_deviate(request.node.name, triton, pystub)


# -- custom metrics -------------------------------------------------------------------------------

def _counter_lines(endpoint: Endpoint) -> list[str]:
    text = raw(endpoint, "GET", "/metrics", port=endpoint.metrics_port).body.decode()
    return sorted(line for line in text.splitlines() if "diff_" in line)


def test_custom_metrics(pair: Pair) -> None:
    inferences = [both(pair, grpc_infer, "counter", [("INPUT0", np.array([v], np.float32), "FP32")], ["TOTAL"])
               for v in (2.0, 3.0, -1.0)]
    for triton, pystub in inferences:
        agree(triton, pystub)
    agree(*both(pair, _counter_lines))


# -- repository load/unload and model control from a model -----------------------------------------

def _repo(endpoint: Endpoint, action: str, model: str, body: object = None) -> list:
    return _post(endpoint, f"/v2/repository/models/{model}/{action}", body)


def _ready(endpoint: Endpoint, model: str) -> int:
    return raw(endpoint, "GET", f"/v2/models/{model}/ready").status


def test_repository_load_unload_cycle(pair: Pair) -> None:
    steps = []
    for action in ("load", "load", "unload", "unload"):
        triton, pystub = both(pair, _repo, action, "loadable")
        steps.append((triton, pystub, *both(pair, _ready, "loadable")))
    for triton, pystub, ready_t, ready_p in steps:
        agree([triton, ready_t], [pystub, ready_p])


@pytest.mark.parametrize("case", ["unknown_model", "init_fails", "bad_json", "bad_config_override",
                                  "unknown_model_unload"])
def test_repository_errors(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    action, model, body = {
        "unknown_model": ("load", "never_in_repository", None),
        "init_fails": ("load", "init_fails", None),
        "bad_json": ("load", "loadable", b"{"),
        "bad_config_override": ("load", "loadable", {"parameters": {"config": "{not json"}}),
        "unknown_model_unload": ("unload", "no_such_model", None),
    }[case]
    triton, pystub = both(pair, _repo, action, model, body)
    if case == "init_fails":   # Triton's text carries its own file path and traceback layout
        for answer in (triton, pystub):
            answer[1]["error"] = re.sub(r"\n\nAt:\n.*", "", answer[1]["error"], flags=re.S)
    both(pair, _repo, "unload", "loadable")
    agree_or_deviate(request.node.name, triton, pystub)


def test_repository_load_grpc(pair: Pair) -> None:
    def cycle(endpoint: Endpoint) -> list:
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        answers = []
        try:
            for call in (client.load_model, client.unload_model):
                try:
                    call("loadable")
                    time.sleep(0.2)
                    answers.append(client.is_model_ready("loadable"))
                except Exception as error:  # noqa: BLE001 - status and text are compared
                    answers.append([error.status(), error.message()])  # type: ignore[attr-defined]
            try:
                client.load_model("never_in_repository")
            except Exception as error:  # noqa: BLE001
                answers.append([error.status(), error.message()])  # type: ignore[attr-defined]
            return answers
        finally:
            client.close()
    triton, pystub = both(pair, cycle)
    agree(triton, pystub)


@pytest.mark.parametrize("sequence", [("ready",), ("load", "ready", "unload", "ready"), ("load_missing",)],
                         ids=["ready", "load_unload", "load_missing"])
def test_model_control_from_model(pair: Pair, sequence: tuple[str, ...]) -> None:
    def run(endpoint: Endpoint) -> list:
        answers = []
        for step in sequence:
            action = "load:never_in_repository" if step == "load_missing" else f"{step}:loadable"
            tensors = [("ACTION", np.array([action.encode()], np.object_), "BYTES")]
            answers.append(grpc_infer(endpoint, "controller", tensors, ["READY"]))
        return answers
    triton, pystub = both(pair, run)
    both(pair, _repo, "unload", "loadable")
    agree(triton, pystub)


def test_infer_after_failed_load(pair: Pair) -> None:
    """A model that a load request named but the repository never had is still unknown afterwards."""
    def run(endpoint: Endpoint) -> list:
        load = _repo(endpoint, "load", "absent_after_load")
        return [load[0], http_infer(endpoint, "absent_after_load", ADD_SUB, ["OUTPUT0"]),
                _ready(endpoint, "absent_after_load")]
    triton, pystub = both(pair, run)
    agree(triton[1:], pystub[1:])


# -- client system shared memory ------------------------------------------------------------------

SHM_CASES = ["status_empty", "register_missing_key", "unregister_unknown", "status_unknown", "register_bad_json"]


@pytest.mark.parametrize("case", SHM_CASES)
def test_system_shared_memory_http(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    path, method, body = {
        "status_empty": ("/v2/systemsharedmemory/status", "GET", None),
        "register_missing_key": ("/v2/systemsharedmemory/region/r1/register", "POST",
                                 {"key": "/no_such_shm_key_differential", "offset": 0, "byte_size": 16}),
        "unregister_unknown": ("/v2/systemsharedmemory/region/nope/unregister", "POST", None),
        "status_unknown": ("/v2/systemsharedmemory/region/nope/status", "GET", None),
        "register_bad_json": ("/v2/systemsharedmemory/region/r2/register", "POST", b"{"),
    }[case]

    def send(endpoint: Endpoint) -> list:
        reply = raw(endpoint, method, path, body)
        return [reply.status, reply.json()]
    triton, pystub = both(pair, send)
    agree_or_deviate(request.node.name, triton, pystub)


def test_system_shared_memory_infer(pair: Pair) -> None:
    import mmap

    import posix_ipc

    def run(endpoint: Endpoint) -> list:
        client = httpclient.InferenceServerClient(endpoint.http_url, network_timeout=60)
        key = f"/diffshm_{endpoint.name}_{time.monotonic_ns()}"
        region = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=32)
        try:
            with mmap.mmap(region.fd, 32) as view:
                view[:] = ADD_SUB[0][1].tobytes() + ADD_SUB[1][1].tobytes()
            client.register_system_shared_memory("diff_in", key, 32)
            status = client.get_system_shared_memory_status()
            inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_shared_memory("diff_in", 16)
            inputs[1].set_shared_memory("diff_in", 16, offset=16)
            result = client.infer("add_sub", inputs)
            client.unregister_system_shared_memory("diff_in")
            return [sorted((s["name"], s["byte_size"]) for s in status),
                    result.as_numpy("OUTPUT0").tolist(), client.get_system_shared_memory_status()]
        finally:
            region.close_fd()
            region.unlink()
            client.close()
    triton, pystub = both(pair, run)
    agree(triton, pystub)
