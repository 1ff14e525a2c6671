"""Who still uses each GPU buffer a stub exported by CUDA IPC: the lifetime of BLS GPU tensors.

    callee stub ──Response(output [-2, dev, export id, offset, nbytes, handle])──▶ exchange: add()
                                                     (held by the InferResponse until released)
    BlsCall._forward ──claim(caller)──▶ BlsResponse(output [-2, dev, claim id, ...]) ──▶ caller stub
    caller stub ──DeviceCleanup(claim ids)──▶ release()          (its mapping is closed)
    no hold and no claim left ──▶ DeviceRelease(export ids) ──▶ callee stub drops its reference

GPU inputs of a BLS call go the other way with the same table (features.bls.device_inputs): the
caller exports them in its BlsRequest, the BlsCall holds them until it ends, the target's stub
gets a claim with its request (exchange.place_request) and releases it when its mapping closes.

The exporter keeps the tensor (and so its device memory) alive until it gets DeviceRelease, which
is sent only when the response that carried the export is released and every consumer has closed
its mapping: nothing is freed while mapped. A consumer that dies releases its claims (its mappings
died with it); an exporter that dies takes its exports with it: they are dropped, and a consumer
that had not opened one yet is told so by the forwarding call (`exporter_gone`) or by the failing
open. Both deaths are noticed by polling `alive`, as the payload registry does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pystub_backend.backend.inference import DeviceRef, ExportGoneError, Tensor
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireTensor

if TYPE_CHECKING:
    from pystub_backend.backend.supervision.stub_process import StubProcess

__all__ = ["DeviceExports", "ExportKey", "SWEEP_SECONDS"]

log = logging.getLogger("pystub.bls")

ExportKey = tuple[str, int]  # (exporter stub's base name, its export id)
SWEEP_SECONDS = 0.25
Notify = Callable[["StubProcess", list[int]], None]


@dataclass
class _Export:
    exporter: StubProcess
    holds: int = 1  # responses that carry it and are not released yet
    claims: dict[int, StubProcess] = field(default_factory=dict)  # claim id -> consumer stub


class DeviceExports:
    """The table of live exports. `notify(exporter, export_ids)` tells an exporter it may drop
    them (sends DeviceRelease); it is called outside the lock. Thread-safe."""

    def __init__(self, notify: Notify) -> None:
        self._notify = notify
        self._exports: dict[ExportKey, _Export] = {}
        self._claims: dict[int, ExportKey] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, exporter: StubProcess, export_id: int) -> ExportKey:
        """An export a response carries; held until `drop_hold`. Raises KeyError for a reused id."""
        key = (exporter.base, export_id)
        with self._lock:
            if key in self._exports:
                raise KeyError(f"stub '{exporter.instance_name}' exported GPU buffer {export_id} twice")
            self._exports[key] = _Export(exporter)
        self._ensure_sweeper()
        return key

    def received(self, exporter: StubProcess, handle: list[Any]) -> DeviceRef:
        """The export a stub's response names by `handle` ([-2, device, export id, offset, nbytes,
        IPC handle]), registered and held. Raises ValueError for a malformed handle, KeyError for
        a reused export id."""
        if len(handle) != 6 or not all(isinstance(item, int) for item in handle[1:5]) \
                or not isinstance(handle[5], bytes):
            raise ValueError(f"malformed GPU output handle {handle!r}")
        _, device_id, export_id, offset, nbytes, ipc_handle = handle
        return DeviceRef(self.add(exporter, export_id), device_id, offset, nbytes, ipc_handle)

    def outputs(self, exporter: StubProcess, wire_outputs: list[WireTensor],
                view: Callable[[list[Any]], memoryview]) -> list[Tensor]:
        """A stub's tensors (response outputs, BLS inputs) as Tensors: arena bytes through `view`,
        GPU exports registered and held (all dropped again when one is malformed). Raises what
        `view` and `received` raise."""
        outputs: list[Tensor] = []
        try:
            for name, datatype, shape, handle in wire_outputs:
                if handle and handle[0] == DEVICE_HANDLE_TAG:
                    outputs.append(Tensor(name, datatype, tuple(shape), b"", device=self.received(exporter, handle)))
                else:
                    outputs.append(Tensor(name, datatype, tuple(shape), view(handle)))
        except Exception:
            for tensor in outputs:
                if tensor.device is not None:
                    self.drop_hold(tensor.device.key)
            raise
        return outputs

    def discard(self, exporter: StubProcess, wire_outputs: list[WireTensor]) -> None:
        """Outputs nobody will take (their request is gone): the exporter may drop its GPU exports."""
        ids = [t.handle[2] for t in wire_outputs if t.handle and t.handle[0] == DEVICE_HANDLE_TAG]
        if ids and exporter.alive:
            self._notify(exporter, ids)

    def claim(self, key: ExportKey, consumer: StubProcess) -> int | None:
        """A claim of `consumer` on the export (its id goes to the consumer), or None when the
        export is gone (its exporter died)."""
        with self._lock:
            export = self._exports.get(key)
            if export is None:
                return None
            claim_id = next(self._ids)
            export.claims[claim_id] = consumer
            self._claims[claim_id] = key
            return claim_id

    def claim_tensor(self, tensor: Tensor, consumer: StubProcess, what: str) -> WireTensor:
        """The GPU tensor as `consumer` gets it: a claim on its export, to map. Raises
        ExportGoneError (naming `what`) when its exporter died."""
        device = tensor.device
        assert device is not None
        claim_id = self.claim(device.key, consumer) if self.exporter_alive(device.key) else None
        if claim_id is None:
            raise ExportGoneError(f"the GPU {what} '{tensor.name}' is gone: the stub that exported it exited "
                                  f"before it could be mapped")
        return WireTensor(tensor.name, tensor.datatype, list(tensor.shape),
                          [DEVICE_HANDLE_TAG, device.device_id, claim_id, device.offset, device.nbytes,
                           device.ipc_handle])

    def drop_hold(self, key: ExportKey) -> None:
        """The response that carried the export was released (forwarded or dropped)."""
        with self._lock:
            export = self._exports.get(key)
            if export is None:
                return
            export.holds -= 1
        self._settle(key)

    def release(self, consumer: StubProcess, claim_ids: list[int]) -> list[int]:
        """The consumer closed these mappings; returns the ids it does not hold (logged by the caller)."""
        unknown: list[int] = []
        touched: set[ExportKey] = set()
        with self._lock:
            for claim_id in claim_ids:
                key = self._claims.get(claim_id)
                export = self._exports.get(key) if key is not None else None
                if key is None or export is None or export.claims.get(claim_id) is not consumer:
                    if key is None:
                        unknown.append(claim_id)
                    continue
                del export.claims[claim_id], self._claims[claim_id]
                touched.add(key)
        for key in touched:
            self._settle(key)
        return unknown

    def release_unsent(self, consumer: StubProcess, tensors: list[WireTensor]) -> None:
        """The claims among `tensors` (GPU inputs placed for `consumer`) that never reached it."""
        claims = [t.handle[2] for t in tensors if t.handle and t.handle[0] == DEVICE_HANDLE_TAG]
        if claims:
            self.release(consumer, claims)

    def exporter_alive(self, key: ExportKey) -> bool:
        with self._lock:
            export = self._exports.get(key)
        return export is not None and export.exporter.alive

    def _settle(self, key: ExportKey) -> None:
        """Drop an export nobody holds or claims, and tell its exporter."""
        with self._lock:
            export = self._exports.get(key)
            if export is None or export.holds > 0 or export.claims:
                return
            del self._exports[key]
        if export.exporter.alive:
            self._notify(export.exporter, [key[1]])

    def __len__(self) -> int:
        with self._lock:
            return len(self._exports)

    def claims(self) -> int:
        with self._lock:
            return len(self._claims)

    # -- deaths --------------------------------------------------------------------------------------
    def sweep(self) -> None:
        """Forget the exports of dead exporters and the claims of dead consumers."""
        with self._lock:
            dead_exports = [key for key, export in self._exports.items() if not export.exporter.alive]
            for key in dead_exports:
                for claim_id in self._exports.pop(key).claims:
                    self._claims.pop(claim_id, None)
            dead_claims = [(claim_id, key) for claim_id, key in self._claims.items()
                           if not self._exports[key].claims[claim_id].alive]
            for claim_id, key in dead_claims:
                del self._claims[claim_id], self._exports[key].claims[claim_id]
        for key in {key for _, key in dead_claims}:
            self._settle(key)

    def _ensure_sweeper(self) -> None:
        if self._sweeper is not None and not self._sweeper.done():
            return
        try:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_while_any())
        except RuntimeError:  # no loop (unit tests of the table): `sweep()` is called by hand
            self._sweeper = None

    async def _sweep_while_any(self) -> None:
        while len(self):
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                self.sweep()
            except Exception:  # one broken entry must not stop the sweep
                log.exception("failed to sweep the GPU exports of dead stubs")
