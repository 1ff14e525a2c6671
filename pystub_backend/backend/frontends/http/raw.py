"""Raw HTTP inference requests: `Inference-Header-Content-Length: 0`
(docs/reference/protocol.md#http-inference-and-binary-tensors).

The whole body is the data of the model's only input; its name, datatype and dims come from the
model's metadata and config, the batch size is 1, and every output is returned as binary. As in
Triton 2.51 (its core deduces the raw input, `InferenceRequest::Normalize`):

    a BYTES input       must have dims [1]; the body is its one element (no length prefix)
    any other input     at most one variable dimension; it is the body's size divided (rounding
                        down) by the element size times the fixed dimensions, and a body that
                        does not then fit exactly is an "input byte size mismatch" naming
                        Triton's own name for the input, 'raw_input'

and the refusals carry Triton's texts, `[request id: <id_unknown>]` first (a raw request has no id).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.frontends.http.codec import Body, DecodedRequest, OutputFormat
from pystub_backend.backend.inference import InferRequest, Tensor
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


_NO_ID = "[request id: <id_unknown>] "


def raw_input_spec(metadata: Mapping[str, Any], config: Mapping[str, Any]) -> RawInputSpec:
    """The model's only input, from its metadata and `/config` JSON.

    Raises ServerError(INVALID_ARG) when the model does not have exactly one input.
    """
    inputs = metadata.get("inputs", [])
    if len(inputs) != 1:
        raise _invalid(
            f"{_NO_ID}Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} inputs "
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

    Raises ServerError(INVALID_ARG) when the shape cannot be deduced or the body does not fill it.
    """
    data = memoryview(body).cast("B")
    if spec.datatype == "BYTES":
        dims = _bytes_dims(spec)
        data = memoryview(struct.pack("<I", len(data)) + data)  # the one element, length-prefixed
    else:
        dims = _deduce_dims(spec, len(data))
        _check_size(spec, dims, len(data), model_name)
    shape = (1, *dims) if spec.batching else dims
    tensor = Tensor(spec.name, spec.datatype, shape, data)
    request = InferRequest(model_name, model_version, inputs=[tensor])
    return DecodedRequest(request, OutputFormat(force_binary=True))


def _bytes_dims(spec: RawInputSpec) -> tuple[int, ...]:
    if spec.dims != (1,):
        raise _invalid(f"{_NO_ID}For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
    return spec.dims


def _deduce_dims(spec: RawInputSpec, size: int) -> tuple[int, ...]:
    variable = [i for i, d in enumerate(spec.dims) if d < 0]
    if not variable:
        return spec.dims
    if len(variable) > 1:
        raise _invalid(f"{_NO_ID}The shape of the raw input '{spec.name}' can not be deduced because there are "
                       f"more than one variable-sized dimension")
    unit = element_size(spec.datatype) * math.prod(d for d in spec.dims if d >= 0)
    dims = list(spec.dims)
    dims[variable[0]] = size // unit if unit else 0
    return tuple(dims)


def _check_size(spec: RawInputSpec, dims: tuple[int, ...], size: int, model_name: str) -> None:
    expected = element_size(spec.datatype) * math.prod(dims)
    if size != expected:
        raise _invalid(f"{_NO_ID}input byte size mismatch for input 'raw_input' for model '{model_name}'. "
                       f"Expected {expected}, got {size}")
