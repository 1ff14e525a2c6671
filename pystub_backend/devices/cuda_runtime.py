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

    def __init__(self, runtime: Any, driver: Any) -> None:  # noqa: ANN401 - cuda.bindings.runtime, .driver
        self._rt = runtime
        self._driver = driver

    def _check(self, what: str, result: tuple[Any, ...]) -> Any:  # noqa: ANN401 - the call's value
        error, *values = result
        if int(error) != 0:  # cudaSuccess and CUDA_SUCCESS
            raise DeviceError(f"{what} failed: {self._reason(int(error))}")
        return values[0] if values else None

    def _reason(self, code: int) -> str:
        try:  # runtime and driver codes agree for the errors these calls return
            _, text = self._rt.cudaGetErrorString(self._rt.cudaError_t(code))
        except ValueError:
            return f"CUDA error {code}"
        return text.decode() if isinstance(text, bytes) else str(text)

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

    def device_copy(self, device_id: int, destination: int, source: int, nbytes: int) -> None:
        self._copy(device_id, destination, source, nbytes, self._rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    def _copy(self, device_id: int, destination: int, source: int, size: int, kind: Any) -> None:  # noqa: ANN401
        if size == 0:
            return
        self._on(device_id)
        self._check("cudaMemcpy", self._rt.cudaMemcpy(destination, source, size, kind))

    def export_handle(self, device_id: int, pointer: int) -> tuple[bytes, int]:
        # A handle names a whole cudaMalloc block, and caching allocators (PyTorch's) hand out
        # tensors inside blocks: the offset comes from the block's start (as Triton's python backend).
        self._on(device_id)
        base = int(self._check("cuMemGetAddressRange", self._driver.cuMemGetAddressRange(pointer)))
        handle = self._check("cudaIpcGetMemHandle", self._rt.cudaIpcGetMemHandle(base))
        return bytes(handle.reserved), pointer - base

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
        from cuda.bindings import driver, runtime
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
            from cuda import cudart as runtime
        except ImportError:
            raise DeviceError("GPU tensors need the CUDA runtime bindings: pip install 'pystub-backend[gpu]'") \
                from None
    return CudaMemory(runtime, driver)
