"""Raw HTTP inference requests: `Inference-Header-Content-Length: 0`
(docs/reference/protocol.md#http-inference-and-binary-tensors).

The whole body is the data of the model's only input; its name, datatype and dims come from the
model's metadata and config, the batch size is 1, and every output is returned as binary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.codec import Body, DecodedRequest, OutputFormat
from pystub_backend.backend.inference import InferRequest, Tensor
from pystub_backend.ipc.bytes_codec import BytesDecodeError, count_elements
from pystub_backend.ipc.dtypes import element_size

__all__ = ["RawInputSpec", "decode_raw_request", "raw_input_spec"]


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


@dataclass(frozen=True)
class RawInputSpec:
    """The single input of a model: name, wire datatype, dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    batching: bool


def raw_input_spec(metadata: Mapping[str, Any], config: Mapping[str, Any]) -> RawInputSpec:
    """The model's only input, from its metadata and `/config` JSON.

    Raises ServerError(INVALID_ARG) when the model does not have exactly one input.
    """
    inputs = metadata.get("inputs", [])
    if len(inputs) != 1:
        raise _invalid(
            f"raw request must only have 1 input to be deduced but got {len(inputs)} inputs "
            f"in '{metadata.get('name', '')}' model configuration"
        )
    batching = int(config.get("max_batch_size", 0)) > 0
    shape = tuple(int(d) for d in inputs[0]["shape"])
    dims = shape[1:] if batching else shape
    return RawInputSpec(inputs[0]["name"], inputs[0]["datatype"], dims, batching)


def decode_raw_request(
    body: Body, spec: RawInputSpec, model_name: str, model_version: str = ""
) -> DecodedRequest:
    """A raw request: the whole body is `spec`'s input, batch 1; every output comes back binary.

    Variable dims (-1) are deduced from the body size when there is exactly one of them.
    Raises ServerError(INVALID_ARG) when the shape cannot be deduced.
    """
    data = memoryview(body).cast("B")
    dims = _deduce_dims(spec, data)
    shape = (1, *dims) if spec.batching else dims
    tensor = Tensor(spec.name, spec.datatype, shape, data)
    request = InferRequest(model_name, model_version, inputs=[tensor])
    return DecodedRequest(request, OutputFormat(force_binary=True))


def _deduce_dims(spec: RawInputSpec, data: memoryview) -> tuple[int, ...]:
    variable = [i for i, d in enumerate(spec.dims) if d < 0]
    if not variable:
        return spec.dims
    if len(variable) > 1:
        raise _invalid(
            f"cannot deduce the shape of input '{spec.name}' of a raw request: "
            f"more than one variable dimension in {list(spec.dims)}"
        )
    elements = _raw_element_count(spec, data)
    known = math.prod(d for d in spec.dims if d >= 0)
    if known == 0 or elements % known:
        raise _invalid(
            f"cannot deduce the shape of input '{spec.name}' of a raw request: {elements} "
            f"elements do not fit dims {list(spec.dims)}"
        )
    dims = list(spec.dims)
    dims[variable[0]] = elements // known
    return tuple(dims)


def _raw_element_count(spec: RawInputSpec, data: memoryview) -> int:
    if spec.datatype == "BYTES":
        try:
            return count_elements(data)
        except BytesDecodeError as exc:
            raise _invalid(f"raw request for input '{spec.name}': {exc}") from None
    size = element_size(spec.datatype)
    if len(data) % size:
        raise _invalid(
            f"raw request for input '{spec.name}': {len(data)} bytes is not a multiple of the "
            f"{spec.datatype} element size {size}"
        )
    return len(data) // size


