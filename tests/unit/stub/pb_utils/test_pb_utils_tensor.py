"""pb_utils.Tensor: construction, dtypes, BYTES, and the stub-side helpers."""

from __future__ import annotations

import numpy as np
import pytest

from pystub_backend.ipc.bytes_codec import deserialize_bytes
from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils import Tensor, TritonModelException

NUMERIC = [
    (np.bool_, 1, "BOOL"),
    (np.uint8, 2, "UINT8"),
    (np.uint16, 3, "UINT16"),
    (np.uint32, 4, "UINT32"),
    (np.uint64, 5, "UINT64"),
    (np.int8, 6, "INT8"),
    (np.int16, 7, "INT16"),
    (np.int32, 8, "INT32"),
    (np.int64, 9, "INT64"),
    (np.float16, 10, "FP16"),
    (np.float32, 11, "FP32"),
    (np.float64, 12, "FP64"),
]


@pytest.mark.parametrize("np_type,code,wire", NUMERIC)
def test_numeric_dtypes_round_trip(np_type, code, wire):
    array = (np.arange(12) % 3).astype(np_type).reshape(3, 4)
    tensor = Tensor("x", array)
    assert tensor.name() == "x"
    assert tensor.shape() == [3, 4]
    assert tensor.triton_dtype() == code
    assert tensor.is_cpu()
    assert tensor.as_numpy() is array  # no copy for a contiguous array
    datatype, shape, buffer = tensor._wire_payload()
    assert (datatype, shape) == (wire, [3, 4])
    assert isinstance(buffer, np.ndarray) and buffer.flags.c_contiguous
    assert buffer.dtype == np.dtype(np_type)
    np.testing.assert_array_equal(buffer, array)


def test_non_contiguous_array_is_made_contiguous():
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    view = base[:, ::2].T
    assert not view.flags.c_contiguous
    tensor = Tensor("v", view)
    assert tensor.as_numpy().flags.c_contiguous
    assert tensor.shape() == [3, 4]
    np.testing.assert_array_equal(tensor.as_numpy(), view)
    _, _, buffer = tensor._wire_payload()
    assert buffer.tobytes() == np.ascontiguousarray(view).tobytes()


def test_big_endian_array_is_converted_to_native_order():
    array = np.arange(4, dtype=">i4")
    tensor = Tensor("be", array)
    assert tensor.triton_dtype() == 8
    assert tensor.as_numpy().dtype == np.dtype(np.int32)
    assert tensor._wire_payload()[2].tobytes() == np.arange(4, dtype="<i4").tobytes()


def test_tensor_shares_memory_with_the_array_given():
    array = np.zeros(3, dtype=np.float32)
    tensor = Tensor("x", array)
    array[1] = 7
    assert tensor.as_numpy()[1] == 7


def test_scalar_and_empty_arrays():
    assert Tensor("s", np.array(5, dtype=np.int64)).shape() == []
    empty = Tensor("e", np.zeros((0, 3), dtype=np.float32))
    assert empty.shape() == [0, 3]
    assert empty._wire_payload()[2].nbytes == 0


def test_lists_are_refused_like_the_original():
    with pytest.raises(TypeError) as exc:
        Tensor("l", [[1, 2], [3, 4]])
    assert str(exc.value).endswith("Invoked with: 'l', [[1, 2], [3, 4]]")


def test_empty_name_is_refused():
    with pytest.raises(TritonModelException) as exc:
        Tensor("", np.zeros(1))
    assert str(exc.value) == "Tensor name cannot be an empty string."


def test_name_must_be_str():
    with pytest.raises(TypeError):
        Tensor(None, np.zeros(1))
    with pytest.raises(TypeError):
        Tensor(b"x", np.zeros(1))


def test_arguments_are_positional_only():
    with pytest.raises(TypeError):
        Tensor(name="x", array=np.zeros(1))


@pytest.mark.parametrize(
    "array",
    [
        np.array(["a", "b"]),  # <U1: convert to np.object_ first
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype="datetime64[s]"),
        np.zeros(2, dtype=[("a", "i4")]),
    ],
)
def test_unsupported_dtypes_are_refused(array):
    with pytest.raises(TritonModelException) as exc:
        Tensor("x", array)
    assert str(exc.value) == "NumPy dtype is not supported."


def test_bytes_tensor_with_bytes_str_and_other_elements():
    array = np.array([b"ab", "h\u00e9", 12, np.bytes_(b"xy")], dtype=np.object_)
    tensor = Tensor("b", array)
    assert tensor.triton_dtype() == 13
    assert tensor.as_numpy() is array
    datatype, shape, payload = tensor._wire_payload()
    assert (datatype, shape) == ("BYTES", [4])
    assert isinstance(payload, bytes)
    assert list(deserialize_bytes(payload)) == [b"ab", "h\u00e9".encode(), b"12", b"xy"]


def test_bytes_tensor_from_np_bytes_array_keeps_shape():
    array = np.array([[b"a", b"bb"], [b"ccc", b""]], dtype=np.bytes_)
    tensor = Tensor("b", array)
    assert tensor.shape() == [2, 2]
    assert tensor.triton_dtype() == 13
    _, _, payload = tensor._wire_payload()
    assert list(deserialize_bytes(payload)) == [b"a", b"bb", b"ccc", b""]


def test_bytes_tensor_is_serialized_at_construction():
    array = np.array([b"before"], dtype=np.object_)
    tensor = Tensor("b", array)
    array[0] = b"after"
    assert list(deserialize_bytes(tensor._wire_payload()[2])) == [b"before"]


def test_empty_bytes_tensor():
    tensor = Tensor("b", np.array([], dtype=np.object_).reshape(0, 2))
    assert tensor.shape() == [0, 2]
    assert tensor._wire_payload() == ("BYTES", [0, 2], b"")


def test_non_contiguous_bytes_tensor_serializes_in_c_order():
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_).T
    tensor = Tensor("b", array)
    assert list(deserialize_bytes(tensor._wire_payload()[2])) == [b"a", b"c", b"b", b"d"]


def test_from_array_wraps_without_copy_or_validation():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    array.flags.writeable = False
    tensor = Tensor._from_array("INPUT0", array)
    assert tensor.as_numpy() is array
    assert tensor.triton_dtype() == 11
    assert tensor._wire_payload()[0] == "FP32"


def test_from_array_bytes_serializes_lazily():
    array = np.array([b"x", b"yz"], dtype=np.object_).reshape(1, 2)
    tensor = Tensor._from_array("S", array)
    assert tensor.triton_dtype() == 13
    datatype, shape, payload = tensor._wire_payload()
    assert (datatype, shape) == ("BYTES", [1, 2])
    assert list(deserialize_bytes(payload)) == [b"x", b"yz"]


def test_from_array_bf16_keeps_the_raw_bits():
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0 and 2.0 in bfloat16
    tensor = Tensor._from_array("h", bits, "BF16")
    assert tensor.triton_dtype() == 14
    assert tensor._wire_payload() == ("BF16", [2], tensor._wire_payload()[2])
    np.testing.assert_array_equal(tensor._wire_payload()[2], bits)
    with pytest.raises(TritonModelException) as exc:
        tensor.as_numpy()
    assert str(exc.value) == (
        "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
    )


def test_public_module_exports_tensor():
    assert pb_utils.Tensor is Tensor
