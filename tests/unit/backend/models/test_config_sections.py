"""Unit tests of the config-sections modules: warmup sample data, the config field table and the
fields it reports, and where a Python-based backend's model.py is found."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from harness import ROOT
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import normalize, parse_config_text
from pystub_backend.backend.models.config_support import FIELD_SUPPORT, unused_fields
from pystub_backend.backend.models.python_backends import model_file_for, with_backend_runtime
from pystub_backend.backend.models.warmup import WarmupError, build_samples

IO = 'input [ { name: "X", data_type: TYPE_INT16, dims: [ 3 ] }, { name: "S", data_type: TYPE_STRING, dims: [ 2 ] } ]\n'


def _config(text: str, name: str = "m") -> model_config_pb2.ModelConfig:
    return normalize(parse_config_text(f'backend: "python"\n{text}', "test"), name)


def _warmup(inputs: str, batch: int = 1, count: int = 0) -> str:
    return f'model_warmup [ {{ name: "w" batch_size: {batch} count: {count} {inputs} }} ]\n'


def _input(name: str, dtype: str, dims: str, data: str) -> str:
    return f'inputs {{ key: "{name}" value {{ data_type: {dtype} dims: [ {dims} ] {data} }} }}'


def test_sample_data_for_batching_and_non_batching_models(tmp_path: Path):
    inputs = _input("X", "TYPE_INT16", "3", "zero_data: true") + _input("S", "TYPE_STRING", "2", "random_data: true")
    for max_batch_size, shape in ((0, (3,)), (8, (1, 3))):
        config = _config(f"max_batch_size: {max_batch_size}\n{IO}" + _warmup(inputs, batch=2, count=5))
        (sample,) = build_samples(config, str(tmp_path))
        assert (sample.name, sample.batch_size, sample.count) == ("w", 2, 5)
        tensors = {t.name: t for t in sample.inputs}
        assert (tensors["X"].datatype, tensors["X"].shape, tensors["X"].data) == ("INT16", shape, bytes(6))
        assert tensors["S"].datatype == "BYTES" and tensors["S"].data == struct.pack("<II", 0, 0)  # empty strings


def test_random_and_file_data(tmp_path: Path):
    (tmp_path / "warmup").mkdir()
    np.arange(4, dtype=np.float32).tofile(tmp_path / "warmup" / "x.bin")  # 16 bytes, 8 used
    config = _config('input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] }, '
                     '{ name: "B", data_type: TYPE_BOOL, dims: [ 64 ] } ]\n' +
                     _warmup(_input("X", "TYPE_FP32", "2", 'input_data_file: "x.bin"') +
                             _input("B", "TYPE_BOOL", "64", "random_data: true")))
    (sample,) = build_samples(config, str(tmp_path))
    tensors = {t.name: t for t in sample.inputs}
    assert np.frombuffer(tensors["X"].data, np.float32).tolist() == [0.0, 1.0]
    assert set(tensors["B"].data) <= {0, 1} and len(tensors["B"].data) == 64  # random, and valid booleans
    assert sample.count == 1  # count 0 runs once


@pytest.mark.parametrize("inputs, batch, text", [
    (_input("X", "TYPE_INT16", "3", ""), 1,
     "[request id: <id_unknown>] warmup setting expects input 'X' to have input_data_type set"),
    (_input("X", "TYPE_INT16", "3", 'input_data_file: "none.bin"'), 1,
     "failed to open text file for read {dir}/warmup/none.bin: No such file or directory"),
    (_input("X", "TYPE_BF16", "3", "zero_data: true"), 1,
     "[request id: <id_unknown>] warmup setting for input 'X' has an unsupported data type 'TYPE_BF16'"),
])
def test_bad_samples_are_refused_with_tritons_text(tmp_path: Path, inputs: str, batch: int, text: str):
    config = _config(IO + _warmup(inputs, batch))
    with pytest.raises(WarmupError) as info:
        build_samples(config, str(tmp_path))
    assert str(info.value) == text.replace("{dir}", str(tmp_path))


def test_batch_size_zero_is_skipped(tmp_path: Path):
    config = _config(IO + _warmup(_input("X", "TYPE_INT16", "3", "zero_data: true"), batch=0))
    assert build_samples(config, str(tmp_path)) == []


def test_the_table_covers_every_model_config_field():
    assert set(FIELD_SUPPORT) == {field.name for field in model_config_pb2.ModelConfig.DESCRIPTOR.fields}
    assert {support for support, _ in FIELD_SUPPORT.values()} == {"used", "partly", "ignored"}
    docs = (ROOT / "docs" / "model-config.md").read_text()
    for name, (support, _) in FIELD_SUPPORT.items():
        assert f"| `{name}` | {support} |" in docs, name


def test_unused_fields_ignore_what_normalization_fills_in():
    assert unused_fields(_config(IO)) == []
    assert unused_fields(_config(IO + "optimization { input_pinned_memory { enable: true } }\n"
                                      "model_transaction_policy { decoupled: true }\n")) == []
    config = _config(IO + 'runtime: "x.so"\noptimization { priority: PRIORITY_MAX }\n'
                          'input [ { name: "R", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } } ]\n'
                          'instance_group [ { count: 1, kind: KIND_CPU, passive: true } ]\n'
                          'model_repository_agents { agents [ { name: "checksum" } ] }\n')
    assert unused_fields(config) == ["runtime", "optimization", "model_repository_agents", "input.reshape",
                                     "instance_group.passive"]


def test_a_python_based_backend_is_found_in_the_backend_directory(tmp_path: Path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "model.py").write_text("")
    (tmp_path / "empty").mkdir()
    own = "/models/m/1/model.py"
    for backend, directory, expected in (
            ("vllm", str(tmp_path), str(tmp_path / "vllm" / "model.py")),
            ("vllm", "", own),  # no --backend-directory
            ("empty", str(tmp_path), own),  # no model.py there
            ("python", str(tmp_path), own),
            ("../vllm", str(tmp_path / "empty"), own)):  # a name, never a path
        config = parse_config_text(f'backend: "{backend}"', "test")
        assert model_file_for(config, own, directory) == expected, backend
    config = parse_config_text('backend: "vllm"', "test")
    assert with_backend_runtime(config, str(tmp_path)).runtime == "model.py"
    assert with_backend_runtime(config, "").runtime == ""
