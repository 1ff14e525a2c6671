"""What the server hands each stub for its feature frame handlers: a typed seam, not the core.

    StubServices
        handlers        BackendHandlers   the frame table every stub of this server dispatches to
        core            ServerCore      BLS targets (lookup, readiness, infer) and model control;
                                        None for stubs outside a server (auto-complete, tools)
        custom_metrics  CustomMetrics   pb_utils.MetricFamily / Metric of this server's models
        bls_payloads    PayloadRegistry the BLS calls in flight, by (caller base, call id)
        client_regions  ClientRegions   inputs and outputs in clients' shared-memory regions
        device_exports  DeviceExports   GPU outputs exported by CUDA IPC to BLS callers, and who maps them

Per-stub feature state (multiplex holdings, the sequence batcher that owns a stub, the client shm
regions a stub maps) is kept by its feature keyed by the StubProcess, since it dies with the stub.
`features.install.feature_services(core)` builds this object; ModelVersion passes it to every
instance it starts, and every StubProcess is given one: supervision never imports a feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pystub_backend.backend.config.model_config import ModelConfig
    from pystub_backend.backend.features.bls.device_exports import DeviceExports
    from pystub_backend.backend.features.bls.payloads import PayloadRegistry
    from pystub_backend.backend.features.custom_metrics import CustomMetrics
    from pystub_backend.backend.inference import InferRequest, Tensor
    from pystub_backend.backend.response_stream import ResponseStream
    from pystub_backend.backend.supervision.handlers import BackendHandlers
    from pystub_backend.backend.supervision.stub_process import StubProcess
    from pystub_backend.backend.telemetry.tracing import Tracer

__all__ = ["ClientRegions", "RescheduleOwner", "ServerCore", "ServedVersion", "StubServices"]


class ServedVersion(Protocol):
    """A loaded model version as feature handlers see it (BLS checks)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int | str: ...

    @property
    def ready(self) -> bool: ...


class RescheduleOwner(Protocol):
    """The iterative sequence batcher whose batch runs on a stub (scheduling/sequence_stubs.py):
    the stub's SequenceRescheduled frames are answered by it."""

    def on_rescheduled(self, request: InferRequest, rid: int) -> bool: ...


class ServerCore(Protocol):
    """The part of the server core that stubs may reach: BLS and `pb_utils` model control."""

    def model_config(self, name: str, version: str = "") -> ModelConfig: ...

    def model_versions(self) -> Sequence[ServedVersion]: ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...

    async def infer_stream(self, request: InferRequest) -> ResponseStream: ...

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


@dataclass(frozen=True)
class StubServices:
    handlers: BackendHandlers
    custom_metrics: CustomMetrics
    bls_payloads: PayloadRegistry
    client_regions: ClientRegions
    device_exports: DeviceExports
    core: ServerCore | None = None
