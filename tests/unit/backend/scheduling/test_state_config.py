"""Implicit state without a server: the state inputs a config yields (zero_data, data_file, no
initial_state, batching), Triton's load errors, and hiding the state outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.inference import InferResponse, Tensor
from pystub_backend.backend.scheduling.implicit_state import ImplicitState, StateConfigError


def config(state: str, max_batch_size: int = 0, scheduling: str = "sequence_batching") -> model_config_pb2.ModelConfig:
    text = f'name: "m" max_batch_size: {max_batch_size} {scheduling} {{ {state} }}'
    return text_format.Parse(text, model_config_pb2.ModelConfig())


STATE = 'state [ {{ input_name: "IN_S" output_name: "OUT_S" data_type: {dtype} dims: [ {dims} ] {initial} }} ]'


def state(dtype: str = "TYPE_FP32", dims: str = "2", initial: str = "") -> str:
    return STATE.format(dtype=dtype, dims=dims, initial=initial)


def test_no_state_no_implicit_state(tmp_path: Path) -> None:
    assert ImplicitState.from_config(config(""), str(tmp_path)) is None
    assert ImplicitState.from_config(config("", scheduling="dynamic_batching"), str(tmp_path)) is None


def test_zero_data_and_no_initial_state_are_zeros(tmp_path: Path) -> None:
    zero = 'initial_state: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true name: "z" }'
    for initial, shape in (("", (2,)), (zero, (3,))):
        found = ImplicitState.from_config(config(state(initial=initial)), str(tmp_path))
        assert found is not None
        (tensor,) = found.tensors()
        assert (tensor.name, tensor.datatype, tensor.shape) == ("IN_S", "FP32", shape)
        assert bytes(tensor.data) == bytes(4 * shape[0])


def test_batching_models_get_a_batch_dimension_and_variable_dims_read_as_one(tmp_path: Path) -> None:
    found = ImplicitState.from_config(config(state(dims="-1, 2"), max_batch_size=4), str(tmp_path))
    assert found is not None and found.tensors()[0].shape == (1, 1, 2)


def test_data_file_is_read_from_the_model_directory(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init.bin").write_bytes(np.array([7, 8], np.int32).tobytes() + b"extra")
    initial = 'initial_state: { data_type: TYPE_INT32 dims: [ 2 ] data_file: "init.bin" name: "f" }'
    found = ImplicitState.from_config(config(state("TYPE_INT32", initial=initial)), str(tmp_path))
    assert found is not None
    assert np.frombuffer(found.tensors()[0].data, np.int32).tolist() == [7, 8]


def test_bad_data_files_have_tritons_texts(tmp_path: Path) -> None:
    initial = 'initial_state: {{ data_type: TYPE_FP32 dims: [ 2 ] data_file: "{name}" name: "f" }}'
    with pytest.raises(StateConfigError, match=f"failed to open text file for read {tmp_path}/initial_state/nope.bin: "
                                               "No such file or directory"):
        ImplicitState.from_config(config(state(initial=initial.format(name="nope.bin"))), str(tmp_path))
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short.bin").write_bytes(b"abc")
    with pytest.raises(StateConfigError) as raised:
        ImplicitState.from_config(config(state(initial=initial.format(name="short.bin"))), str(tmp_path))
    assert str(raised.value) == ("initial_state setting expects 8 bytes, but the data provided from short.binonly has "
                                 "3 bytes.")


def test_state_outputs_are_hidden(tmp_path: Path) -> None:
    found = ImplicitState.from_config(config(state()), str(tmp_path))
    assert found is not None and found.output_names == {"OUT_S"}
    response = InferResponse("m", "1", outputs=[Tensor("Y", "FP32", (1,), b"1234"),
                                                Tensor("OUT_S", "FP32", (1,), b"5678")])
    found.hide_outputs(response)
    assert [tensor.name for tensor in response.outputs] == ["Y"]
