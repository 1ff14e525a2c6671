"""The protocol-neutral request and response the frontends exchange with the core.

A frontend decodes HTTP or gRPC into an `InferRequest` whose tensor data are buffers into the
received message (no copies yet), calls `FrontendCore.infer`, encodes the `InferResponse`, and then
calls `InferResponse.release()`: output data are views into a stub's shared-memory arena and stay
valid only until that call.

Tensor data are raw little-endian bytes in C order; BYTES tensors carry the length-prefixed form of
`pystub_backend.ipc.bytes_codec`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

import numpy as np

from pystub_backend.backend.errors import ServerError
from pystub_backend.ipc.bytes_codec import deserialize_bytes
from pystub_backend.ipc.dtypes import numpy_dtype

__all__ = [
    "RESERVED_PARAMETERS",
    "model_parameters",
    "model_parameters_json",
    "Buffer",
    "Tensor",
    "RequestedOutput",
    "InferRequest",
    "InferResponse",
    "FrontendCore",
    "ServingTarget",
    "Trace",
    "ClientShmRegions",
    "ParameterValue",
    "tensor_to_numpy",
    "buffer_view",
    "DeviceRef",
    "ExportGoneError",
    "no_release",
]

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]
ParameterValue = Union[bool, int, float, str]


@dataclass(frozen=True)
class DeviceRef:
    """A model's output left in GPU memory and exported by CUDA IPC (a BLS caller asked for it
    there): which export of which stub (`key`), on which device, and where in the IPC handle's
    allocation. Its lifetime is owned by the device-export registry (features.bls.device_exports)."""

    key: tuple[str, int]
    device_id: int
    offset: int
    nbytes: int
    ipc_handle: bytes


class ExportGoneError(Exception):
    """A GPU tensor (a BLS output or input) cannot reach its consumer: the stub that exported it died."""


@dataclass(slots=True)
class Tensor:
    """A named tensor: wire datatype (`FP32`, `BYTES`, ...), shape, and its raw bytes.

    `parameters` holds per-tensor protocol parameters (e.g. shared-memory region references) that
    the frontend passes through; the core interprets them.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Buffer
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    device: DeviceRef | None = None  # set only for BLS GPU outputs and inputs (`data` is then empty)

    @property
    def nbytes(self) -> int:
        return self.device.nbytes if self.device is not None else buffer_view(self.data).nbytes


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for. `parameters` may carry `binary_data` or shm references."""

    name: str
    parameters: dict[str, ParameterValue] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" means the model's default (latest) version
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty means every output
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    # Set by the sequence batcher (from `sequence_id` / `sequence_start` / `sequence_end`); the
    # model reads them as `correlation_id()` and `flags()`.
    correlation_id: int | str = 0
    flags: int = 0
    # The request's trace when it was sampled (telemetry/tracing): the frontend or the BLS
    # handler sets it; the scheduler records queue and compute times on it.
    trace: Trace | None = None
    # A BLS call that prefers its outputs on this GPU: outputs the model left on it stay there.
    device_outputs: int | None = None


def no_release() -> None:
    """The release of a response that holds nothing (a caller may skip calling it)."""
    return None


@dataclass(slots=True)
class InferResponse:
    """A model's answer. Output data may view shared memory: call `release()` once encoded.

    In a stream (decoupled models) `final` marks the last response of the request, `error`
    carries an in-band error response, and `flags_only` marks a final that carries no response
    (the model's `send(flags=FINAL)`), which a stream shows only on request.
    """

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    release: Callable[[], None] = no_release
    error: ServerError | None = None
    final: bool = True
    flags_only: bool = False


def buffer_view(data: Buffer) -> memoryview:
    """A memoryview of tensor data, whichever buffer type holds it."""
    return data.data if isinstance(data, np.ndarray) else memoryview(data)


def tensor_to_numpy(tensor: Tensor) -> np.ndarray:
    """The tensor as a numpy array shaped like it (BYTES: an object array of bytes).

    Raises KeyError for datatypes numpy cannot hold (BF16) and ValueError when the data size does
    not match the shape.
    """
    if tensor.datatype == "BYTES":
        count = int(np.prod(tensor.shape, dtype=np.int64))
        return deserialize_bytes(buffer_view(tensor.data), count).reshape(tensor.shape)
    array = np.frombuffer(tensor.data, dtype=numpy_dtype(tensor.datatype))
    return array.reshape(tensor.shape)


class Trace(Protocol):
    """A sampled request's trace as the core marks it (`telemetry.tracing.spans.RequestTrace`)."""

    def computing(self, version: str, queued_ns: int, start_ns: int) -> None:
        """The request left the queue at `start_ns` for an execution of `version`."""

    def computed(self, input_end_ns: int, end_ns: int, waited_ns: int = 0) -> None:
        """The model had the inputs at `input_end_ns` and returned from execute at `end_ns`; the
        batch waited `waited_ns` in the stub's queue in between (queue time)."""

    def request_end(self, at_ns: int | None = None) -> None:
        """The request's last response was sent (now, or at `at_ns`)."""

    def context(self) -> str:
        """The trace context the stub hands the model (`request.trace().get_context()`)."""


class ClientShmRegions(Protocol):
    """The client shared-memory regions the shm extension's routes manage
    (`features.client_shm.ClientShmRegistry`). Methods raise ServerError."""

    def status(self, name: str = "") -> list[dict[str, Any]]: ...

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    def unregister(self, name: str = "") -> None: ...

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]: ...

    def cuda_register(self, name: str, ipc_handle: bytes = b"", device_id: int = 0, byte_size: int = 0) -> None: ...

    async def cuda_unregister_closed(self, name: str = "") -> None:
        """Forget one CUDA region or all, returning once the stubs closed their handles."""


class ServingTarget(Protocol):
    """What a frontend may ask of the model version serving its request."""

    @property
    def decoupled(self) -> bool: ...


class FrontendCore(Protocol):
    """What the frontends need from the server. Methods raise `pystub_backend.backend.errors.ServerError`."""

    server_name: str
    server_version: str
    extensions: list[str]

    @property
    def client_shm(self) -> ClientShmRegions:
        """The client shared-memory regions requests may name (the shm extension's routes)."""

    def is_live(self) -> bool: ...

    def is_ready(self) -> bool: ...

    async def model_ready(self, name: str, version: str = "") -> bool:
        """True when that model version can serve; False (never raises) otherwise."""
        ...

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """`{"name", "versions", "platform", "inputs", "outputs"}`
        (docs/reference/protocol.md#model-configuration-and-metadata)."""
        ...

    def model_config(self, name: str, version: str = "") -> Any:
        """The `model_config_pb2.ModelConfig` proto of that model."""
        ...

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        """The config as Triton's HTTP `/config` renders it (int64 fields as numbers)."""
        ...

    def target(self, name: str, version: str = "") -> ServingTarget | None:
        """The model version a request would be served by now, or None (the request then fails
        with the lookup's own error). Pass it on to `infer`: the request is looked up once."""

    async def infer(self, request: InferRequest, target: ServingTarget | None = None) -> InferResponse: ...

    async def infer_stream(self, request: InferRequest, target: ServingTarget | None = None) -> Any:
        """The request's ResponseStream (`pystub_backend.backend.response_stream`): every
        response as it comes."""
        ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """`[{"name", "version", "state", "reason"}]`."""
        ...

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """The `model_stats` list in the HTTP JSON form of docs/reference/protocol.md#statistics-extension."""
        ...

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load (or reload) the model, with the load request's parameters (config, files)."""

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Unload the model (and, when the parameters say so, its dependents)."""


# Request parameters with a meaning to the protocol or the scheduler; the model never sees them.
RESERVED_PARAMETERS = frozenset({
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
    "binary_data_output",
})


def model_parameters(request: InferRequest) -> dict[str, ParameterValue]:
    """The request parameters the model sees: all but the reserved keys and `triton_*`."""
    return {
        key: value for key, value in request.parameters.items()
        if key not in RESERVED_PARAMETERS and not key.startswith("triton_")
    }


def model_parameters_json(request: InferRequest) -> str:
    """`model_parameters` as the JSON a stub gets with the request."""
    if not request.parameters:  # the common request: nothing to filter or encode
        return "{}"
    parameters = model_parameters(request)
    return json.dumps(parameters) if parameters else "{}"
