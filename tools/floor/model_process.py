"""The floor's model process: what pystub's stub does for one request, and nothing more.

Requests arrive as msgpack datagrams on a SOCK_SEQPACKET socket (one datagram, one message: no
framing to parse), and answers leave the same way:

    request   [id, [[name, datatype, shape, data], ...]]           data: the tensor's bytes
    answer    [id, None, [[name, datatype, shape, data], ...]]     or [id, "error message", []]

Per request: the inputs become numpy views of the received bytes (no copy), a request object
holds them, the model's `execute` gets a list of requests and returns a response per request,
and the outputs' bytes are packed as they are (a view of the input for the identity).

Requests are served one at a time, in the order they came: the parent relies on it (answers on
an HTTP/1.1 connection leave in order). The process ends when the parent's end of the socket
closes (recv returns b""): that is its only liveness check.

    python model_process.py FD       FD: the inherited socket
"""

from __future__ import annotations

import socket
import sys

import msgpack
import numpy as np

MAX_DATAGRAM = 1 << 17  # a 64 KiB tensor and its header; the parent refuses larger ones
DTYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}


class Tensor:
    __slots__ = ("name", "datatype", "array")

    def __init__(self, name: str, datatype: str, array: np.ndarray) -> None:
        self.name, self.datatype, self.array = name, datatype, array


class Request:
    __slots__ = ("inputs",)

    def __init__(self, inputs: dict[str, Tensor]) -> None:
        self.inputs = inputs


class Response:
    __slots__ = ("outputs",)

    def __init__(self, outputs: list[Tensor]) -> None:
        self.outputs = outputs


class IdentityModel:
    """identity_fp32: OUTPUT0 is INPUT0 (as examples/models/identity_fp32 is for pystub and Triton)."""

    def execute(self, requests: list[Request]) -> list[Response]:
        return [Response([Tensor("OUTPUT0", r.inputs["INPUT0"].datatype, r.inputs["INPUT0"].array)])
                for r in requests]


def _request(tensors: list[list]) -> Request:
    """Raises KeyError for an unknown datatype, ValueError when the bytes do not fit the shape."""
    inputs = {}
    for name, datatype, shape, data in tensors:
        inputs[name] = Tensor(name, datatype, np.frombuffer(data, DTYPES[datatype]).reshape(shape))
    if "INPUT0" not in inputs:
        raise ValueError("identity_fp32 takes INPUT0")
    return Request(inputs)


def _answer(request_id: int, tensors: list[list], model: IdentityModel) -> bytes:
    try:
        response = model.execute([_request(tensors)])[0]
    except (KeyError, ValueError) as error:  # a bad request: its error goes back as data
        return msgpack.packb([request_id, f"{type(error).__name__}: {error}", []])
    # `.data` is a memoryview of the array's buffer: msgpack packs it without a copy of its own
    outputs = [[t.name, t.datatype, list(t.array.shape), np.ascontiguousarray(t.array).data]
               for t in response.outputs]
    return msgpack.packb([request_id, None, outputs])


def serve(sock: socket.socket) -> None:
    """Answer requests until the parent closes its end."""
    model = IdentityModel()
    while True:
        datagram = sock.recv(MAX_DATAGRAM)
        if not datagram:
            return
        request_id, tensors = msgpack.unpackb(datagram)
        sock.send(_answer(request_id, tensors, model))


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
