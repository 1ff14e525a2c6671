"""Encoding an `InferResponse` as an HTTP inference response body
(docs/reference/protocol.md#http-inference-and-binary-tensors).

The body is the JSON header followed by the binary outputs in header order; headers say which:
`application/json`, or `application/octet-stream` plus `Inference-Header-Content-Length` as soon as
one output is binary (even an empty one). Outputs written to client shared memory are listed as
`{name, datatype, shape}` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.frontends.http.codec import INFERENCE_HEADER, SHM_REGION, OutputFormat
from pystub_backend.backend.frontends.http.json_document import dump_header
from pystub_backend.backend.frontends.http.json_tensors import tensor_json_value
from pystub_backend.backend.inference import InferResponse, Tensor

__all__ = ["EncodedResponse", "encode_infer_response"]


@dataclass
class EncodedResponse:
    body: bytes
    headers: dict[str, str]


def encode_infer_response(response: InferResponse, output_format: OutputFormat) -> EncodedResponse:
    """The HTTP body and headers of a response; copies every output byte out of `response`.

    Raises ValueError/KeyError when an output's data do not match its datatype and shape.
    """
    entries: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    for tensor in response.outputs:
        if output_format.requested is None or tensor.name in output_format.requested:
            entries.append(_output_entry(tensor, output_format, buffers))
    document: dict[str, Any] = {"model_name": response.model_name,
                                "model_version": response.model_version}
    if output_format.request_id is not None:
        document["id"] = response.id or output_format.request_id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    header = dump_header(document)
    if not buffers:
        return EncodedResponse(header, {"Content-Type": "application/json"})
    headers = {"Content-Type": "application/octet-stream", INFERENCE_HEADER: str(len(header))}
    return EncodedResponse(b"".join([header, *buffers]), headers)


def _output_entry(
    tensor: Tensor, output_format: OutputFormat, buffers: list[memoryview]
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                             "shape": list(tensor.shape)}
    if tensor.name in output_format.shared_memory or SHM_REGION in tensor.parameters:
        # perf_analyzer breaks on a `parameters` object here
        # (docs/reference/protocol.md#compatibility-with-perf_analyzer)
        return entry
    parameters: dict[str, Any] = {
        key: value for key, value in tensor.parameters.items()
        if key not in ("binary_data", "binary_data_size")
    }
    # OutputFormat.is_binary, inline (once per output)
    if output_format.force_binary or output_format.binary.get(tensor.name, output_format.binary_default):
        buffer = _byte_view(tensor.data)
        parameters["binary_data_size"] = len(buffer)
        buffers.append(buffer)
    else:
        entry["data"] = tensor_json_value(tensor)
    if parameters:
        entry["parameters"] = parameters
    return entry


def _byte_view(data: Any) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view
