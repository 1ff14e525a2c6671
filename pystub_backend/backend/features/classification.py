"""The `classification` extension (KServe v2 / Triton): an output requested with the parameter
`classification: N` (HTTP JSON) or `class_count` (tritonclient; gRPC `parameters["classification"]`)
comes back as the top-N classes of that output instead of its values.

Each class is a BYTES element `"<value>:<index>"`, or `"<value>:<index>:<label>"` when the output's
`label_filename` (a file in the model directory, one label per line) has a label for that index.
Values print as C++'s `std::to_string` prints them (`0.750000` for floats, `3` for integers), as
Triton's do. A model with a batch dimension (`max_batch_size > 0`) is classified per batch entry:
shape `[batch, n]`; otherwise shape `[n]`, where n = min(N, the number of values per entry).
Classes are in descending order of value; equal values keep the lower index first (Triton's sort is
not stable, so its order of equal values may differ).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import InferRequest, InferResponse, Tensor, tensor_to_numpy
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.status import Status

__all__ = ["CLASSIFICATION", "class_counts", "classify"]

CLASSIFICATION = "classification"
# Triton classifies these types only; the others are refused with its text.
_CLASSIFIABLE = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}


def class_counts(request: InferRequest) -> dict[str, int]:
    """The requested outputs that ask for classes, with how many. Raises ServerError (INVALID_ARG)
    for a count that is not a non-negative integer."""
    counts = {}
    for output in request.outputs:
        count = output.parameters.get(CLASSIFICATION)
        if count is None:
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ServerError(f"'{CLASSIFICATION}' of output '{output.name}' must be a non-negative integer, "
                              f"got {count!r}", Status.INVALID_ARG)
        if count > 0:
            counts[output.name] = count
    return counts


def classify(response: InferResponse, counts: dict[str, int], config: ModelConfig, model_dir: str
             ) -> InferResponse:
    """The response with each output named in `counts` replaced by its top classes (a copy: the
    response itself may be shared, e.g. by the response cache). Raises ServerError for an output
    whose datatype has no order (Triton's text)."""
    labels = {output.name: output.label_filename for output in config.output if output.label_filename}
    outputs = list(response.outputs)
    for index, tensor in enumerate(outputs):
        count = counts.get(tensor.name)
        if count is None:
            continue
        if tensor.datatype not in _CLASSIFIABLE:
            raise ServerError(f"class result not available for output '{tensor.name}' due to unsupported type "
                              f"'{tensor.datatype}'", Status.INVALID_ARG)
        names = _labels(os.path.join(model_dir, labels[tensor.name])) if tensor.name in labels else ()
        outputs[index] = _classes(tensor, count, config.max_batch_size > 0, names)
    return dataclasses.replace(response, outputs=outputs)


def _classes(tensor: Tensor, count: int, batched: bool, names: tuple[str, ...]) -> Tensor:
    values = tensor_to_numpy(tensor)
    rows = values.reshape(values.shape[0], -1) if batched and values.ndim > 0 else values.reshape(1, -1)
    texts = [_top(row, count, names) for row in rows]
    per_row = len(texts[0]) if texts else 0
    shape = (len(texts), per_row) if batched and values.ndim > 0 else (per_row,)
    flat = [text.encode() for row in texts for text in row]
    return Tensor(tensor.name, "BYTES", shape, serialize_bytes(flat))


def _top(row: np.ndarray, count: int, names: tuple[str, ...]) -> list[str]:
    values = row.tolist()  # Python numbers: exact for every integer type, no overflow when negated
    order = sorted(range(len(values)), key=values.__getitem__, reverse=True)[:count]  # stable
    texts = []
    for index in order:
        shown = f"{float(values[index]):f}" if row.dtype.kind == "f" else str(int(values[index]))
        label = names[index] if index < len(names) else ""
        texts.append(f"{shown}:{index}:{label}" if label else f"{shown}:{index}")
    return texts


@functools.lru_cache(maxsize=64)
def _labels(path: str) -> tuple[str, ...]:
    """The lines of a label file (read once; a missing file means no labels, as in Triton)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return tuple(line.rstrip("\n") for line in file)
    except OSError:
        return ()
