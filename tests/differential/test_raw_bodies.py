"""Raw HTTP inference bodies (`Inference-Header-Content-Length: 0`: the whole body is the model's
one input), sent whole and with `Transfer-Encoding: chunked`: Triton vs pystub.

The shape_* models say what they were handed (datatype, shape, values), so a case compares the
input as deduced, the refusals' texts, and the binary response (every output of a raw request
comes back binary).
"""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Iterator

import numpy as np
import pytest
from calls import agree, both
from oracle import Endpoint, Pair

PAIR_MODELS = ("shape_s1", "shape_b1", "shape_sv", "shape_vv", "shape_v2", "shape_bv", "shape_types")
_TIMEOUT = 60.0


def _pieces(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), 3):  # 3-byte chunks: no piece holds a whole element
        yield body[start:start + 3]


def _send(endpoint: Endpoint, model: str, body: bytes, chunked: bool) -> list:
    """[status, the JSON (header) part, the binary part's bytes]."""
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.http_port, timeout=_TIMEOUT)
    try:
        headers = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
        if chunked:
            connection.request("POST", f"/v2/models/{model}/infer", body=_pieces(body), headers=headers,
                               encode_chunked=True)
        else:
            connection.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        length = int(response.getheader("Inference-Header-Content-Length") or len(data))
        return [response.status, json.loads(data[:length]), data[length:].decode(errors="replace")]
    finally:
        connection.close()


def _fp32(*values: float) -> bytes:
    return np.array(values, np.float32).tobytes()


# name: (model, body)
BODIES = {
    "bytes_into_1": ("shape_s1", b"hello world"),
    "bytes_with_length_prefix": ("shape_s1", struct.pack("<I", 2) + b"hi"),  # the prefix is data too
    "bytes_not_utf8": ("shape_s1", b"\xff\x00\xfe"),
    "bytes_empty": ("shape_s1", b""),
    "bytes_into_batched_1": ("shape_b1", b"hello"),
    "bytes_into_vector": ("shape_sv", b"hello"),
    "fp32_two_variable": ("shape_vv", _fp32(1, 2, 3, 4)),
    "fp32_variable_then_2": ("shape_v2", _fp32(1, 2, 3, 4)),
    "fp32_variable_then_2_misfit": ("shape_v2", _fp32(1, 2, 3)),
    "fp32_variable_then_2_short": ("shape_v2", b"abcde"),
    "fp32_variable_then_2_empty": ("shape_v2", b""),
    "fp32_batched_vector": ("shape_bv", _fp32(1, 2, 3)),
    "fp32_batched_vector_misfit": ("shape_bv", b"abcde"),
    "many_inputs": ("shape_types", _fp32(1)),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("case", sorted(BODIES))
def test_raw_body(pair: Pair, case: str, chunked: bool) -> None:
    model, body = BODIES[case]
    agree(*both(pair, _send, model, body, chunked))
