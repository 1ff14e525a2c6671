"""A stand-in for NVIDIA's `cuda.bindings` (`runtime` and `driver`) over the fake device's engine.

The real `devices/cuda_runtime.py` runs against it in tests, in both shapes the wheels have
(read from cuda-bindings 12.9.10, 13.0.3, 13.4.2 and 13.5.0):

    shape "12"   cudaIpcMemHandle_t has `reserved` (64 bytes, settable) and `getPtr()`
    shape "13"   only `getPtr()`, the address of the 64-byte struct (13.4.2 and later)

and with their calling conventions: every call returns a tuple whose first item is the error enum
(`cudaError_t`, `CUresult`: int enums, unknown values raise ValueError), then the values, None on
failure; pointers are ints, ctypes objects or buffers; streams are `cudaStream_t` or ints;
`cudaIpcMemHandle_t(address)` views 64 bytes at `address`. A driver library missing is not
modelled. The semantics are CUDA's documented ones, strictly, through fake_engine: copies and
kernels are queued per stream and land only at a synchronization (synchronous `cudaMemcpy`
host-to-device returns once staged, device-to-device at once, device-to-host once done; `cudaFree`
synchronizes the device), ordinals are mapped through CUDA_VISIBLE_DEVICES, and a copy between
two devices needs `cudaMemcpyPeer*`.

`bindings(shape)` builds the two modules; `install(shape)` puts them in `sys.modules` as
`cuda.bindings.runtime` and `.driver`, for code that imports them itself (tritonclient's
cuda_shared_memory, in the device check's --fake run).
"""

from __future__ import annotations

import ctypes
import enum
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from pystub_backend.devices import fake_engine as engine

__all__ = ["bindings", "install", "SHAPES", "SHAPE_VARIABLE", "current_physical", "physical_of"]

SHAPES = ("12", "13")
SHAPE_VARIABLE = "PYSTUB_FAKE_CUDA_BINDINGS"  # which shape the fake machine's stubs get (default "13")


class cudaError_t(enum.IntEnum):  # noqa: N801 - the bindings' names
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidDevicePointer = 17
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorDeviceUninitialized = 201
    cudaErrorMapBufferObjectFailed = 205
    cudaErrorPeerAccessUnsupported = 217
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700
    cudaErrorNotSupported = 801


_RUNTIME_TEXT = {0: "no error", 1: "invalid argument", 2: "out of memory", 17: "invalid device pointer",
                 100: "no CUDA-capable device is detected", 101: "invalid device ordinal",
                 201: "invalid device context", 205: "mapping of buffer object failed",
                 217: "peer access is not supported between these two devices", 400: "invalid resource handle",
                 700: "an illegal memory access was encountered", 801: "operation not supported"}


class CUresult(enum.IntEnum):  # noqa: N801
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


_DRIVER_TEXT = {0: "no error", 1: "invalid argument", 2: "out of memory", 101: "invalid device ordinal",
                201: "invalid device context", 500: "named symbol not found",
                700: "an illegal memory access was encountered"}


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaDeviceAttr(enum.IntEnum):  # noqa: N801
    cudaDevAttrUnifiedAddressing = 41


class cudaStream_t:  # noqa: N801
    """A stream handle: its value is the fake stream's id."""

    def __init__(self, init_value: int = 0) -> None:
        self._value = int(init_value)

    def __int__(self) -> int:
        return self._value

    def getPtr(self) -> int:  # noqa: N802
        return self._value

    def __repr__(self) -> str:
        return f"<CUstream {self._value:#x}>"


class _HandleCore:
    """cudaIpcMemHandle_t as cuda-bindings 13.4.2 and later shape it: 64 bytes behind `getPtr()`."""

    def __init__(self, _ptr: int = 0) -> None:
        self._own = None if _ptr else ctypes.create_string_buffer(engine.HANDLE_SIZE)
        self._address = int(_ptr) if _ptr else ctypes.addressof(self._own)  # type: ignore[arg-type]

    def getPtr(self) -> int:  # noqa: N802
        return self._address

    def _bytes(self) -> bytes:
        return ctypes.string_at(self._address, engine.HANDLE_SIZE)


class _HandleWithReserved(_HandleCore):
    """... and as 12.x (to 12.9.10) and 13.0-13.3 do: the bytes also as `reserved`."""

    @property
    def reserved(self) -> bytes:
        return self._bytes()

    @reserved.setter
    def reserved(self, value: bytes) -> None:
        if len(value) != engine.HANDLE_SIZE:
            raise ValueError(f"reserved length must be 64, is {len(value)}")
        ctypes.memmove(self._address, bytes(value), engine.HANDLE_SIZE)


# -- the machine as this process's CUDA sees it ---------------------------------------------------
_current = threading.local()


def _physical(ordinal: int) -> int:
    devices = engine.visible_devices()
    if not 0 <= ordinal < len(devices):
        raise engine.FakeCudaError(int(cudaError_t.cudaErrorInvalidDevice), f"no device {ordinal}")
    return devices[ordinal]


def physical_of(ordinal: int) -> int:
    """The physical fake GPU that CUDA ordinal `ordinal` is in this process. Raises FakeCudaError."""
    return _physical(ordinal)


def _ordinal() -> int:
    return int(getattr(_current, "ordinal", 0))


def current_physical() -> int:
    """The physical device of this thread's current ordinal (cudaSetDevice's)."""
    return _physical(_ordinal())


def _address(value: Any) -> int:  # noqa: ANN401 - whatever the bindings accept as a pointer
    if isinstance(value, int):
        return value
    if isinstance(value, ctypes._SimpleCData):
        return int(value.value or 0)
    if isinstance(value, (ctypes.Array, ctypes.Structure)):
        return ctypes.addressof(value)
    if hasattr(value, "__int__"):
        return int(value)
    return int(np.frombuffer(value, dtype=np.uint8).ctypes.data)


def _stream(value: Any) -> engine.Stream:  # noqa: ANN401
    return engine.stream_by_id(0 if value is None else int(value), current_physical())


def _call(make_result: Callable[[], tuple[Any, ...]], width: int, enum_type: type[enum.IntEnum]) -> tuple[Any, ...]:
    """Run a call; a FakeCudaError becomes its error enum and `width` Nones, as the bindings return."""
    try:
        return (enum_type(0), *make_result())
    except engine.FakeCudaError as exc:
        return (enum_type(exc.code), *([None] * width))


# -- runtime --------------------------------------------------------------------------------------
def _is_device(pointer: int) -> bool:
    return engine.locate(pointer) is not None


def _kind_of(kind: int, destination: int, source: int) -> int:
    actual = {(False, True): 1, (True, False): 2, (True, True): 3, (False, False): 0}[
        (_is_device(source), _is_device(destination))]
    if kind != cudaMemcpyKind.cudaMemcpyDefault and kind != actual:
        raise engine.FakeCudaError(1, f"cudaMemcpyKind {kind} does not match the pointers (they are kind {actual})")
    if actual == 3:
        source_device, destination_device = engine.locate(source)[1], engine.locate(destination)[1]  # type: ignore[index]
        if source_device != destination_device:
            raise engine.FakeCudaError(1, "a copy between two devices needs cudaMemcpyPeer")
    return actual


def _staged_write(destination: int, source: int, size: int) -> Callable[[], None]:
    """A host-to-device copy: the host bytes are read now (staged), written when it lands."""
    staged = ctypes.string_at(source, size)

    def run() -> None:
        ctypes.memmove(destination, staged, size)
    return run


def _queue_copy(stream: engine.Stream, destination: int, source: int, size: int, kind: int) -> None:
    touches = tuple((pointer, size) for pointer in (destination, source) if _is_device(pointer))
    run = _staged_write(destination, source, size) if kind == 1 else engine.copy_op(destination, source, size)
    engine.enqueue(stream, run, touches)


def cudaGetDeviceCount() -> tuple[Any, ...]:  # noqa: N802
    return _call(lambda: (len(engine.visible_devices()),), 1, cudaError_t)


def cudaGetDevice() -> tuple[Any, ...]:  # noqa: N802
    def run() -> tuple[int]:
        if not engine.visible_devices():
            raise engine.FakeCudaError(100, "no device")
        return (_ordinal(),)
    return _call(run, 1, cudaError_t)


def cudaSetDevice(device: int) -> tuple[Any, ...]:  # noqa: N802
    def run() -> tuple[()]:
        engine.touch_context(_physical(int(device)))
        _current.ordinal = int(device)
        return ()
    return _call(run, 0, cudaError_t)


def cudaMalloc(size: int) -> tuple[Any, ...]:  # noqa: N802
    return _call(lambda: (engine.allocate(current_physical(), int(size)),), 1, cudaError_t)


def cudaFree(devPtr: Any) -> tuple[Any, ...]:  # noqa: N802, N803, ANN401
    def run() -> tuple[()]:
        pointer = _address(devPtr)
        found = engine.locate(pointer)
        if pointer and (found is None or found[0] != "allocation" or found[2] != pointer):
            raise engine.FakeCudaError(1, f"{pointer:#x} is not a cudaMalloc block")
        engine.release(pointer, found[1] if found else current_physical())
        return ()
    return _call(run, 0, cudaError_t)


def cudaMemcpy(dst: Any, src: Any, count: int, kind: Any) -> tuple[Any, ...]:  # noqa: N802, ANN401
    def run() -> tuple[()]:
        destination, source, size = _address(dst), _address(src), int(count)
        actual = _kind_of(int(kind), destination, source)
        legacy = engine.legacy_stream(current_physical())
        if actual == 0:
            ctypes.memmove(destination, source, size)
            return ()
        if actual == 1:  # pageable host-to-device: a stream sync, staged, returns before the DMA lands
            engine.synchronize(legacy)
        _queue_copy(legacy, destination, source, size, actual)
        if actual == 2:  # device-to-host: returns once the copy has completed
            engine.synchronize(legacy)
        return ()  # device-to-device: no host-side synchronization
    return _call(run, 0, cudaError_t)


def cudaMemcpyAsync(dst: Any, src: Any, count: int, kind: Any, stream: Any) -> tuple[Any, ...]:  # noqa: N802, ANN401
    def run() -> tuple[()]:
        destination, source, size = _address(dst), _address(src), int(count)
        actual = _kind_of(int(kind), destination, source)
        if actual == 0:
            ctypes.memmove(destination, source, size)
        else:
            _queue_copy(_stream(stream), destination, source, size, actual)
        return ()
    return _call(run, 0, cudaError_t)


def _peer(dst: Any, dst_device: int, src: Any, src_device: int, count: int) -> tuple[int, int]:  # noqa: ANN401
    destination, source = _address(dst), _address(src)
    for pointer, ordinal in ((destination, dst_device), (source, src_device)):
        found = engine.locate(pointer)
        if found is None or found[1] != _physical(int(ordinal)):
            raise engine.FakeCudaError(1, f"{pointer:#x} is not memory of device {ordinal}")
    return destination, source


def cudaMemcpyPeerAsync(dst: Any, dstDevice: int, src: Any, srcDevice: int, count: int,  # noqa: N802, N803, ANN401
                        stream: Any) -> tuple[Any, ...]:  # noqa: ANN401
    def run() -> tuple[()]:
        destination, source = _peer(dst, dstDevice, src, srcDevice, count)
        engine.enqueue(_stream(stream), engine.copy_op(destination, source, int(count)),
                       ((destination, int(count)), (source, int(count))))
        return ()
    return _call(run, 0, cudaError_t)


def cudaStreamCreateWithFlags(flags: int) -> tuple[Any, ...]:  # noqa: N802
    return _call(lambda: (cudaStream_t(engine.create_stream(current_physical(), not int(flags) & 1).id),),
                 1, cudaError_t)


def cudaStreamCreate() -> tuple[Any, ...]:  # noqa: N802
    return cudaStreamCreateWithFlags(0)


def cudaStreamDestroy(stream: Any) -> tuple[Any, ...]:  # noqa: N802, ANN401
    def run() -> tuple[()]:
        found = _stream(stream)
        if found.legacy:
            raise engine.FakeCudaError(400, "the legacy stream cannot be destroyed")
        engine.destroy_stream(found)
        return ()
    return _call(run, 0, cudaError_t)


def _done(step: Callable[[], None]) -> Callable[[], tuple[()]]:
    def run() -> tuple[()]:
        step()
        return ()
    return run


def cudaStreamSynchronize(stream: Any) -> tuple[Any, ...]:  # noqa: N802, ANN401
    return _call(_done(lambda: engine.synchronize(_stream(stream))), 0, cudaError_t)


def cudaDeviceSynchronize() -> tuple[Any, ...]:  # noqa: N802
    return _call(_done(lambda: engine.synchronize_device(current_physical())), 0, cudaError_t)


def cudaDeviceGetAttribute(attr: Any, device: int) -> tuple[Any, ...]:  # noqa: N802, ANN401
    def run() -> tuple[int]:
        _physical(int(device))
        return (1 if int(attr) == cudaDeviceAttr.cudaDevAttrUnifiedAddressing else 0,)
    return _call(run, 1, cudaError_t)


def cudaGetErrorString(error: cudaError_t) -> tuple[Any, ...]:  # noqa: N802
    return (cudaError_t.cudaSuccess, _RUNTIME_TEXT[int(cudaError_t(error))].encode())


def cudaGetErrorName(error: cudaError_t) -> tuple[Any, ...]:  # noqa: N802
    return (cudaError_t.cudaSuccess, cudaError_t(error).name.encode())


def _ipc_functions(handle_type: type[_HandleCore]) -> dict[str, Callable[..., tuple[Any, ...]]]:
    def cudaIpcGetMemHandle(devPtr: Any) -> tuple[Any, ...]:  # noqa: N802, N803, ANN401
        def run() -> tuple[_HandleCore]:
            raw, _ = engine.export(_address(devPtr))
            handle = handle_type()
            ctypes.memmove(handle.getPtr(), raw, engine.HANDLE_SIZE)
            return (handle,)
        return _call(run, 1, cudaError_t)

    def cudaIpcOpenMemHandle(handle: _HandleCore, flags: int) -> tuple[Any, ...]:  # noqa: N802
        def run() -> tuple[int]:
            if not isinstance(handle, handle_type):
                raise TypeError(f"Argument 'handle' has incorrect type (expected cudaIpcMemHandle_t, got "
                                f"{type(handle).__name__})")
            if int(flags) != 1:
                raise engine.FakeCudaError(1, "flags must be cudaIpcMemLazyEnablePeerAccess")
            return (engine.open_handle(handle._bytes(), current_physical()),)
        return _call(run, 1, cudaError_t)

    return {"cudaIpcGetMemHandle": cudaIpcGetMemHandle, "cudaIpcOpenMemHandle": cudaIpcOpenMemHandle}


def cudaIpcCloseMemHandle(devPtr: Any) -> tuple[Any, ...]:  # noqa: N802, N803, ANN401
    return _call(_done(lambda: engine.close_handle(_address(devPtr))), 0, cudaError_t)


# -- driver ---------------------------------------------------------------------------------------
def cuMemGetAddressRange(dptr: Any) -> tuple[Any, ...]:  # noqa: N802, ANN401
    def run() -> tuple[int, int]:
        found = engine.locate(_address(dptr))
        if found is None:
            raise engine.FakeCudaError(int(CUresult.CUDA_ERROR_NOT_FOUND), "not device memory")
        return found[2], found[3]
    return _call(run, 2, CUresult)


def cuGetErrorName(error: CUresult) -> tuple[Any, ...]:  # noqa: N802
    return (CUresult.CUDA_SUCCESS, CUresult(error).name.encode())


def cuGetErrorString(error: CUresult) -> tuple[Any, ...]:  # noqa: N802
    return (CUresult.CUDA_SUCCESS, _DRIVER_TEXT[int(CUresult(error))].encode())


def cuDeviceGet(ordinal: int) -> tuple[Any, ...]:  # noqa: N802
    def run() -> tuple[int]:
        _physical(int(ordinal))
        return (int(ordinal),)
    return _call(run, 1, CUresult)


def cuDevicePrimaryCtxGetState(dev: int) -> tuple[Any, ...]:  # noqa: N802
    return _call(lambda: (0, int(_physical(int(dev)) in engine.contexts())), 2, CUresult)


_RUNTIME_NAMES = ("cudaError_t", "cudaMemcpyKind", "cudaDeviceAttr", "cudaStream_t", "cudaGetDeviceCount",
                  "cudaGetDevice", "cudaSetDevice", "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync",
                  "cudaMemcpyPeerAsync", "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamDestroy",
                  "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaDeviceGetAttribute", "cudaGetErrorString",
                  "cudaGetErrorName", "cudaIpcCloseMemHandle")
_DRIVER_NAMES = ("CUresult", "cuMemGetAddressRange", "cuGetErrorName", "cuGetErrorString", "cuDeviceGet",
                 "cuDevicePrimaryCtxGetState")


def bindings(shape: str = "13") -> tuple[types.ModuleType, types.ModuleType]:
    """(runtime, driver) modules shaped like cuda-bindings `shape` ("12" or "13")."""
    if shape not in SHAPES:
        raise ValueError(f"unknown cuda-bindings shape {shape!r}; expected one of {SHAPES}")
    base = _HandleWithReserved if shape == "12" else _HandleCore
    handle_type: type[_HandleCore] = type("cudaIpcMemHandle_t", (base,), {})
    runtime = types.ModuleType("cuda.bindings.runtime", f"stand-in cuda.bindings.runtime ({shape}.x shape)")
    namespace = globals()
    runtime.__dict__.update({name: namespace[name] for name in _RUNTIME_NAMES})
    runtime.__dict__.update(_ipc_functions(handle_type), cudaIpcMemHandle_t=handle_type,
                            CUDA_IPC_HANDLE_SIZE=engine.HANDLE_SIZE, cudaIpcMemLazyEnablePeerAccess=1,
                            cudaStreamDefault=0, cudaStreamNonBlocking=1, cudaStreamLegacy=engine.LEGACY_STREAM_ID)
    driver = types.ModuleType("cuda.bindings.driver", f"stand-in cuda.bindings.driver ({shape}.x shape)")
    driver.__dict__.update({name: namespace[name] for name in _DRIVER_NAMES})
    return runtime, driver


def install(shape: str = "13") -> None:
    """Make `import cuda.bindings.runtime` / `.driver` find the stand-in in this process."""
    runtime, driver = bindings(shape)
    cuda, package = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    cuda.__path__ = []  # a package, for the import system
    package.__path__ = []
    cuda.bindings = package  # type: ignore[attr-defined]
    package.runtime, package.driver = runtime, driver  # type: ignore[attr-defined]
    sys.modules.update({"cuda": cuda, "cuda.bindings": package, "cuda.bindings.runtime": runtime,
                        "cuda.bindings.driver": driver})
