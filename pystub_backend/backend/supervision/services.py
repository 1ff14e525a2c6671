"""What the server hands each stub for its feature frame handlers: a typed seam, not the core.

    StubServices
        handlers        BackendHandlers   the frame table every stub of this server dispatches to
        core            StubFacingCore      BLS targets (lookup, readiness, infer) and model control;
                                        None for stubs outside a server (auto-complete, tools)
        client_regions  ClientRegions   inputs and outputs in clients' shared-memory regions
        device_exports  DeviceExportHooks  GPU outputs exported by CUDA IPC to BLS callers, and who maps them

A feature's server-wide state (the BLS calls in flight, the custom metrics of a core) is the
feature's own, found from the stub (its `core`) by the feature's handlers; supervision never sees it.
Per-stub feature state (multiplex holdings, the sequence batcher that owns a stub, the client shm
regions a stub maps) is kept by its feature keyed by the StubProcess, since it dies with the stub.
`features.install.feature_services(core)` builds this object; ModelVersion passes it to every
instance it starts, and every StubProcess is given one: supervision never imports a feature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pystub_backend.backend.config.model_config import ModelConfig
    from pystub_backend.backend.inference import InferRequest, Tensor
    from pystub_backend.backend.response_stream import ResponseStream
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.stub_process import StubProcess
    from pystub_backend.backend.telemetry.tracing import Tracer
    from pystub_backend.ipc.records import WireTensor

__all__ = ["ClientRegions", "DeviceExportHooks", "RescheduleOwner", "StubFacingCore", "ServedVersion", "StubServices"]


class ServedVersion(Protocol):
    """A loaded model version as feature handlers see it (BLS checks)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int | str: ...

    @property
    def ready(self) -> bool: ...

    @property
    def config(self) -> ModelConfig: ...

    @property
    def decoupled(self) -> bool: ...


class RescheduleOwner(Protocol):
    """The iterative sequence batcher whose batch runs on a stub (scheduling/sequence_stubs.py):
    the stub's SequenceRescheduled frames are answered by it."""

    def on_rescheduled(self, request: InferRequest, rid: int) -> bool: ...


class StubFacingCore(Protocol):
    """The part of the server core that stubs may reach: BLS and `pb_utils` model control."""

    def model_config(self, name: str, version: str = "") -> ModelConfig: ...

    def version_for(self, name: str, version: str = "") -> ServedVersion: ...

    def model_versions(self) -> Sequence[ServedVersion]: ...

    def versions_of(self, name: str) -> Sequence[ServedVersion]: ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...

    async def infer_stream(self, request: InferRequest, target: ServedVersion | None = None) -> ResponseStream: ...

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None: ...

    async def model_ready(self, name: str, version: str = "") -> bool: ...

    @property
    def tracer(self) -> Tracer:
        """Tracing hook: the child traces of BLS calls a traced request makes."""


class ClientRegions(Protocol):
    """Client shared-memory regions as a stub's requests use them (features/client_shm.py)."""

    def region_handle(self, tensor: Tensor) -> list[Any] | None:
        """The region handle of an input that lives in a client region, else None."""

    def attach_regions(self, request: InferRequest, stub: StubProcess,
                       stream: ResponseStream) -> dict[str, list[Any]]:
        """Hold the request's regions until `stream` is final; {output name: region handle}."""


class DeviceExportHooks(Protocol):
    """GPU tensors crossing between stubs by CUDA IPC, as a stub's requests and responses carry
    them (features/bls/device_exports.py). Methods raise what `outputs` documents there."""

    def claim_tensor(self, tensor: Tensor, consumer: StubProcess, what: str) -> WireTensor:
        """The GPU tensor as `consumer` gets it: a claim on its export, to map."""

    def release_unsent(self, consumer: StubProcess, tensors: list[WireTensor]) -> None:
        """The claims among `tensors` (placed for `consumer`) that never reached it."""

    def outputs(self, exporter: StubProcess, wire_outputs: list[WireTensor],
                view: Callable[[list[Any]], memoryview]) -> list[Tensor]:
        """A stub's tensors as Tensors: arena bytes through `view`, GPU exports registered and held."""

    def discard(self, exporter: StubProcess, wire_outputs: list[WireTensor]) -> None:
        """Outputs nobody will take: the exporter may drop its GPU exports."""

    def drop_hold(self, key: tuple[str, int]) -> None:
        """The response that carried the export (exporter base, export id) was released."""


@dataclass(frozen=True)
class StubServices:
    handlers: BackendHandlers
    client_regions: ClientRegions
    device_exports: DeviceExportHooks
    core: StubFacingCore | None = None
