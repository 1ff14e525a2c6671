"""The DeviceMemory of a stub on an NVIDIA GPU, through NVIDIA's CUDA bindings (`cuda-bindings` 12.x
or 13.x, the `gpu` extra).

Imported only by a stub that meets a GPU tensor (`open_cuda`), so a stub that never does creates
no CUDA context and holds no device memory. What it does on each call:

- **the device is scoped**: each call makes its device current and then gives the thread back the
  device it had (as Triton's ScopedSetDevice), so later `torch` work on "cuda" lands where the
  model put it. One exception: a thread whose earlier device has no context yet (it never used
  CUDA there) keeps pystub's, since setting it back would create a context there, hundreds of MiB
  on a GPU the instance does not use.
- **copies are done when they return**: `cudaMemcpyAsync` on one blocking stream per device, then
  `cudaStreamSynchronize` of that stream. A blocking stream waits for the work queued before it on
  the legacy default stream (where PyTorch computes unless told otherwise), and the synchronization
  makes the bytes visible to every reader, another process included: CUDA's synchronous
  `cudaMemcpy` returns from a host-to-device copy once the bytes are staged and from a
  device-to-device copy at once. Copies between devices are `cudaMemcpyPeerAsync`.
- **the IPC handle's 64 bytes are read and written through `getPtr()`**, the one way every release
  has (cuda-bindings 13.4.2 dropped `cudaIpcMemHandle_t.reserved`).
- **every failure is a DeviceError**, named from the table of the API that returned it (runtime:
  `cudaGetErrorName`, driver: `cuGetErrorName`), and so is anything the bindings raise (a missing
  attribute, a driver library that cannot be loaded): callers release claims and fall back on it.
- **a handle this process exported is not opened through CUDA**, which refuses it in the exporting
  process (an async model calling itself through BLS maps its own export): its pointer is returned.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pystub_backend.devices.interface import IPC_HANDLE_SIZE, DeviceError, host_address
from pystub_backend.devices.numbering import DeviceNumbering

__all__ = ["CudaMemory", "open_cuda"]


class CudaMemory:
    """DeviceMemory on cuda-bindings' `runtime` and `driver` modules (or stand-ins of their shape)."""

    def __init__(self, runtime: Any, driver: Any, numbering: DeviceNumbering | None = None) -> None:  # noqa: ANN401
        self._rt = runtime
        self._driver = driver
        self._numbering = numbering or DeviceNumbering()
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}  # server device id -> the blocking stream pystub copies on
        self._exported: dict[bytes, int] = {}  # handles this process made -> their block's base
        self._self_opened: dict[int, int] = {}  # base -> opens of this process's own export

    # -- calling the bindings ---------------------------------------------------------------------
    def _call(self, what: str, function: Callable[..., tuple[Any, ...]], *args: Any) -> Any:  # noqa: ANN401
        """The value(s) of one bindings call. Raises DeviceError for its error code and for anything
        the call raises."""
        try:
            error, *values = function(*args)
        except Exception as exc:  # the bindings' own exceptions: a missing name, no driver library
            raise DeviceError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        if int(error) != 0:  # cudaSuccess and CUDA_SUCCESS
            raise DeviceError(f"{what} failed: {self._reason(error)}")
        return values[0] if len(values) == 1 else tuple(values) if values else None

    def _reason(self, error: Any) -> str:  # noqa: ANN401 - a cudaError_t or a CUresult
        runtime = isinstance(error, self._rt.cudaError_t)
        name_of, text_of = ((self._rt.cudaGetErrorName, self._rt.cudaGetErrorString) if runtime
                            else (self._driver.cuGetErrorName, self._driver.cuGetErrorString))
        try:
            name, text = name_of(error)[1], text_of(error)[1]
        except Exception:  # an unknown code, or no library to ask
            return f"CUDA error {int(error)}"
        return f"{_text(text)} ({_text(name)})"

    @contextmanager
    def _on(self, device_id: int) -> Iterator[int]:
        """Make the device current for the block; then give the thread its own device back."""
        ordinal = self._numbering.to_local(device_id)
        previous = int(self._call("cudaGetDevice", self._rt.cudaGetDevice))
        if previous != ordinal:
            self._call(f"cudaSetDevice({ordinal})", self._rt.cudaSetDevice, ordinal)
        try:
            yield ordinal
        finally:
            if previous != ordinal and self._has_context(previous):
                self._call(f"cudaSetDevice({previous})", self._rt.cudaSetDevice, previous)

    def _has_context(self, ordinal: int) -> bool:
        try:
            device = self._call("cuDeviceGet", self._driver.cuDeviceGet, ordinal)
            _, active = self._call("cuDevicePrimaryCtxGetState", self._driver.cuDevicePrimaryCtxGetState, device)
        except DeviceError:
            return True  # cannot tell: restore, as Triton does
        return bool(active)

    def _stream(self, device_id: int) -> Any:  # noqa: ANN401 - a cudaStream_t; the device must be current
        with self._lock:
            stream = self._streams.get(device_id)
        if stream is None:
            stream = self._call("cudaStreamCreateWithFlags", self._rt.cudaStreamCreateWithFlags,
                                self._rt.cudaStreamDefault)  # blocking: ordered after the legacy stream
            with self._lock:
                stream = self._streams.setdefault(device_id, stream)
        return stream

    # -- memory -----------------------------------------------------------------------------------
    def alloc(self, device_id: int, byte_size: int) -> int:
        if byte_size == 0:
            return 0
        with self._on(device_id):
            return int(self._call(f"cudaMalloc({byte_size})", self._rt.cudaMalloc, byte_size))

    def free(self, device_id: int, pointer: int) -> None:
        if pointer == 0:
            return
        with self._lock:
            for handle in [h for h, base in self._exported.items() if base == pointer]:
                del self._exported[handle]
        with self._on(device_id):
            self._call("cudaFree", self._rt.cudaFree, pointer)

    # -- copies -----------------------------------------------------------------------------------
    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        self._copy(device_id, host_address(destination), pointer, destination.nbytes,
                   self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        self._copy(device_id, pointer, host_address(source), source.nbytes,
                   self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def device_copy(self, device_id: int, destination: int, source: int, nbytes: int) -> None:
        self._copy(device_id, destination, source, nbytes, self._rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    def _copy(self, device_id: int, destination: int, source: int, size: int, kind: Any) -> None:  # noqa: ANN401
        if size == 0:
            return
        with self._on(device_id):
            stream = self._stream(device_id)
            self._call("cudaMemcpyAsync", self._rt.cudaMemcpyAsync, destination, source, size, kind, stream)
            self._call("cudaStreamSynchronize", self._rt.cudaStreamSynchronize, stream)

    def peer_copy(self, destination_device: int, destination: int, source_device: int, source: int,
                  nbytes: int) -> None:
        if nbytes == 0:
            return
        # On the source's stream: the legacy stream orders only the work of its own device, and the
        # source was written there (a stream of the destination would not wait for it).
        destination_ordinal = self._numbering.to_local(destination_device)
        with self._on(source_device) as source_ordinal:
            stream = self._stream(source_device)
            self._call("cudaMemcpyPeerAsync", self._rt.cudaMemcpyPeerAsync, destination, destination_ordinal,
                       source, source_ordinal, nbytes, stream)
            self._call("cudaStreamSynchronize", self._rt.cudaStreamSynchronize, stream)

    # -- streams ----------------------------------------------------------------------------------
    def consumer_stream(self, device_id: int) -> int:
        with self._on(device_id):
            return int(self._stream(device_id))

    def wait_stream(self, device_id: int) -> None:
        with self._on(device_id):
            self._call("cudaStreamSynchronize", self._rt.cudaStreamSynchronize, self._stream(device_id))

    def synchronize(self, device_id: int) -> None:
        with self._on(device_id):
            self._call("cudaDeviceSynchronize", self._rt.cudaDeviceSynchronize)

    # -- CUDA IPC ---------------------------------------------------------------------------------
    def export_handle(self, device_id: int, pointer: int) -> tuple[bytes, int]:
        # A handle names a whole cudaMalloc block, and caching allocators hand out tensors inside
        # blocks: the offset comes from the block's start (as Triton's python backend).
        with self._on(device_id):
            base, _ = self._call("cuMemGetAddressRange", self._driver.cuMemGetAddressRange, pointer)
            native = self._call("cudaIpcGetMemHandle", self._rt.cudaIpcGetMemHandle, int(base))
            handle = self._bytes_of(native)
        with self._lock:
            self._exported[handle] = int(base)
        return handle, pointer - int(base)

    def open_handle(self, device_id: int, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise DeviceError(f"a CUDA IPC handle has {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        with self._lock:
            own = self._exported.get(bytes(handle))
            if own is not None:  # CUDA refuses a process its own handle: the memory is here already
                self._self_opened[own] = self._self_opened.get(own, 0) + 1
                return own
        with self._on(device_id):
            native = self._native(handle)
            return int(self._call("cudaIpcOpenMemHandle", self._rt.cudaIpcOpenMemHandle, native,
                                  self._rt.cudaIpcMemLazyEnablePeerAccess))

    def close_handle(self, device_id: int, pointer: int) -> None:
        with self._lock:
            opens = self._self_opened.get(pointer, 0)
            if opens:
                if opens == 1:
                    del self._self_opened[pointer]
                else:
                    self._self_opened[pointer] = opens - 1
                return
        with self._on(device_id):
            self._call("cudaIpcCloseMemHandle", self._rt.cudaIpcCloseMemHandle, pointer)

    def _bytes_of(self, native: Any) -> bytes:  # noqa: ANN401 - a cudaIpcMemHandle_t
        try:
            return ctypes.string_at(int(native.getPtr()), IPC_HANDLE_SIZE)
        except Exception as exc:
            raise DeviceError(f"reading a cudaIpcMemHandle_t failed: {type(exc).__name__}: {exc}") from exc

    def _native(self, handle: bytes) -> Any:  # noqa: ANN401
        try:
            native = self._rt.cudaIpcMemHandle_t()
            ctypes.memmove(int(native.getPtr()), bytes(handle), IPC_HANDLE_SIZE)
        except Exception as exc:
            raise DeviceError(f"building a cudaIpcMemHandle_t failed: {type(exc).__name__}: {exc}") from exc
        return native


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_cuda(numbering: DeviceNumbering | None = None) -> CudaMemory:
    """The CUDA runtime. Raises DeviceError when NVIDIA's bindings are not installed (the `gpu`
    extra) or cannot be imported."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
            from cuda import cudart as runtime
        except ImportError:
            raise DeviceError("GPU tensors need the CUDA runtime bindings: pip install 'pystub-backend[gpu]'") \
                from None
    except Exception as exc:
        raise DeviceError(f"the CUDA bindings cannot be imported: {type(exc).__name__}: {exc}") from exc
    return CudaMemory(runtime, driver, numbering)
