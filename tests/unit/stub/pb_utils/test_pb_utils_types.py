"""pb_utils constants, dtype converters and BYTES (de)serialization."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pystub_backend.stub import pb_utils
from pystub_backend.stub.pb_utils import TritonModelException


def test_module_constants():
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert int(pb_utils.TRITONSERVER_MEMORY_GPU) == 0
    assert int(pb_utils.TRITONSERVER_MEMORY_CPU) == 1
    assert pb_utils.TRITONSERVER_MEMORY_CPU is pb_utils.MemoryType.TRITONSERVER_MEMORY_CPU
    assert [int(k) for k in (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                             pb_utils.MetricFamily.HISTOGRAM)] == [0, 1, 2]
    assert [int(k) for k in (pb_utils.Logger.INFO, pb_utils.Logger.WARNING, pb_utils.Logger.ERROR,
                             pb_utils.Logger.VERBOSE)] == [0, 1, 2, 3]
    assert pb_utils.Logger.LogLevel.VERBOSE is pb_utils.Logger.VERBOSE
    assert pb_utils.MetricFamily.MetricKind.GAUGE is pb_utils.MetricFamily.GAUGE


def test_triton_string_to_numpy_table():
    table = pb_utils.TRITON_STRING_TO_NUMPY
    assert len(table) == 13
    assert table["TYPE_BOOL"] is bool
    assert table["TYPE_STRING"] is np.object_
    assert table["TYPE_FP16"] is np.float16
    assert "TYPE_BF16" not in table
    assert pb_utils.triton_string_to_numpy("TYPE_UINT64") is np.uint64
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


EXPECTED = {1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
            8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_}


@pytest.mark.parametrize("code,np_type", sorted(EXPECTED.items()))
def test_converters_round_trip(code, np_type):
    assert pb_utils.triton_to_numpy_type(code) is np_type
    assert pb_utils.numpy_to_triton_type(np_type) == code
    assert pb_utils.numpy_to_triton_type(np.dtype(np_type)) == code


def test_converters_return_none_outside_the_table():
    assert pb_utils.triton_to_numpy_type(0) is None
    assert pb_utils.triton_to_numpy_type(14) is None  # BF16 has no numpy type
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.numpy_to_triton_type(np.dtype("<U3")) is None
    assert pb_utils.numpy_to_triton_type("nonsense") is None
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13


def test_serialize_byte_tensor_format():
    array = np.array([[b"ab", "c"], [1, b""]], dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(array)
    assert isinstance(serialized, bytes)
    assert serialized == (struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c"
                          + struct.pack("<I", 1) + b"1" + struct.pack("<I", 0))


def test_serialize_byte_tensor_np_bytes_and_special_cases():
    assert pb_utils.serialize_byte_tensor(np.array([b"xy"], dtype=np.bytes_)) == b"\x02\x00\x00\x00xy"
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], dtype=np.int32)) is None


def test_serialize_uses_c_order_for_non_contiguous_arrays():
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_).T
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array))
    assert list(decoded) == [b"a", b"c", b"b", b"d"]


def test_deserialize_bytes_tensor():
    decoded = pb_utils.deserialize_bytes_tensor(b"\x01\x00\x00\x00a\x00\x00\x00\x00\x03\x00\x00\x00xyz")
    assert decoded.dtype == np.object_ and decoded.ndim == 1
    assert list(decoded) == [b"a", b"", b"xyz"]
    assert all(type(item) is bytes for item in decoded)
    assert pb_utils.deserialize_bytes_tensor(b"").shape == (0,)
    from_array = pb_utils.deserialize_bytes_tensor(np.frombuffer(b"\x01\x00\x00\x00q", dtype=np.uint8))
    assert list(from_array) == [b"q"]


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x01\x00", "Invalid bytes tensor data: incomplete length field"),
        (b"\x05\x00\x00\x00ab", "Invalid bytes tensor data: string extends beyond buffer"),
    ],
)
def test_deserialize_malformed(data, message):
    with pytest.raises(TritonModelException) as exc:
        pb_utils.deserialize_bytes_tensor(data)
    assert str(exc.value) == message
