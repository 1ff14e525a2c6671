"""GPU tensors between stubs by CUDA IPC: a BLS callee exports its GPU outputs, the caller maps them.

    callee (exporter)                                   caller (consumer)
    response_to_wire: GPU output on the device the
    request prefers ─▶ export(): a copy into a buffer
    this stub owns, synchronized; cudaIpcGetMemHandle
    ─▶ [-2, dev, export id, offset, nbytes, handle] ──▶ backend
                                      backend ─▶ [-2, dev, claim id, ...] ─▶ open_output():
                                                 cudaIpcOpenMemHandle, a GPU pb_utils.Tensor
                                                 whose owner, when collected, has the mapping
                                                 closed (after the device is idle) and queues
                                                 DeviceCleanup(claim id)
    DeviceRelease(export ids) ◀─ backend, once no response holds and no caller maps the export:
    the buffer goes back to the stub's pool

The exported bytes are a copy, as Triton's python backend makes one (`CopyBuffer` into memory the
server owns, then `cudaStreamSynchronize`): the consumer is another process, so no stream order
protects it; the copy runs after the model's work on the default stream and is waited for before
the handle leaves. A copy is also what CUDA can always export: the model's own memory may be
NULL (an empty tensor: sent as an empty host tensor instead), another stub's memory it mapped, or
not a cudaMalloc block (caching pools, expandable segments). When exporting fails all the same,
the output is copied to the host as for any other caller (None from `export`).

Which requests may keep their GPU outputs on a device is per request (`expect`), like client
regions: the caller's `PreferredMemory(TRITONSERVER_MEMORY_GPU, id)`. Outputs on another device,
or on the CPU, are copied to the host as before; a caller that prefers a GPU gets host outputs
copied onto it (`to_device`, into a pooled buffer: no cudaMalloc/cudaFree per tensor), as
Triton's response allocator does.

GPU inputs of a BLS call go the same way the other way round: the caller exports them (when the
server says the target takes them, features.bls.device_inputs in the backend) and the target's
stub maps them (`open_input`).
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pystub_backend.devices.interface import DeviceError, DeviceMemory
from pystub_backend.devices.pool import BufferPool
from pystub_backend.ipc.messages.bls import DeviceRelease
from pystub_backend.ipc.records import DEVICE_HANDLE_TAG, WireTensor
from pystub_backend.stub.device_outputs import DeviceBuffer
from pystub_backend.stub.handlers import StubHandlers

__all__ = ["expect", "export_device", "export", "unexport", "open_output", "open_input", "to_device", "facts",
           "register", "device_taking_inputs", "export_input"]

_lock = threading.Lock()
_export_ids = itertools.count(1)
_exports: dict[int, tuple[int, int]] = {}  # export id -> (device, the pooled copy it names)
_device_of_request: dict[int, tuple[object, int]] = {}  # rid -> (token, device id)
_mappings = 0  # GPU outputs of other stubs this stub maps now
_pool: BufferPool | None = None


def _memory() -> DeviceMemory:
    from pystub_backend.stub import device_outputs  # the stub's one DeviceMemory, opened on first use

    return device_outputs._device_memory()


def _buffers() -> BufferPool:
    """The stub's pool of device buffers (exports, outputs copied onto a GPU), made on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = BufferPool(_memory())
        return _pool


def _give_back(device_id: int, pointer: int) -> None:
    try:
        _buffers().give(device_id, pointer)
    except DeviceError as exc:  # a finalizer or a release: nobody to raise to
        print(f"pystub: giving back a device buffer failed: {exc}", file=sys.stderr, flush=True)


# -- exporter ---------------------------------------------------------------------------------------
def expect(rid: int, owner: Any, device_id: int) -> None:  # noqa: ANN401 - the request's state
    """Request `rid` lets GPU outputs on `device_id` stay there, until `owner` is collected."""
    token = object()
    _device_of_request[rid] = (token, device_id)
    weakref.finalize(owner, _forget, rid, token).atexit = False


def _forget(rid: int, token: object) -> None:
    entry = _device_of_request.get(rid)
    if entry is not None and entry[0] is token:
        del _device_of_request[rid]


def export_device(rid: int) -> int | None:
    entry = _device_of_request.get(rid)
    return None if entry is None else entry[1]


def export(name: str, datatype: str, shape: list[int], buffer: DeviceBuffer) -> WireTensor | None:
    """The tensor as an IPC export of a synchronized copy this stub owns (held until DeviceRelease),
    or None when it is empty or CUDA cannot copy or export it: the caller then copies it to the host."""
    if buffer.nbytes == 0:
        return None
    try:
        copy = _buffers().take(buffer.device_id, buffer.nbytes)
    except DeviceError:
        return None
    try:
        _memory().device_copy(buffer.device_id, copy, buffer.pointer, buffer.nbytes)  # done when it returns
        handle, offset = _memory().export_handle(buffer.device_id, copy)
    except DeviceError:
        _give_back(buffer.device_id, copy)
        return None
    with _lock:
        export_id = next(_export_ids)
        _exports[export_id] = (buffer.device_id, copy)
    return WireTensor(name, datatype, list(shape),
                      [DEVICE_HANDLE_TAG, buffer.device_id, export_id, offset, buffer.nbytes, handle])


def device_taking_inputs(request: Any, device_id: int) -> int:  # noqa: ANN401 - pb_utils.InferenceRequest
    """`device_id` when the BLS call's target takes GPU inputs on it as they are (the server says,
    backend.features.bls.device_inputs), else -1: then the caller copies them to the host."""
    from pystub_backend.stub.features import model_control

    version = request._model_version
    accepts = model_control.takes_device_inputs(request._model_name, "" if version < 0 else str(version), device_id)
    return device_id if accepts else -1


def export_input(name: str, datatype: str, shape: Any, buffer: DeviceBuffer) -> WireTensor | None:  # noqa: ANN401
    """A BLS call's GPU input as an IPC export (a synchronized copy), or None: then it is copied to the host."""
    return export(name, datatype, list(shape), buffer)


def unexport(handle: list[Any]) -> None:
    """Drop an export that never left this stub (its response failed)."""
    with _lock:
        entry = _exports.pop(handle[2], None)
    if entry is not None:
        _give_back(*entry)


def _on_release(stub: Any, message: DeviceRelease) -> None:  # noqa: ANN401 - the stub
    with _lock:
        released = [_exports.pop(export_id) for export_id in message.exports if export_id in _exports]
    for device_id, pointer in released:
        _give_back(device_id, pointer)


# -- consumer ---------------------------------------------------------------------------------------
class _Mapping:
    """Owns one opened IPC handle (or pooled buffer): the GPU tensor's owner; collected, it lets go."""

    __slots__ = ("__weakref__",)


class _Closer:
    """Closes mappings on a thread of its own: closing waits until the device is idle (the model may
    still have kernels queued that read the mapping), which a finalizer must not wait for wherever
    the garbage collector runs; then the claim goes back, and only then may the exporter reuse it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, int, int, Callable[[int], None]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._started = threading.Lock()

    def close_later(self, device_id: int, base: int, claim_id: int, release: Callable[[int], None]) -> None:
        self._queue.put((device_id, base, claim_id, release))
        with self._started:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pystub-device-close", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            device_id, base, claim_id, release = self._queue.get()
            _close(device_id, base, claim_id, release)


_closer = _Closer()


def _close(device_id: int, base: int, claim_id: int, release: Callable[[int], None]) -> None:
    global _mappings
    try:
        memory = _memory()
        memory.synchronize(device_id)
        memory.close_handle(device_id, base)
    except DeviceError as exc:
        print(f"pystub: closing a GPU tensor mapped by CUDA IPC failed: {exc}", file=sys.stderr, flush=True)
    finally:
        with _lock:
            _mappings -= 1
        release(claim_id)  # only now may the exporter let go of the memory


def open_output(wire_tensor: WireTensor, release_claim: Callable[[int], None], what: str = "output") -> Any:  # noqa: ANN401
    """A GPU pb_utils.Tensor over the mapped export. Raises DeviceError (the claim released) when
    the handle cannot be opened, e.g. because the exporter exited."""
    from pystub_backend.stub import pb_utils

    global _mappings
    name, datatype, shape, handle = wire_tensor
    _, device_id, claim_id, offset, _nbytes, ipc_handle = handle
    try:
        base = _memory().open_handle(device_id, bytes(ipc_handle))
    except Exception as exc:  # a DeviceError, or a record the bindings cannot take: the claim goes back
        release_claim(claim_id)
        raise DeviceError(f"the GPU {what} '{name}' could not be mapped: {exc}") from None
    owner = _Mapping()
    with _lock:
        _mappings += 1
    weakref.finalize(owner, _closer.close_later, device_id, base, claim_id, release_claim).atexit = False
    return pb_utils.Tensor._on_device(name, datatype, list(shape), device_id, base + offset, owner)


def open_input(wire_tensor: WireTensor) -> Any:  # noqa: ANN401 - a pb_utils.Tensor
    """A BLS caller's GPU input, mapped (its claim goes back when the tensor is collected).
    Raises ValueError when it cannot be mapped (the request fails)."""
    from pystub_backend.stub.features import bls  # bls imports this module

    try:
        return open_output(wire_tensor, bls.release_claim, "input")
    except DeviceError as exc:
        raise ValueError(str(exc)) from None


def to_device(tensor: Any, device_id: int) -> Any:  # noqa: ANN401 - pb_utils.Tensor in and out
    """A host output copied into a pooled buffer on `device_id` (given back when the tensor is
    collected). Raises DeviceError."""
    from pystub_backend.stub import pb_utils

    if tensor._wire == "BYTES":
        return tensor  # strings stay on the CPU, as on Triton
    host = np.ascontiguousarray(tensor._storage())
    if host.nbytes == 0:  # nothing to copy: a GPU tensor over NULL, as cudaMalloc(0) gives
        return pb_utils.Tensor._on_device(tensor.name(), tensor._wire, tensor.shape(), device_id, 0, None)
    pointer = _buffers().take(device_id, host.nbytes)
    try:
        _memory().from_host(device_id, pointer, host.reshape(-1).view(np.uint8).data)
    except BaseException:
        _give_back(device_id, pointer)
        raise
    owner = _Mapping()
    weakref.finalize(owner, _give_back, device_id, pointer).atexit = False
    return pb_utils.Tensor._on_device(tensor.name(), tensor._wire, tensor.shape(), device_id, pointer, owner)


def facts() -> dict[str, int]:
    """This stub's side, for BLS inspection: exports held for others, and mappings of others' outputs."""
    with _lock:
        return {"device_exports_held": len(_exports), "device_mappings": _mappings, "pid": os.getpid()}


def register(handlers: StubHandlers) -> None:
    """Drop exports the backend says nobody maps any more."""
    handlers.on_receiver(DeviceRelease, _on_release)
