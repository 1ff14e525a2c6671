"""The DeviceMemory of a stub on an NVIDIA GPU, through the CUDA runtime (`cuda-python`, the `gpu` extra).

Imported only by a stub that meets a GPU tensor (`open_cuda`), so a stub that never does creates
no CUDA context and holds no device memory. Every call selects its device first
(`cudaSetDevice`): a stub serves one device, but model code may have changed the current one.
Copies are synchronous `cudaMemcpy` on the default stream, which orders them after the
model's work on that device's legacy default stream; a model that computes on its own stream
must synchronize it before returning (as under Triton).
"""

from __future__ import annotations

from typing import Any

from pystub_backend.devices.interface import IPC_HANDLE_SIZE, DeviceError, host_address

__all__ = ["CudaMemory", "open_cuda"]


class CudaMemory:
    """DeviceMemory on the CUDA runtime bindings."""

    def __init__(self, runtime: Any) -> None:  # noqa: ANN401 - cuda.bindings.runtime
        self._rt = runtime

    def _check(self, what: str, result: tuple[Any, ...]) -> Any:  # noqa: ANN401 - the call's value
        error, *values = result
        if error != self._rt.cudaError_t.cudaSuccess:
            _, text = self._rt.cudaGetErrorString(error)
            raise DeviceError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")
        return values[0] if values else None

    def _on(self, device_id: int) -> None:
        self._check(f"cudaSetDevice({device_id})", self._rt.cudaSetDevice(device_id))

    def alloc(self, device_id: int, byte_size: int) -> int:
        self._on(device_id)
        return int(self._check(f"cudaMalloc({byte_size})", self._rt.cudaMalloc(byte_size)))

    def free(self, device_id: int, pointer: int) -> None:
        self._on(device_id)
        self._check("cudaFree", self._rt.cudaFree(pointer))

    def to_host(self, device_id: int, pointer: int, destination: memoryview) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._copy(device_id, host_address(destination), pointer, destination.nbytes, kind)

    def from_host(self, device_id: int, pointer: int, source: memoryview) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._copy(device_id, pointer, host_address(source), source.nbytes, kind)

    def _copy(self, device_id: int, destination: int, source: int, size: int, kind: Any) -> None:  # noqa: ANN401
        if size == 0:
            return
        self._on(device_id)
        self._check("cudaMemcpy", self._rt.cudaMemcpy(destination, source, size, kind))

    def export_handle(self, device_id: int, pointer: int) -> bytes:
        self._on(device_id)
        handle = self._check("cudaIpcGetMemHandle", self._rt.cudaIpcGetMemHandle(pointer))
        return bytes(handle.reserved)

    def open_handle(self, device_id: int, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise DeviceError(f"a CUDA IPC handle has {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        self._on(device_id)
        native = self._rt.cudaIpcMemHandle_t()
        native.reserved = handle
        flags = self._rt.cudaIpcMemLazyEnablePeerAccess
        return int(self._check("cudaIpcOpenMemHandle", self._rt.cudaIpcOpenMemHandle(native, flags)))

    def close_handle(self, device_id: int, pointer: int) -> None:
        self._on(device_id)
        self._check("cudaIpcCloseMemHandle", self._rt.cudaIpcCloseMemHandle(pointer))


def open_cuda() -> CudaMemory:
    """The CUDA runtime. Raises DeviceError when cuda-python is not installed (the `gpu` extra)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python before 12.6
        except ImportError:
            raise DeviceError("GPU tensors need the CUDA runtime bindings: pip install 'pystub-backend[gpu]'") \
                from None
    return CudaMemory(runtime)
