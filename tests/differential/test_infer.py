"""Inference over HTTP (JSON, binary, raw bodies) and gRPC, good and bad: Triton vs pystub.

Outputs are compared as (dtype, shape, values); errors as (status, message) where tritonclient
surfaces them, and as (HTTP status, JSON body) for raw requests the client would refuse to send.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from calls import agree, both, grpc_infer, http_infer, raw
from deviations import agree_or_deviate
from oracle import Endpoint, Pair

F4 = np.arange(4, dtype=np.float32)
ONES = np.ones(4, dtype=np.float32)
ADD_SUB = [("INPUT0", F4, "FP32"), ("INPUT1", ONES, "FP32")]
OUTS = ["OUTPUT0", "OUTPUT1"]


def _post(endpoint: Endpoint, path: str, body: object, headers: dict[str, str] | None = None) -> list:
    reply = raw(endpoint, "POST", path, body, headers)  # type: ignore[arg-type]
    try:
        return [reply.status, reply.json()]
    except ValueError:
        return [reply.status, reply.body.decode(errors="replace")]


def _tensor(name: str, shape: list[int], datatype: str, data: object) -> dict:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


GOOD_ADD = [_tensor("INPUT0", [4], "FP32", [0, 1, 2, 3]), _tensor("INPUT1", [4], "FP32", [1, 1, 1, 1])]

JSON_CASES = {
    "ok": ("add_sub", {"inputs": GOOD_ADD}),
    "ok_with_id": ("add_sub", {"id": "req-7", "inputs": GOOD_ADD}),
    "ok_requested_output": ("add_sub", {"inputs": GOOD_ADD, "outputs": [{"name": "OUTPUT1"}]}),
    "ok_nested_data": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "FP32", [[0, 1], [2, 3]]), GOOD_ADD[1]]}),
    "ok_binary_output_param": ("add_sub", {"inputs": GOOD_ADD, "parameters": {"binary_data_output": False}}),
    "bad_json": ("add_sub", b"{"),
    "empty_object": ("add_sub", {}),
    "inputs_not_list": ("add_sub", {"inputs": {"name": "INPUT0"}}),
    "input_without_datatype": ("add_sub", {"inputs": [{"name": "INPUT0", "shape": [4], "data": [1, 2, 3, 4]},
                                                      GOOD_ADD[1]]}),
    "input_without_shape": ("add_sub", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1, 2, 3, 4]},
                                                   GOOD_ADD[1]]}),
    "wrong_datatype": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "INT32", [1, 2, 3, 4]), GOOD_ADD[1]]}),
    "unknown_datatype": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "FP128", [1, 2, 3, 4]), GOOD_ADD[1]]}),
    "wrong_shape": ("add_sub", {"inputs": [_tensor("INPUT0", [3], "FP32", [1, 2, 3]), GOOD_ADD[1]]}),
    "data_count_mismatch": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "FP32", [1, 2, 3]), GOOD_ADD[1]]}),
    "missing_input": ("add_sub", {"inputs": [GOOD_ADD[0]]}),
    "extra_input": ("add_sub", {"inputs": [*GOOD_ADD, _tensor("INPUT2", [4], "FP32", [1, 2, 3, 4])]}),
    "duplicate_input": ("add_sub", {"inputs": [*GOOD_ADD, GOOD_ADD[0]]}),
    "unknown_output": ("add_sub", {"inputs": GOOD_ADD, "outputs": [{"name": "NOPE"}]}),
    "string_in_fp32": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "FP32", ["a", "b", "c", "d"]), GOOD_ADD[1]]}),
    "negative_shape": ("add_sub", {"inputs": [_tensor("INPUT0", [-4], "FP32", [1, 2, 3, 4]), GOOD_ADD[1]]}),
    "batch_too_large": ("batched", {"inputs": [_tensor("INPUT0", [5, 1], "FP32", [1, 2, 3, 4, 5])]}),
    "batch_dim_missing": ("batched", {"inputs": [_tensor("INPUT0", [2], "FP32", [1, 2])]}),
    "batched_ok": ("batched", {"inputs": [_tensor("INPUT0", [2, 3], "FP32", [1, 2, 3, 4, 5, 6])]}),
    "bytes_json": ("bytes_echo", {"inputs": [_tensor("INPUT0", [2], "BYTES", ["abc", "xy"])]}),
    "bytes_json_number": ("bytes_echo", {"inputs": [_tensor("INPUT0", [1], "BYTES", [5])]}),
    "bytes_empty_tensor": ("bytes_echo", {"inputs": [_tensor("INPUT0", [0], "BYTES", [])]}),
    "bf16_json": ("bf16_echo", {"inputs": [_tensor("INPUT0", [2], "BF16", [1, 2])]}),
    "bool_json": ("controller", {"inputs": [_tensor("ACTION", [1], "BOOL", [True])]}),
    "unknown_model": ("no_such_model", {"inputs": GOOD_ADD}),
    "unloaded_model": ("loadable", {"inputs": [_tensor("INPUT0", [1], "INT32", [1])]}),
    "body_is_array": ("add_sub", [1, 2]),
    "fp32_too_large": ("add_sub", {"inputs": [_tensor("INPUT0", [4], "FP32", [1e39, 1, 1, 1]), GOOD_ADD[1]]}),
    "int32_out_of_range": ("raiser", {"inputs": [_tensor("MODE", [1], "INT32", [2 ** 40])]}),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_http_json(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    model, body = JSON_CASES[case]
    triton, pystub = both(pair, _post, f"/v2/models/{model}/infer", body)
    agree_or_deviate(request.node.name, triton, pystub)


@pytest.mark.parametrize("path", ["/v2/models/add_sub/versions/1/infer", "/v2/models/add_sub/versions/3/infer",
                                  "/v2/models/add_sub/versions/x/infer"])
def test_http_json_versions(pair: Pair, path: str) -> None:
    triton, pystub = both(pair, _post, path, {"inputs": GOOD_ADD})
    agree(triton, pystub)


def test_http_infer_wrong_method(pair: Pair) -> None:
    triton, pystub = both(pair, lambda e: raw(e, "GET", "/v2/models/add_sub/infer").status)
    agree(triton, pystub)


def _binary_body(header: dict, blobs: list[bytes], declared: int | None = None) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    length = len(text) if declared is None else declared
    return text + b"".join(blobs), {"Inference-Header-Content-Length": str(length),
                                     "Content-Type": "application/octet-stream"}


def _binary_inputs(size0: int = 16) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": size0}},
                       {"name": "INPUT1", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}


BLOBS = [F4.tobytes(), ONES.tobytes()]
BINARY_CASES = {
    "ok": (_binary_inputs(), BLOBS, None),
    "header_length_too_large": (_binary_inputs(), BLOBS, 100000),
    "header_length_too_small": (_binary_inputs(), BLOBS, 5),
    "size_mismatch": (_binary_inputs(12), BLOBS, None),
    "missing_blob": (_binary_inputs(), BLOBS[:1], None),
    "trailing_bytes": (_binary_inputs(), [*BLOBS, b"xx"], None),
}


@pytest.mark.parametrize("case", sorted(BINARY_CASES))
def test_http_binary_raw(pair: Pair, case: str, request: pytest.FixtureRequest) -> None:
    header, blobs, declared = BINARY_CASES[case]
    body, headers = _binary_body(header, blobs, declared)

    def send(endpoint: Endpoint) -> list:
        reply = raw(endpoint, "POST", "/v2/models/add_sub/infer", body, headers)
        if reply.status != 200:
            return [reply.status, reply.json()]
        json_length = int(reply.headers.get("inference-header-content-length", len(reply.body)))
        return [reply.status, json.loads(reply.body[:json_length]), len(reply.body) - json_length]
    triton, pystub = both(pair, send)
    agree_or_deviate(request.node.name, triton, pystub)


def test_http_binary_bytes_raw(pair: Pair) -> None:
    blob = b"".join(struct.pack("<I", len(s)) + s for s in (b"hello", b"", b"\xff\x00"))
    header = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(blob)}}],
              "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "LENGTH"}]}
    body, headers = _binary_body(header, [blob])
    triton, pystub = both(pair, _post, "/v2/models/bytes_echo/infer", body, headers)
    agree(triton, pystub)


CLIENT_CASES = {
    "add_sub": ("add_sub", ADD_SUB, OUTS),
    "add_sub_one_output": ("add_sub", ADD_SUB, ["OUTPUT1"]),
    "add_sub_wrong_dtype": ("add_sub", [("INPUT0", F4.astype(np.int32), "INT32"), ADD_SUB[1]], OUTS),
    "add_sub_wrong_shape": ("add_sub", [("INPUT0", F4[:3], "FP32"), ADD_SUB[1]], OUTS),
    "add_sub_missing_input": ("add_sub", ADD_SUB[:1], OUTS),
    "add_sub_unknown_output": ("add_sub", ADD_SUB, ["NOPE"]),
    "batched_3x2": ("batched", [("INPUT0", np.arange(6, dtype=np.float32).reshape(3, 2), "FP32")], ["OUTPUT0"]),
    "batched_too_large": ("batched", [("INPUT0", np.ones((5, 1), np.float32), "FP32")], ["OUTPUT0"]),
    "bytes": ("bytes_echo", [("INPUT0", np.array([b"abc", b"", b"\x00\xff"], np.object_), "BYTES")],
              ["OUTPUT0", "LENGTH"]),
    "bytes_2d_rejected": ("bytes_echo", [("INPUT0", np.array([[b"a"], [b"b"]], np.object_), "BYTES")], ["OUTPUT0"]),
    "bytes_unicode": ("bytes_echo", [("INPUT0", np.array(["héllo".encode()], np.object_), "BYTES")],
                      ["OUTPUT0", "LENGTH"]),
    "unknown_model": ("no_such_model", ADD_SUB, OUTS),
}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("case", sorted(CLIENT_CASES))
def test_http_client(pair: Pair, case: str, binary: bool) -> None:
    model, tensors, outputs = CLIENT_CASES[case]
    triton, pystub = both(pair, http_infer, model, tensors, outputs, binary=binary, binary_outputs=binary)
    agree(triton, pystub)


@pytest.mark.parametrize("case", sorted(CLIENT_CASES))
def test_grpc_client(pair: Pair, case: str) -> None:
    model, tensors, outputs = CLIENT_CASES[case]
    triton, pystub = both(pair, grpc_infer, model, tensors, outputs)
    agree(triton, pystub)


def _bf16(values: list[float]) -> np.ndarray:
    """BF16 as tritonclient wants it: an ml_dtypes.bfloat16 array."""
    import ml_dtypes

    return np.array(values, dtype=ml_dtypes.bfloat16)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bf16_roundtrip(pair: Pair, protocol: str) -> None:
    tensors = [("INPUT0", _bf16([1.0, -2.5, 3.0]), "BF16")]
    call = http_infer if protocol == "http" else grpc_infer
    triton, pystub = both(pair, call, "bf16_echo", tensors, ["OUTPUT0"])
    agree(triton, pystub)
    assert "ok" in triton


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_id_echo(pair: Pair, protocol: str) -> None:
    def send(endpoint: Endpoint) -> object:
        if protocol == "http":
            reply = raw(endpoint, "POST", "/v2/models/add_sub/infer", {"id": "abc-1", "inputs": GOOD_ADD})
            return reply.json()["id"]
        import tritonclient.grpc as grpcclient
        client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            inputs = []
            for name, data, datatype in ADD_SUB:
                tensor = grpcclient.InferInput(name, list(data.shape), datatype)
                tensor.set_data_from_numpy(data)
                inputs.append(tensor)
            return client.infer("add_sub", inputs, request_id="abc-1").get_response().id
        finally:
            client.close()
    triton, pystub = both(pair, send)
    agree(triton, pystub)


# -- classification extension -----------------------------------------------------------------------

def _classify(output: str, count: object) -> dict:
    return {"name": output, "parameters": {"classification": count}}


CLASSIFY_CASES = {
    "batched_labels": ("batched", {"inputs": [_tensor("INPUT0", [2, 4], "FP32", [0.1, 0.7, 0.2, 0, 3, 1, 2, 5])],
                                   "outputs": [_classify("OUTPUT0", 2)]}),
    "batched_more_than_values": ("batched", {"inputs": [_tensor("INPUT0", [1, 3], "FP32", [1, 3, 2])],
                                             "outputs": [_classify("OUTPUT0", 9)]}),
    "unbatched": ("add_sub", {"inputs": GOOD_ADD, "outputs": [_classify("OUTPUT0", 3), {"name": "OUTPUT1"}]}),
    "int64_output": ("bytes_echo", {"inputs": [_tensor("INPUT0", [3], "BYTES", ["a", "abc", "ab"])],
                                    "outputs": [_classify("LENGTH", 2)]}),
    "zero": ("add_sub", {"inputs": GOOD_ADD, "outputs": [_classify("OUTPUT0", 0)]}),
}


@pytest.mark.parametrize("case", sorted(CLASSIFY_CASES))
def test_classification_http_json(pair: Pair, case: str) -> None:
    model, body = CLASSIFY_CASES[case]
    triton, pystub = both(pair, _post, f"/v2/models/{model}/infer", body)
    agree(triton, pystub)


def test_classification_of_bytes_refused(pair: Pair) -> None:
    """Deliberate deviation: Triton 2.51 dies (SIGFPE) when asked to classify a BYTES output, so
    the request goes to pystub only; pystub refuses it with 400."""
    body = {"inputs": [_tensor("INPUT0", [1], "BYTES", ["a"])], "outputs": [_classify("OUTPUT0", 1)]}
    assert _post(pair.pystub, "/v2/models/bytes_echo/infer", body) == [
        400, {"error": "class result not available for output 'OUTPUT0' due to unsupported type 'BYTES'"}]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_client(pair: Pair, protocol: str) -> None:
    """tritonclient's `class_count` (HTTP binary outputs, gRPC `parameters["classification"]`)."""
    def send(endpoint: Endpoint) -> list:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(endpoint.http_url if protocol == "http" else endpoint.grpc_url)
        try:
            data = np.array([[0.5, 0.25, 0.75], [3, 2, 1]], np.float32)
            tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("batched", [tensor], outputs=[module.InferRequestedOutput("OUTPUT0", class_count=2)])
            classes = result.as_numpy("OUTPUT0")
            return [str(classes.dtype), list(classes.shape), [c.decode() for c in classes.reshape(-1)]]
        finally:
            client.close()
    triton, pystub = both(pair, send)
    agree(triton, pystub)
