"""`Tensor`: a named array as a model sees it (docs/reference/model-api.md#tensor).

A tensor keeps the numpy array it was given (no copy unless the array is non-contiguous or not in
native byte order), so `as_numpy()` returns the caller's own array, as in the original. BYTES
tensors are serialized at construction, so later edits of the object array do not reach the
wire. BF16 has no numpy type: such tensors come from DLPack and keep their raw bits as uint16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pystub_backend.devices.interface import DeviceError
from pystub_backend.devices.numbering import device_numbering
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.dtypes import WIRE_TO_CODE, wire_name_of
from pystub_backend.stub.device_outputs import DeviceBuffer

from . import _dlpack
from ._binding import MODULE, NDARRAY, OBJECT, STR, Arg, PybindRepr, binding
from ._errors import TritonModelException

__all__ = ["Tensor"]


def _method(returns: str) -> Any:
    """A Tensor method without arguments, as bound in Triton's pb_utils."""
    return binding(f"(self: {MODULE}.Tensor) -> {returns}")


_CPU_DEVICE = (_dlpack.KDL_CPU, 0)


class Tensor(PybindRepr):
    """`Tensor(name, array)`, positional arguments only.

    Raises TritonModelException `Tensor name cannot be an empty string.` and
    `NumPy dtype is not supported.`; TypeError (pybind11's text) for a name that is not a str or
    data that is not a numpy array.
    """

    __slots__ = ("_name", "_wire", "_array", "_shape", "_serialized", "_device", "_owner", "_exported", "_pointer",
                 "__weakref__")
    _serialized: bytes | None  # BYTES tensors: the wire form, built once

    @binding(f"{MODULE}.Tensor(arg0: str, arg1: numpy.ndarray)", Arg("arg0", STR), Arg("arg1", NDARRAY))
    def __init__(self, name: str, array: np.ndarray, /) -> None:
        name = _check_name(name)
        array = _as_ndarray(array)
        wire = _wire_of(array.dtype)
        if wire is None:
            raise TritonModelException("NumPy dtype is not supported.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if array.dtype.byteorder == (">" if np.little_endian else "<"):
            # The wire is little-endian and so is every consumer; fix the order once here.
            array = array.astype(array.dtype.newbyteorder("="))
        self._setup(name, wire, array)
        if wire == "BYTES":
            self._serialized = _serialize(array)

    def _setup(self, name: str, wire: str, array: np.ndarray | None, shape: list[int] | None = None) -> None:
        self._name = name
        self._wire = wire
        self._array = array
        self._shape = [int(d) for d in (array.shape if shape is None else shape)]  # type: ignore[union-attr]
        self._serialized = None
        self._device = _CPU_DEVICE
        self._pointer = 0  # GPU tensors: the device address of their first byte
        self._owner: Any = None
        self._exported: np.ndarray | None = None

    @classmethod
    def _from_array(cls, name: str, array: np.ndarray, wire_dtype: str | None = None) -> Tensor:
        """Wrap `array` without copying or validating it (stub-side constructor).

        `wire_dtype` is needed only for BF16, whose bits arrive as a uint16 array; otherwise the
        wire type follows the array's dtype (object/bytes_ arrays are BYTES).
        """
        wire = wire_dtype or _wire_of(array.dtype)
        if wire is None:
            raise TritonModelException("NumPy dtype is not supported.")
        # `_setup`'s attributes, set here directly: every input of every request comes this way.
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._wire = wire
        tensor._array = array
        tensor._shape = list(array.shape)
        tensor._serialized = None
        tensor._device = _CPU_DEVICE
        tensor._pointer = 0
        tensor._owner = None
        tensor._exported = None
        return tensor

    @classmethod
    def _on_device(cls, name: str, wire: str, shape: list[int], device_id: int, pointer: int, owner: object) -> Tensor:
        """A GPU tensor over `pointer` on the server's GPU `device_id`, kept valid by `owner` (stub-side)."""
        tensor = cls.__new__(cls)
        tensor._setup(name, wire, None, shape)
        tensor._device = (_dlpack.KDL_CUDA, device_id)
        tensor._pointer = pointer
        tensor._owner = owner
        return tensor

    @staticmethod
    @binding(f"(self: str, arg0: object) -> {MODULE}.Tensor", Arg("self", STR), Arg("arg0", OBJECT), method=False)
    def from_dlpack(name: str, dlpack_tensor: object) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or `__dlpack__` object (no copy).

        Raises TritonModelException `Tensor name cannot be an empty string.`,
        `Provided tensor is not supported. ...`, `DLPack tensor is not contiguous. ...` and
        `DLDevice type <n> is not support by Python backend.`
        """
        name = _check_name(name)
        imported = _dlpack.import_capsule(dlpack_tensor)
        tensor = Tensor.__new__(Tensor)
        tensor._setup(name, imported.wire, imported.array, imported.shape)
        tensor._device = (imported.device_type, imported.device_id)
        tensor._owner = imported.owner
        tensor._pointer = imported.pointer
        return tensor

    @_method("str")
    def name(self) -> str:
        return self._name

    @_method("List[int]")
    def shape(self) -> list[int]:
        return list(self._shape)

    @_method("TRITONSERVER_datatype_enum")
    def triton_dtype(self) -> int:
        """The `TRITONSERVER_DataType` code (1 BOOL ... 13 BYTES, 14 BF16)."""
        return WIRE_TO_CODE[self._wire]

    @_method("bool")
    def is_cpu(self) -> bool:
        return self._device[0] != _dlpack.KDL_CUDA

    @_method("numpy.ndarray")
    def as_numpy(self) -> np.ndarray:
        """The tensor's array. Raises TritonModelException for GPU and BF16 tensors."""
        if not self.is_cpu():
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._wire == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                "from_dlpack() instead."
            )
        assert self._array is not None
        return self._array

    @_method("capsule")
    def to_dlpack(self) -> object:
        """A `"dltensor"` capsule sharing the tensor's memory (host or GPU).

        Raises TritonModelException for BYTES tensors.
        """
        return self._export(None)

    def _export(self, max_version: tuple[int, int] | None) -> object:
        if self._wire == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if not self.is_cpu():
            return _dlpack.export_device_capsule(self._pointer, self.__dlpack_device__(), self._shape, self._wire,
                                                 self)
        return _dlpack.export_capsule(self._exportable_array(), self._wire, max_version)

    def _exportable_array(self) -> np.ndarray:
        assert self._array is not None
        if self._array.flags.writeable:
            return self._array
        # DLPack consumers may write, and inputs are read-only views: export one private copy.
        if self._exported is None:
            self._exported = self._array.copy()
        return self._exported

    def __dlpack__(self, stream: object = None, *, max_version: tuple[int, int] | None = None,
                   dl_device: object = None, copy: bool | None = None) -> object:
        """The DLPack protocol. The original takes `stream` only; the DLPack 1.x keywords are
        accepted too so that current consumers get a versioned (writable) capsule."""
        if copy:
            return Tensor._from_array(self._name, self._storage().copy(), self._wire)._export(max_version)
        return self._export(max_version)

    def _storage(self) -> np.ndarray:
        """The stored array (BF16 as uint16 bits) for CPU tensors; raises like `as_numpy` on GPU."""
        if not self.is_cpu():
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        assert self._array is not None
        return self._array

    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLPack device type, id): for a GPU tensor the CUDA ordinal in the model's process (the
        server's id unless the instance is pinned to its GPU, where it is 0)."""
        if self._device[0] != _dlpack.KDL_CUDA:
            return self._device
        return self._device[0], _local_id(self._device[1])

    def _wire_payload(self) -> tuple[str, list[int], object]:
        """(wire datatype, shape, buffer): a C-contiguous array, serialized `bytes` for BYTES, or a
        DeviceBuffer for a GPU tensor (the stub copies it once, to where it goes).

        BF16 buffers are uint16 arrays.
        """
        if self._device[0] == _dlpack.KDL_CUDA:
            count = int(np.prod(self._shape, dtype=np.int64)) if self._shape else 1
            nbytes = count * _dlpack.storage_itemsize(self._wire)
            return self._wire, list(self._shape), DeviceBuffer(self._device[1], self._pointer, nbytes, self)
        assert self._array is not None
        if self._wire == "BYTES":
            if self._serialized is None:
                self._serialized = _serialize(self._array)
            return self._wire, list(self._shape), self._serialized
        return self._wire, list(self._shape), np.ascontiguousarray(self._array)


def _local_id(server_id: int) -> int:
    try:
        return device_numbering().to_local(server_id)
    except DeviceError as exc:
        raise TritonModelException(str(exc)) from None


def _check_name(name: object) -> str:
    """The tensor name. Raises TypeError for anything but a str (bytes included: pystub keeps
    tensor names str-only), TritonModelException for an empty one."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name)}")
    text = name
    if text == "":
        raise TritonModelException("Tensor name cannot be an empty string.")
    return text


def _as_ndarray(array: object) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    try:
        return np.asarray(array)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Tensor data must be a numpy array: {exc}") from None


_WIRE_OF: dict[np.dtype, str | None] = {}  # dtype -> wire name, as wire_name_of answers (cached)


def _wire_of(dtype: np.dtype) -> str | None:
    wire = _WIRE_OF.get(dtype, "")
    if wire == "":
        wire = _WIRE_OF[dtype] = "BYTES" if dtype.kind == "O" else wire_name_of(dtype)
    return wire


def _serialize(array: np.ndarray) -> bytes:
    return serialize_bytes(array.ravel(order="C"))
