"""DLPack import and export for `Tensor`, in pure Python (ctypes).

numpy alone cannot do what `Tensor` needs: it has no BF16, refuses to export read-only arrays and
cannot hold GPU memory. So capsules are read here with ctypes, following dlpack.h:

    DLManagedTensor ("dltensor" capsule)        DLManagedTensorVersioned ("dltensor_versioned")
    +--------------------------------+          +-------------------------------------------+
    | DLTensor dl_tensor             |          | uint32 major, uint32 minor                |
    | void*    manager_ctx           |          | void*  manager_ctx                        |
    | void   (*deleter)(self*)       |          | void (*deleter)(self*)                    |
    +--------------------------------+          | uint64 flags   (bit 0: read-only)         |
                                                | DLTensor dl_tensor                        |
    DLTensor: void* data | int32 device_type, int32 device_id | int32 ndim |
              uint8 code, uint8 bits, uint16 lanes | int64* shape | int64* strides |
              uint64 byte_offset

Import takes ownership the DLPack way: the capsule is renamed `used_dltensor[_versioned]` and the
producer's deleter is called once the last view of the memory is gone. An object on a CUDA device
is asked for its capsule on this stub's consumer stream, `__dlpack__(stream=s)`, which makes s wait
for the producer's work (PyTorch: its current stream), and s is then waited for, as Triton's
`from_dlpack` does: so work on the model's own streams is finished before pystub copies the
tensor. A capsule handed over directly carries no stream: it is ordered after the model's work
on the default stream only. CUDA device ids are the model's (its process's ordinals) in capsules
and the server's inside pystub (devices.numbering). Export lets numpy build the
capsule (numpy owns the deleter, so no C callback is written here) and then rewrites the dtype
field for the two types numpy cannot express (BOOL on old numpy, BF16).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from pystub_backend.devices.interface import DeviceError
from pystub_backend.devices.numbering import device_numbering
from pystub_backend.ipc.dtypes import numpy_dtype

from ._errors import TritonModelException

__all__ = ["DLPackImport", "import_capsule", "export_capsule", "export_device_capsule", "storage_itemsize",
           "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT, _KDL_BOOL = 0, 1, 2, 4, 6
_READ_ONLY_FLAG = 1

# Triton 2.51's text, the run of blanks included (a line continuation inside its C++ literal).
_NOT_SUPPORTED = (
    "Provided tensor is not supported. Tensor must be a DLPack capsule         "
    "or have `__dlpack__` and `__dlpack_device__` attributes"
)
_NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order "
    "are supported."
)

# (code, bits) <-> wire name. Lanes must be 1.
_DL_TO_WIRE: dict[tuple[int, int], str] = {
    (_KDL_BOOL, 8): "BOOL",
    (_KDL_UINT, 8): "UINT8", (_KDL_UINT, 16): "UINT16", (_KDL_UINT, 32): "UINT32", (_KDL_UINT, 64): "UINT64",
    (_KDL_INT, 8): "INT8", (_KDL_INT, 16): "INT16", (_KDL_INT, 32): "INT32", (_KDL_INT, 64): "INT64",
    (_KDL_FLOAT, 16): "FP16", (_KDL_FLOAT, 32): "FP32", (_KDL_FLOAT, 64): "FP64",
    (_KDL_BFLOAT, 16): "BF16",
}
_WIRE_TO_DL = {wire: key for key, wire in _DL_TO_WIRE.items()}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_void_p]

# PyCapsule_SetName keeps the pointer, not a copy: the new names must live as long as the process.
_USED_NAMES = {
    b"dltensor": ctypes.create_string_buffer(b"used_dltensor"),
    b"dltensor_versioned": ctypes.create_string_buffer(b"used_dltensor_versioned"),
}


class _Owner:
    """Holds a consumed DLManagedTensor and calls its deleter when the last user is gone."""

    def __init__(self, managed_address: int, deleter_address: int | None) -> None:
        self._managed_address = managed_address
        self._deleter_address = deleter_address

    def release(self) -> None:
        deleter, self._deleter_address = self._deleter_address, None
        if deleter:
            _Deleter(deleter)(self._managed_address)

    def __del__(self) -> None:
        self.release()


@dataclass
class DLPackImport:
    """A consumed capsule: its dtype, shape and memory. `array` is None for GPU memory, whose
    address is `pointer` (0 for host memory)."""

    wire: str
    shape: list[int]
    device_type: int
    device_id: int
    array: np.ndarray | None
    owner: Any
    pointer: int = 0


def import_capsule(obj: object) -> DLPackImport:
    """Consume a DLPack capsule, or the capsule of an object implementing `__dlpack__`.

    Raises TritonModelException with the original's texts for unsupported objects, non-contiguous
    tensors and unsupported devices, and for unsupported data types. A refused capsule is left
    unconsumed, so its producer still frees it.
    """
    capsule = _capsule_of(obj)
    for name, struct_type in ((b"dltensor", _DLManagedTensor), (b"dltensor_versioned", _DLManagedTensorVersioned)):
        if _api.PyCapsule_IsValid(capsule, name):
            address = _api.PyCapsule_GetPointer(capsule, name)
            managed = struct_type.from_address(address)
            wire, shape, device_type = _validate(managed.dl_tensor)
            # From here on the memory is ours: rename first so the producer's capsule destructor
            # can never free it a second time.
            _api.PyCapsule_SetName(capsule, ctypes.addressof(_USED_NAMES[name]))
            owner = _Owner(address, managed.deleter)
            return _build(managed, owner, wire, shape, device_type)
    raise TritonModelException(_NOT_SUPPORTED)


def _capsule_of(obj: object) -> object:
    if type(obj).__name__ == "PyCapsule":
        return obj
    if hasattr(obj, "__dlpack__"):
        device = _cuda_device_of(obj)
        return obj.__dlpack__() if device is None else _synchronized_capsule(obj, device)
    raise TritonModelException(_NOT_SUPPORTED)


def _cuda_device_of(obj: object) -> int | None:
    """The CUDA ordinal `obj.__dlpack_device__()` names, or None for another device (or none said)."""
    try:
        device_type, device_id = obj.__dlpack_device__()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return None
    return int(device_id) if int(device_type) == KDL_CUDA else None


def _synchronized_capsule(obj: Any, local_id: int) -> object:  # noqa: ANN401 - a producer with __dlpack__
    """The capsule of a CUDA producer, once its work so far has finished. Raises TritonModelException
    when the device cannot be used (no CUDA bindings, a device this stub does not see)."""
    from pystub_backend.stub.device_outputs import _device_memory  # CUDA is loaded only now

    try:
        server_id = device_numbering().to_server(local_id)
        memory = _device_memory()
        stream = memory.consumer_stream(server_id)
    except DeviceError as exc:
        raise TritonModelException(f"cannot take a tensor on cuda:{local_id}: {exc}") from None
    try:
        capsule = obj.__dlpack__(stream=stream)
        wait = memory.wait_stream
    except (TypeError, NotImplementedError):  # a producer that takes no stream: wait for the device
        capsule, wait = obj.__dlpack__(), memory.synchronize
    try:
        wait(server_id)
    except DeviceError as exc:
        raise TritonModelException(f"waiting for a tensor on cuda:{local_id} failed: {exc}") from None
    return capsule


def _validate(tensor: Any) -> tuple[str, list[int], int]:
    """(wire, shape, device type) of a DLTensor the original would accept; raises otherwise."""
    shape = [int(tensor.shape[i]) for i in range(tensor.ndim)]
    strides = None if not tensor.strides else [int(tensor.strides[i]) for i in range(tensor.ndim)]
    if not _is_c_contiguous(shape, strides):
        raise TritonModelException(_NOT_CONTIGUOUS)
    device_type = int(tensor.device.device_type)
    if device_type not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):
        raise TritonModelException(f"DLDevice type {device_type} is not support by Python backend.")
    return _wire_of(tensor.dtype), shape, device_type


def _build(managed: Any, owner: _Owner, wire: str, shape: list[int], device_type: int) -> DLPackImport:
    tensor = managed.dl_tensor
    if device_type == KDL_CUDA:
        pointer = int(tensor.data or 0) + int(tensor.byte_offset)
        return DLPackImport(wire, shape, KDL_CUDA, _server_id(int(tensor.device.device_id)), None, owner, pointer)
    read_only = bool(getattr(managed, "flags", 0) & _READ_ONLY_FLAG)
    array = _host_array(tensor, wire, shape, owner, read_only)
    return DLPackImport(wire, shape, KDL_CPU, 0, array, owner)


def _server_id(local_id: int) -> int:
    try:
        return device_numbering().to_server(local_id)
    except DeviceError as exc:
        raise TritonModelException(str(exc)) from None


def _is_c_contiguous(shape: list[int], strides: list[int] | None) -> bool:
    # Strides are in elements; dims of size 1 may carry any stride. The original skips dim 0
    # here, which would accept e.g. `a[::2]`; every dim is checked instead.
    if strides is None or 0 in shape:
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides), strict=False):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _wire_of(dtype: Any) -> str:
    wire = _DL_TO_WIRE.get((int(dtype.code), int(dtype.bits)))
    if wire is None or dtype.lanes != 1:
        raise TritonModelException(
            f"DLPack tensor data type (code {dtype.code}, {dtype.bits} bits, {dtype.lanes} lanes) "
            "is not supported."
        )
    return wire


def _host_array(tensor: Any, wire: str, shape: list[int], owner: _Owner, read_only: bool) -> np.ndarray:
    dtype = _storage_dtype(wire)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count == 0:
        owner.release()
        return np.empty(shape, dtype=dtype)
    # The ctypes buffer is the array's base and carries the owner, so the producer's memory lives
    # exactly as long as any numpy view of it.
    buffer = (ctypes.c_char * (count * dtype.itemsize)).from_address(tensor.data + tensor.byte_offset)
    buffer._pystub_owner = owner  # type: ignore[attr-defined]
    array = np.frombuffer(memoryview(buffer), dtype=dtype).reshape(shape)  # base: view -> buffer -> owner
    array.flags.writeable = not read_only
    return array


def storage_itemsize(wire: str) -> int:
    """Bytes per element of a (non-BYTES) wire type."""
    return _storage_dtype(wire).itemsize


def _storage_dtype(wire: str) -> np.dtype:
    """numpy dtype holding a wire type; BF16 is stored as its raw uint16 bits."""
    if wire == "BF16":
        return np.dtype(np.uint16)
    return numpy_dtype(wire)


def export_capsule(array: np.ndarray, wire: str, max_version: tuple[int, int] | None = None) -> object:
    """A capsule over `array` (C-contiguous, writable) typed as `wire`.

    Legacy `"dltensor"` unless `max_version` allows DLPack 1.x and numpy can produce it, in which
    case `"dltensor_versioned"` (numpy imports those as writable, legacy ones as read-only).
    """
    code, bits = _WIRE_TO_DL[wire]
    if wire == "BOOL":
        # numpy < 1.25 cannot export bool; export the bytes and retype them.
        array = array.view(np.uint8)
    struct_type: type[ctypes.Structure] = _DLManagedTensor
    capsule, name = array.__dlpack__(), b"dltensor"
    if max_version is not None and tuple(max_version) >= (1, 0):
        try:
            capsule = array.__dlpack__(max_version=(1, 0))
            struct_type, name = _DLManagedTensorVersioned, b"dltensor_versioned"
        except TypeError:
            pass  # numpy 1.x: legacy only
    managed = struct_type.from_address(_api.PyCapsule_GetPointer(capsule, name))
    managed.dl_tensor.dtype.code = code
    managed.dl_tensor.dtype.bits = bits
    return capsule


# -- export of device memory ------------------------------------------------------------------
# numpy cannot make a capsule for memory it does not own, so GPU tensors build their
# DLManagedTensor here. Each export is kept in `_exports` (struct, shape array, the tensor that
# keeps the memory alive) until whoever holds it lets go: the consumer through the deleter, or
# the capsule's destructor when no consumer ever took it (its name is still "dltensor").
# Prototypes of our own: the attributes of ctypes.pythonapi are shared with every other user.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", ctypes.pythonapi))
_CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor")  # PyCapsule_New keeps the pointer
_exports: dict[int, tuple[Any, Any, Any]] = {}  # DLManagedTensor address -> what it holds alive
_capsules: dict[int, int] = {}  # capsule address -> DLManagedTensor address


def _release_export(managed_address: int) -> None:
    _exports.pop(managed_address, None)


@_Deleter
def _export_deleter(managed_address: int) -> None:
    _release_export(managed_address)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule_address: int) -> None:
    managed_address = _capsules.pop(capsule_address, None)
    if managed_address is not None and _capsule_name(capsule_address) == b"dltensor":
        _release_export(managed_address)  # never consumed


def export_device_capsule(pointer: int, device: tuple[int, int], shape: list[int], wire: str,
                          keeper: object) -> object:
    """A legacy "dltensor" capsule of C-contiguous memory at `pointer` on `device` (type, the
    model's ordinal); `keeper` is held until the capsule's consumer (or the capsule) is done with it."""
    code, bits = _WIRE_TO_DL[wire]
    managed = _DLManagedTensor()
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device.device_type, tensor.device.device_id = device
    tensor.ndim = len(shape)
    tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = code, bits, 1
    tensor.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0  # strides stay NULL: compact row-major
    managed.deleter = ctypes.cast(_export_deleter, ctypes.c_void_p).value
    address = ctypes.addressof(managed)
    _exports[address] = (managed, dims, keeper)
    capsule = _capsule_new(address, _CAPSULE_NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p).value)
    _capsules[id(capsule)] = address
    return capsule
