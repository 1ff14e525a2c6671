"""pb_utils.Tensor DLPack import/export, checked against numpy's own DLPack support."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

from pystub_backend.stub.pb_utils import Tensor, TritonModelException, _dlpack

NOT_SUPPORTED = (
    "Provided tensor is not supported. Tensor must be a DLPack capsule         "
    "or have `__dlpack__` and `__dlpack_device__` attributes"
)

NUMERIC_TYPES = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
                 np.int64, np.float16, np.float32, np.float64]


def _managed(capsule):
    address = _dlpack._api.PyCapsule_GetPointer(capsule, b"dltensor")
    return _dlpack._DLManagedTensor.from_address(address)


def _capsule_name(capsule) -> bytes:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule)


@pytest.mark.parametrize("np_type", NUMERIC_TYPES)
def test_numpy_to_tensor_to_numpy_round_trip(np_type):
    source = (np.arange(6) % 2).astype(np_type).reshape(2, 3)
    tensor = Tensor.from_dlpack("x", source)
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == Tensor("y", source).triton_dtype()
    np.testing.assert_array_equal(tensor.as_numpy(), source)
    back = np.from_dlpack(tensor)
    assert back.dtype == np.dtype(np_type)
    np.testing.assert_array_equal(back, source)


def test_from_dlpack_shares_memory_both_ways():
    source = np.zeros(4, dtype=np.float32)
    tensor = Tensor.from_dlpack("x", source)
    source[0] = 1.5
    assert tensor.as_numpy()[0] == 1.5
    tensor.as_numpy()[1] = 2.5  # imported memory stays writable, as in the original
    assert source[1] == 2.5
    exported = np.from_dlpack(tensor)
    exported[2] = 3.5
    assert source[2] == 3.5


def test_capsule_round_trip_and_capsule_is_consumed():
    tensor = Tensor("x", np.arange(3, dtype=np.int32))
    capsule = tensor.to_dlpack()
    assert _capsule_name(capsule) == b"dltensor"
    other = Tensor.from_dlpack("y", capsule)
    assert _capsule_name(capsule) == b"used_dltensor"
    np.testing.assert_array_equal(other.as_numpy(), [0, 1, 2])
    with pytest.raises(TritonModelException) as exc:
        Tensor.from_dlpack("z", capsule)  # a capsule can be consumed once only
    assert str(exc.value) == NOT_SUPPORTED


def test_dlpack_protocol_methods():
    tensor = Tensor("x", np.ones(2))
    assert tensor.__dlpack_device__() == (1, 0)
    assert _capsule_name(tensor.__dlpack__(stream=None)) == b"dltensor"
    assert _capsule_name(tensor.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"


def test_dlpack_copy_keyword_exports_a_copy():
    array = np.arange(3.0)
    exported = np.from_dlpack(Tensor("x", array), copy=True)
    np.testing.assert_array_equal(exported, array)
    assert not np.shares_memory(exported, array)


def test_producer_memory_lives_until_last_view_is_gone():
    source = np.arange(1000, dtype=np.float64)
    watcher = weakref.ref(source)
    tensor = Tensor.from_dlpack("x", source)
    view = tensor.as_numpy()
    del source, tensor
    gc.collect()
    assert watcher() is not None  # the view still needs the producer's memory
    assert view[999] == 999
    del view
    gc.collect()
    assert watcher() is None  # the deleter ran exactly when the last user went


def test_unused_export_is_freed_by_its_capsule():
    tensor = Tensor("x", np.arange(10, dtype=np.int16))
    array_ref = weakref.ref(tensor.as_numpy())
    capsule = tensor.to_dlpack()
    del tensor
    gc.collect()
    assert array_ref() is not None
    del capsule
    gc.collect()
    assert array_ref() is None


def test_read_only_arrays_export_a_private_copy():
    array = np.arange(4, dtype=np.int32)
    array.flags.writeable = False
    tensor = Tensor._from_array("in", array)
    exported = np.from_dlpack(tensor)
    np.testing.assert_array_equal(exported, array)
    assert not np.shares_memory(exported, array)
    assert np.shares_memory(np.from_dlpack(tensor), exported)  # one copy, reused


def test_bf16_round_trip_through_dlpack():
    bits = np.array([[0x3F80, 0x4000, 0xC040]], dtype=np.uint16)  # 1.0, 2.0, -3.0
    capsule = _dlpack.export_capsule(bits, "BF16")
    dtype = _managed(capsule).dl_tensor.dtype
    assert (dtype.code, dtype.bits, dtype.lanes) == (4, 16, 1)
    tensor = Tensor.from_dlpack("h", capsule)
    assert tensor.triton_dtype() == 14
    assert tensor.shape() == [1, 3]
    with pytest.raises(TritonModelException) as exc:
        tensor.as_numpy()
    assert str(exc.value) == (
        "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
    )
    datatype, shape, buffer = tensor._wire_payload()
    assert (datatype, shape) == ("BF16", [1, 3])
    np.testing.assert_array_equal(buffer, bits)
    again = Tensor.from_dlpack("h2", tensor.to_dlpack())
    np.testing.assert_array_equal(again._wire_payload()[2], bits)
    with pytest.raises((BufferError, RuntimeError)):
        np.from_dlpack(tensor)  # numpy has no bfloat16


def test_bool_is_exported_as_dlpack_bool():
    capsule = Tensor("b", np.array([True, False])).to_dlpack()
    dtype = _managed(capsule).dl_tensor.dtype
    assert (dtype.code, dtype.bits) == (6, 8)
    np.testing.assert_array_equal(Tensor.from_dlpack("c", capsule).as_numpy(), [True, False])


def test_versioned_capsules_are_accepted():
    source = np.arange(4, dtype=np.float32)
    capsule = source.__dlpack__(max_version=(1, 0))
    assert _capsule_name(capsule) == b"dltensor_versioned"
    tensor = Tensor.from_dlpack("v", capsule)
    assert _capsule_name(capsule) == b"used_dltensor_versioned"
    np.testing.assert_array_equal(tensor.as_numpy(), source)


def test_read_only_flag_of_versioned_capsules_is_honoured():
    source = np.arange(3.0)
    source.flags.writeable = False
    tensor = Tensor.from_dlpack("v", source.__dlpack__(max_version=(1, 0)))
    assert not tensor.as_numpy().flags.writeable


def test_non_contiguous_dlpack_tensor_is_refused():
    source = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (source.T, source[:, ::2], np.arange(10)[::2]):
        with pytest.raises(TritonModelException) as exc:
            Tensor.from_dlpack("x", view)
        assert str(exc.value) == (
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
            "C-Order are supported."
        )


def test_size_one_dims_may_have_any_stride():
    column = np.arange(8, dtype=np.int32).reshape(8, 1)[::1, :]
    tensor = Tensor.from_dlpack("x", np.lib.stride_tricks.as_strided(column, strides=(4, 1000)))
    np.testing.assert_array_equal(tensor.as_numpy().ravel(), np.arange(8))


def test_empty_dlpack_tensor():
    tensor = Tensor.from_dlpack("e", np.zeros((0, 4), dtype=np.float32))
    assert tensor.shape() == [0, 4]
    assert tensor.as_numpy().shape == (0, 4)


def test_unsupported_objects_are_refused():
    for obj in (object(), [1, 2], "x"):
        with pytest.raises(TritonModelException) as exc:
            Tensor.from_dlpack("x", obj)
        assert str(exc.value) == NOT_SUPPORTED


def test_empty_name_is_refused_before_reading_the_tensor():
    with pytest.raises(TritonModelException) as exc:
        Tensor.from_dlpack("", object())
    assert str(exc.value) == "Tensor name cannot be an empty string."


def test_unsupported_device_is_refused_and_capsule_left_to_its_producer():
    capsule = np.arange(3.0).__dlpack__()
    _managed(capsule).dl_tensor.device.device_type = 7  # kDLVulkan
    with pytest.raises(TritonModelException) as exc:
        Tensor.from_dlpack("x", capsule)
    assert str(exc.value) == "DLDevice type 7 is not support by Python backend."
    assert _capsule_name(capsule) == b"dltensor"


def test_unsupported_dlpack_dtype_is_refused():
    capsule = np.arange(3, dtype=np.complex64).__dlpack__()
    with pytest.raises(TritonModelException) as exc:
        Tensor.from_dlpack("x", capsule)
    assert "is not supported" in str(exc.value)


def test_gpu_tensors_are_held_but_not_readable_as_numpy():
    source = np.arange(3.0)
    watcher = weakref.ref(source)
    capsule = source.__dlpack__()
    _managed(capsule).dl_tensor.device.device_type = 2  # pretend it is CUDA memory
    _managed(capsule).dl_tensor.device.device_id = 1
    del source
    tensor = Tensor.from_dlpack("g", capsule)
    assert not tensor.is_cpu()
    assert tensor.__dlpack_device__() == (2, 1)
    with pytest.raises(TritonModelException) as exc:
        tensor.as_numpy()
    assert str(exc.value) == "Tensor is stored in GPU and cannot be converted to NumPy."
    del exc  # its traceback holds the tensor
    nbytes = tensor._wire_payload()[2].nbytes  # a device buffer: the stub copies it (test_gpu_tensors.py)
    exported = tensor.to_dlpack()  # a CUDA capsule over the same memory, holding the tensor
    device_type = _managed(exported).dl_tensor.device.device_type
    assert (nbytes, device_type) == (24, 2)
    del capsule, exported
    gc.collect()
    assert watcher() is not None
    del tensor
    gc.collect()
    assert watcher() is None


def test_cuda_host_memory_counts_as_cpu():
    capsule = np.arange(3, dtype=np.int8).__dlpack__()
    _managed(capsule).dl_tensor.device.device_type = 3  # kDLCUDAHost
    tensor = Tensor.from_dlpack("p", capsule)
    assert tensor.is_cpu()
    np.testing.assert_array_equal(tensor.as_numpy(), [0, 1, 2])


def test_bytes_tensors_have_no_dlpack():
    tensor = Tensor("s", np.array([b"a"], dtype=np.object_))
    with pytest.raises(TritonModelException) as exc:
        tensor.to_dlpack()
    assert str(exc.value) == "DLPack does not have support for string tensors."
