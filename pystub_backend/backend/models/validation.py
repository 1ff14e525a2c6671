"""Validate an `InferRequest` against its model's config, with Triton's error texts.

The checks run in Triton's order (frontend, then `InferenceRequest::Normalize`):

    parameters -> duplicate inputs -> requested outputs -> input count
      -> batch dimension -> per input: known, data-type, shape -> per input: byte size

Every failure is `ServerError(..., Status.INVALID_ARG)`. Messages Triton builds with
`LogRequest()` start with `[request id: <id>] `; the ones Triton raises from the frontend
(parameters) or from `Model::GetInput/GetOutput` (unknown names) carry no prefix, as in Triton.

Shapes may be absurdly large; element counts are Python ints and nothing is allocated from them.
Call this after shared-memory references have been resolved into `Tensor.data`.

`RequestChecks` is the same check for one model, with what the config says derived once (input
specs by name, wire data types, dims, the outputs): a request that passes costs a few dict lookups
per input. Only an accepted request leaves by that fast path; anything it does not accept runs the
full check above, so every error and its text come from one place, in Triton's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import (
    RESERVED_PARAMETERS,
    InferRequest,
    ParameterValue,
    Tensor,
    buffer_view,
    model_parameters,
)
from pystub_backend.ipc.bytes_codec import BytesDecodeError, count_elements
from pystub_backend.ipc.dtypes import CODE_TO_WIRE, WIRE_TO_CODE, config_to_wire, element_size
from pystub_backend.ipc.status import Status

__all__ = ["RequestChecks", "validate_request", "model_parameters", "RESERVED_PARAMETERS"]

# Request parameters the server consumes; the model never sees them (docs/reference/protocol.md#request-parameters).
_ALLOWED_TRITON_KEY = "triton_enable_empty_final_response"
_MAX_BYTES = 2**63 - 1
# What the wire to the stub can carry (uint64), and Triton reads: `timeout` (µs) and `priority`.
_COUNT_LIMITS = {"timeout": 2**64 - 1, "priority": 2**64 - 1}
_RESERVED_KEY_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    f"keys starting with 'triton_' are allowed: {_ALLOWED_TRITON_KEY}"
)
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim "
    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
    "docs for more info on max_batch_size."
)


def validate_request(request: InferRequest, config: ModelConfig) -> int:
    """Check `request` against a normalized `config` and return its batch size.

    The batch size is `shape[0]` of the first input for batching models, 1 otherwise.
    Raises ServerError(INVALID_ARG) on the first problem found.
    """
    _check_text(request.id, "request id")
    _check_parameters(request.parameters)
    configs = {tensor.name: tensor for tensor in config.input}
    _check_duplicates(request)
    _check_outputs(request, config)
    _check_input_count(request, config)
    batch_size = _batch_size(request, config, configs)
    for tensor in request.inputs:
        input_config = _known_input(config.name, configs, tensor.name)
        _check_input(request, config, input_config, tensor)
    for tensor in request.inputs:
        _check_byte_size(request, config.name, tensor)
    return batch_size


class _InputSpec:
    """What one config input demands of a request's tensor, derived once."""

    __slots__ = ("datatype", "dims", "wild", "batched", "element_size")

    def __init__(self, input_config: model_config_pb2.ModelInput, batching_model: bool) -> None:
        self.datatype = CODE_TO_WIRE.get(input_config.data_type) or \
            config_to_wire(model_config_pb2.DataType.Name(input_config.data_type))
        self.dims = tuple(int(dim) for dim in input_config.dims)
        self.wild = -1 in self.dims  # some dim takes any size >= 0: compared one by one
        self.batched = batching_model and not input_config.is_shape_tensor
        self.element_size = 0 if self.datatype == "BYTES" else element_size(self.datatype)

    def accepts(self, tensor: Tensor) -> bool:
        """Data type, shape (after the batch dim) and byte size all as the config says, and the
        tensor not empty (an empty one goes through the full check's representability test)."""
        if tensor.datatype != self.datatype:
            return False
        shape = tensor.shape
        tail = tuple(shape[1:]) if self.batched else tuple(shape)
        if self.wild:
            if len(tail) != len(self.dims) or not all(
                    got >= 0 if want == -1 else got == want for got, want in zip(tail, self.dims, strict=True)):
                return False
        elif tail != self.dims:
            return False
        elements = math.prod(map(int, shape))
        return elements > 0 and self.element_size > 0 and _nbytes(tensor) == elements * self.element_size


def _nbytes(tensor: Tensor) -> int:
    """`tensor.nbytes`, without its call for the common input: a plain tensor's own bytes (a
    client-shm input knows its size without its bytes; a GPU one from its export)."""
    if type(tensor) is Tensor and tensor.device is None:
        data = tensor.data
        kind = type(data)
        if kind is memoryview or kind is np.ndarray:
            return data.nbytes  # type: ignore[union-attr]
        if kind is bytes or kind is bytearray:
            return len(data)
    return tensor.nbytes


class RequestChecks:
    """`validate_request` for one model config, derived once (the config must not change after)."""

    __slots__ = ("config", "_specs", "_required", "_outputs", "_max_batch_size")

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self._max_batch_size = int(config.max_batch_size)
        self._specs = {tensor.name: _InputSpec(tensor, self._max_batch_size > 0) for tensor in config.input}
        self._required = frozenset(tensor.name for tensor in config.input if not tensor.optional)
        self._outputs = frozenset(output.name for output in config.output)

    def validate(self, request: InferRequest) -> int:
        """As `validate_request(request, config)`: the batch size. Raises ServerError(INVALID_ARG)."""
        _check_text(request.id, "request id")  # the first checks in Triton's order, as they are
        _check_parameters(request.parameters)
        # the full check when the fast one does not accept: it finds and names the problem
        return self._accepted_batch_size(request) or validate_request(request, self.config)

    def _accepted_batch_size(self, request: InferRequest) -> int:
        """The batch size of a request every check accepts; 0 when any check might not."""
        inputs, specs = request.inputs, self._specs
        names = {tensor.name for tensor in inputs}
        if len(names) != len(inputs) or not self._required <= names or \
                any(output.name not in self._outputs for output in request.outputs):
            return 0
        batch_size = 0  # stays 0 for a model without batching
        for tensor in inputs:
            spec = specs.get(tensor.name)
            if spec is None or not spec.accepts(tensor):
                return 0
            if spec.batched:  # accepts() saw shape[0] exist; it must be >= 1 and the same for all
                first = tensor.shape[0]
                if first < 1 or (batch_size and first != batch_size):
                    return 0
                batch_size = int(first)
        return 0 if batch_size > self._max_batch_size else max(batch_size, 1)


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def _prefix(request: InferRequest) -> str:
    """Triton's `LogRequest()`."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _dims(dims: Sequence[int]) -> str:
    """Triton's `DimsListToString`: `[1,-1,3]`."""
    return "[" + ",".join(str(int(dim)) for dim in dims) + "]"


def _is_count(value: ParameterValue) -> bool:
    """A non-negative int (bools are ints in Python but not here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---------------------------------------------------------------------------------------------
# Request-level checks


def _check_parameters(parameters: dict[str, ParameterValue]) -> None:
    for key, value in parameters.items():
        if key.startswith("triton_") and key != _ALLOWED_TRITON_KEY:
            raise _invalid(_RESERVED_KEY_MESSAGE)
        if key in _COUNT_LIMITS and not (_is_count(value) and int(value) <= _COUNT_LIMITS[key]):
            raise _invalid(
                f"invalid value for '{key}' parameter, expected a non-negative integer below "
                f"2**{_COUNT_LIMITS[key].bit_length()}, got {value!r}"
            )
        _check_text(key, "parameter name")
        if isinstance(value, str):
            _check_text(value, f"value of parameter '{_printable(key)}'")


def _check_text(text: str, what: str) -> None:
    """Strings travel to the stub as UTF-8: a lone surrogate (JSON `\\ud800`) cannot."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _invalid(f"the {what} is not valid Unicode (it holds a lone surrogate)") from None


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_duplicates(request: InferRequest) -> None:
    seen: set[str] = set()
    for tensor in request.inputs:
        if tensor.name in seen:
            raise _invalid(f"{_prefix(request)}input '{tensor.name}' already exists in request")
        seen.add(tensor.name)


def _check_outputs(request: InferRequest, config: ModelConfig) -> None:
    known = {output.name for output in config.output}
    for output in request.outputs:
        if output.name not in known:
            raise _invalid(
                f"unexpected inference output '{output.name}' for model '{config.name}'"
            )


def _triton_name_list(names: list[str]) -> str:
    """Triton's quoted list `['A','B']`, including its quirk: an empty list renders as `]`."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]" if names else "]"


def _check_input_count(request: InferRequest, config: ModelConfig) -> None:
    given = [tensor.name for tensor in request.inputs]
    required = [tensor.name for tensor in config.input if not tensor.optional]
    missing = [name for name in required if name not in given]
    if len(required) <= len(given) <= len(config.input) and (not missing or not _all_known(given, config)):
        return  # an unknown name is reported by the per-input check, as Triton does
    # Triton lists the inputs from its unordered_map: for a few inputs, the reverse of the request's order
    got = _triton_name_list(given[::-1]) if given else "[]"
    if len(required) == len(config.input):
        expected = f"expected {len(config.input)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(config.input)}"
    raise _invalid(
        f"{_prefix(request)}{expected} but got {len(given)} inputs for model '{config.name}'. "
        f"Got input(s) {got}, but missing required input(s) {_triton_name_list(missing)}. "
        "Please provide all required input(s)."
    )


def _all_known(names: list[str], config: ModelConfig) -> bool:
    known = {tensor.name for tensor in config.input}
    return all(name in known for name in names)


def _known_input(model: str, configs: dict[str, Any], name: str) -> Any:
    """The input's config; raises Triton's `Model::GetInput` error (no request-id prefix)."""
    if name not in configs:
        raise _invalid(f"unexpected inference input '{name}' for model '{model}'")
    return configs[name]


def _batch_size(request: InferRequest, config: ModelConfig, configs: dict[str, Any]) -> int:
    """`shape[0]` shared by all (non-shape-tensor) inputs, or 1 for non-batching models."""
    if config.max_batch_size == 0:
        return 1
    prefix, model = _prefix(request), config.name
    batch_size = 0
    for tensor in request.inputs:
        if _known_input(model, configs, tensor.name).is_shape_tensor:
            continue
        if len(tensor.shape) == 0:
            raise _invalid(
                f"{prefix}input '{tensor.name}' has no shape but model requires batch "
                f"dimension for '{model}'"
            )
        # Triton lets a batch of 0 through and wraps negatives; pystub refuses both.
        if tensor.shape[0] < 1:
            raise _invalid(f"{prefix}inference request batch-size must be >= 1 for '{model}'")
        if batch_size == 0:
            batch_size = int(tensor.shape[0])
        elif tensor.shape[0] != batch_size:
            raise _invalid(
                f"{prefix}input '{tensor.name}' batch size does not match other inputs "
                f"for '{model}'"
            )
    if batch_size > config.max_batch_size:
        raise _invalid(
            f"{prefix}inference request batch-size must be <= {config.max_batch_size} "
            f"for '{model}'"
        )
    return max(batch_size, 1)


# ---------------------------------------------------------------------------------------------
# Per-input checks


def _check_input(request: InferRequest, config: ModelConfig, input_config: model_config_pb2.ModelInput,
                 tensor: Tensor) -> None:
    prefix, model = _prefix(request), config.name
    # The table first: a dict lookup per input instead of two calls (the request's hot path).
    expected = CODE_TO_WIRE.get(input_config.data_type) or \
        config_to_wire(model_config_pb2.DataType.Name(input_config.data_type))
    if tensor.datatype != expected:
        # Triton's DataTypeToProtocolString renders an unknown name as `<invalid>`.
        given = tensor.datatype if tensor.datatype in WIRE_TO_CODE else "<invalid>"
        raise _invalid(
            f"{prefix}inference input '{tensor.name}' data-type is '{given}', but model "
            f"'{model}' expects '{expected}'"
        )
    batching = config.max_batch_size > 0 and not input_config.is_shape_tensor
    _check_shape(request, config, input_config, tensor, batching)


def _check_shape(request: InferRequest, config: ModelConfig, input_config: model_config_pb2.ModelInput,
                 tensor: Tensor, batching: bool) -> None:
    """Triton's loop: a -1 in the request is refused, config -1 matches any size >= 0."""
    prefix, model = _prefix(request), config.name
    shape = tuple(tensor.shape[1:] if batching else tensor.shape)
    dims = tuple(input_config.dims)
    match = len(shape) == len(dims)
    for got, want in zip(shape, dims, strict=True) if match else ():
        if got == -1:
            raise _invalid(
                f"{prefix}All input dimensions should be specified for input '{tensor.name}' "
                f"for model '{model}', got {_dims(tensor.shape)}"
            )
        if got < 0 or (want != -1 and want != got):
            match = False
            break
    if not match:
        full = (-1,) + dims if batching else dims
        note = _BATCH_NOTE if config.max_batch_size > 0 else ""
        raise _invalid(
            f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
            f"Expected {_dims(full)}, got {_dims(tensor.shape)}. {note}"
        )


def _check_byte_size(request: InferRequest, model: str, tensor: Tensor) -> None:
    prefix = _prefix(request)
    elements = math.prod(int(dim) for dim in tensor.shape)  # a Python int: no allocation
    if tensor.datatype == "BYTES":
        try:
            got = count_elements(buffer_view(tensor.data))
        except BytesDecodeError as exc:
            raise _invalid(f"{prefix}{exc}") from None
        if got != elements:
            raise _invalid(
                f"{prefix}expected {elements} string elements for inference input "
                f"'{tensor.name}' for model '{model}', got {got}"
            )
    else:
        expected = elements * element_size(tensor.datatype)
        got = tensor.nbytes  # a client-shm input knows its size without reading the client's region
        if got != expected:
            raise _invalid(
                f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
                f"Expected {expected}, got {got}"
            )
    if not elements:  # data and shape agree; an empty tensor may still have absurd dims
        _check_representable(prefix, model, tensor)


def _check_representable(prefix: str, model: str, tensor: Tensor) -> None:
    """The limit on shapes: what the dims describe (zero dims left out, BYTES elements counted as
    8-byte references) must fit in int64 bytes, the limit of Triton's byte sizes and of numpy.
    An empty tensor such as [2**62, 0] holds no byte, but the model could not even view it."""
    size = 8 if tensor.datatype == "BYTES" else element_size(tensor.datatype)
    if math.prod(int(dim) for dim in tensor.shape if dim) * size > _MAX_BYTES:
        raise _invalid(
            f"{prefix}input '{tensor.name}' for model '{model}' has shape {_dims(tensor.shape)}, which "
            f"describes more than {_MAX_BYTES} bytes"
        )
