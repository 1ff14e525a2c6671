"""A fake GPU machine for tests of everything above CUDA itself: PYSTUB_FAKE_GPUS=<count>.

The fake runs pystub's real device code on stand-ins: NvmlSystem on a stand-in nvidia-ml-py
(fake_nvml) and CudaMemory on a stand-in cuda-bindings of either shape (fake_bindings;
PYSTUB_FAKE_CUDA_BINDINGS=12 or 13, default 13), both over one engine (fake_engine) whose memory
crosses real processes by IPC handle and whose work is queued per stream and lands only at a
synchronization. It is selected only by the variable, which tests set on the processes they
start; a deployment never sets it.

What a test model does in place of PyTorch, with CUDA ordinals as the model's process sees them:

    fake_device_array(array, d)      a new allocation on device d holding `array` (written at once, as
                                     a synchronous copy does); `exportable=False`: a pool's memory,
                                     which CUDA cannot export
    fake_kernel(d, run, touches)     queue `run` on the thread's current stream of device d (the legacy
                                     stream, or fake_side_stream's): it runs at a synchronization
    fake_write_later(out, values)    a kernel writing `values` into the device array `out`
    fake_side_stream(d)              a new non-blocking stream, current on d inside the `with`
    FakeCudaTensor(out, d)           a producer with `__dlpack__(stream=...)` as PyTorch's: the consumer's
                                     stream waits for the producer's current stream
    fake_cuda_capsule(array, d)      a legacy DLPack capsule of a device array, saying CUDA device d
    fake_array_of(capsule)           the device array a CUDA capsule names (for a kernel to read)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from pystub_backend.devices import fake_bindings, fake_nvml
from pystub_backend.devices import fake_engine as engine
from pystub_backend.devices.cuda_runtime import CudaMemory
from pystub_backend.devices.fake_engine import FAKE_VARIABLE, fake_uuid
from pystub_backend.devices.numbering import device_numbering
from pystub_backend.devices.nvml import NvmlSystem, open_nvml

__all__ = ["FAKE_VARIABLE", "fake_uuid", "fake_system", "fake_memory", "fake_device_array", "fake_cuda_capsule",
           "fake_kernel", "fake_write_later", "fake_side_stream", "FakeCudaTensor", "fake_array_of"]


def fake_system(environ: Mapping[str, str]) -> NvmlSystem:
    """The fake machine's GPUs as the parent sees them: NvmlSystem on the stand-in NVML."""
    system = open_nvml(environ, fake_nvml.fake_nvml(environ))
    assert system is not None  # the stand-in always initializes
    return system


def fake_memory(shape: str | None = None) -> CudaMemory:
    """This process's fake device memory: CudaMemory on the stand-in bindings of `shape` (default
    PYSTUB_FAKE_CUDA_BINDINGS, else "13")."""
    runtime, driver = fake_bindings.bindings(shape or os.environ.get(fake_bindings.SHAPE_VARIABLE) or "13")
    return CudaMemory(runtime, driver, device_numbering())


# -- what a test model does ----------------------------------------------------------------------
class _Owner:
    """Owns one allocation's memory for numpy: every view's base chain ends here, and its
    collection frees the allocation (no buffer export pins the mapping)."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (address, False), "version": 3}


def _free_collected(address: int, device: int) -> None:
    engine.release(address, device, collected=True)  # a finalizer cannot raise: counted instead


def fake_device_array(array: np.ndarray, device_id: int, exportable: bool = True) -> np.ndarray:
    """A copy of `array` in a new allocation on CUDA ordinal `device_id`, as a writable numpy array
    over it; freed when the array (and every view of it) is collected. An empty one is over NULL."""
    source = np.ascontiguousarray(array)
    physical = fake_bindings.physical_of(device_id)
    address = engine.allocate(physical, source.nbytes, exportable)
    if address == 0:
        return np.empty(source.shape, source.dtype)
    owner = _Owner(address, source.dtype, source.shape)
    weakref.finalize(owner, _free_collected, address, physical).atexit = False
    device = np.asarray(owner)
    device[...] = source
    return device


_current = threading.local()  # physical device -> the thread's current stream there


def _current_stream(physical: int) -> engine.Stream:
    streams: dict[int, engine.Stream] = getattr(_current, "streams", {})
    return streams.get(physical) or engine.legacy_stream(physical)


@contextlib.contextmanager
def fake_side_stream(device_id: int) -> Iterator[engine.Stream]:
    """A new non-blocking stream on ordinal `device_id`, the thread's current one there inside the block."""
    physical = fake_bindings.physical_of(device_id)
    stream = engine.create_stream(physical, blocking=False)
    streams = _current.__dict__.setdefault("streams", {})
    before = streams.get(physical)
    streams[physical] = stream
    try:
        yield stream
    finally:
        if before is None:
            del streams[physical]
        else:
            streams[physical] = before


def _range(array: np.ndarray) -> tuple[int, int]:
    return int(array.__array_interface__["data"][0]), int(array.nbytes)


def fake_kernel(device_id: int, run: Callable[[], None], touches: tuple[np.ndarray, ...] = ()) -> None:
    """Queue `run` (which reads and writes the device arrays `touches`) on the current stream."""
    engine.enqueue(_current_stream(fake_bindings.physical_of(device_id)), run,
                   tuple(_range(a) for a in touches if a.nbytes))


def fake_write_later(out: np.ndarray, values: np.ndarray, device_id: int) -> None:
    """A kernel that writes `values` into the device array `out` when it lands."""
    staged = np.array(values, dtype=out.dtype, copy=True)

    def run() -> None:
        out[...] = staged
    fake_kernel(device_id, run, (out,))


class FakeCudaTensor:
    """A device array as PyTorch hands it over: `__dlpack__(stream=s)` makes stream s wait for the
    work queued so far on the producer's current stream (the one current when it is called)."""

    def __init__(self, array: np.ndarray, device_id: int) -> None:
        self.array = array
        self.device_id = device_id

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device_id)

    def __dlpack__(self, stream: int | None = None, **_: object) -> object:
        if stream is not None and stream != -1:
            physical = fake_bindings.physical_of(self.device_id)
            consumer = engine.stream_by_id(int(stream), physical)
            producer = _current_stream(physical)
            if consumer is not producer:
                engine.wait(consumer, producer)
        return fake_cuda_capsule(self.array, self.device_id)


_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_KDL_CUDA = 2
_DEVICE_OFFSET = 8  # DLManagedTensor.dl_tensor: void* data, then DLDevice {int32 type, int32 id}


def fake_cuda_capsule(array: np.ndarray, device_id: int) -> object:
    """A legacy DLPack capsule of `array` that says it lives on CUDA device `device_id`: what a
    model on the fake machine returns in place of a GPU tensor (its memory is the array's)."""
    capsule = array.__dlpack__()
    managed = _capsule_pointer(capsule, b"dltensor")
    ctypes.c_int32.from_address(managed + _DEVICE_OFFSET).value = _KDL_CUDA
    ctypes.c_int32.from_address(managed + _DEVICE_OFFSET + 4).value = device_id
    if array.size == 0:  # as an empty CUDA tensor (PyTorch's): its data pointer is NULL
        ctypes.c_void_p.from_address(managed).value = None
    return capsule


_DTYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64, (1, 8): np.uint8,
           (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64, (2, 16): np.float16, (2, 32): np.float32,
           (2, 64): np.float64, (6, 8): np.bool_}


def fake_array_of(capsule: object) -> np.ndarray:
    """The array a legacy CUDA capsule (`to_dlpack()` of a GPU tensor) names, without consuming it:
    a view of device memory, for a fake kernel to read when it lands (the capsule's producer must
    outlive it)."""
    managed = _capsule_pointer(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(managed).value or 0
    ndim = ctypes.c_int32.from_address(managed + 16).value
    code, bits = ctypes.c_uint8.from_address(managed + 20).value, ctypes.c_uint8.from_address(managed + 21).value
    shape_pointer = ctypes.c_void_p.from_address(managed + 24).value or 0
    shape = tuple((ctypes.c_int64 * ndim).from_address(shape_pointer)) if ndim else ()
    offset = ctypes.c_uint64.from_address(managed + 40).value
    dtype = np.dtype(_DTYPES[(code, bits)])
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count == 0 or not data:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(data + offset)
    return np.frombuffer(memoryview(buffer), dtype=dtype).reshape(shape)
