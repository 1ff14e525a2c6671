"""Unit tests for pystub_backend.backend.config.model_config: parsing, normalization, JSON rendering, metadata."""

from __future__ import annotations

import json
import re

import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import (
    ConfigError,
    config_from_json,
    config_parameters,
    config_to_json,
    instance_names,
    is_decoupled,
    load_config_file,
    model_metadata,
    normalize,
    parse_config_text,
    validate_config,
)

ADD_SUB = """
name: "add_sub"
backend: "python"
# a comment
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{ kind: KIND_CPU }]
"""


def parsed(text: str, name: str = "m") -> model_config_pb2.ModelConfig:
    return normalize(parse_config_text(text, "/x/config.pbtxt"), name)


# ---------------------------------------------------------------------------------------------
# Parsing


def test_parse_valid_config() -> None:
    config = parse_config_text(ADD_SUB, "/x/config.pbtxt")
    assert config.name == "add_sub"
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert list(config.input[0].dims) == [4]


def test_parse_unknown_field_names_file_and_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config_text('name: "x"\nmax_batch_size: 1\nfoo: 1\n', "/x/config.pbtxt")
    assert str(info.value) == (
        "failed to parse config file '/x/config.pbtxt': 3:1 : "
        'Message type "inference.ModelConfig" has no field named "foo".'
    )


def test_parse_two_scheduling_choices() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config_text("dynamic_batching {}\nsequence_batching {}\n", "/m/config.pbtxt")
    message = str(info.value)
    assert message.startswith("failed to parse config file '/m/config.pbtxt': 2:1 : ")
    assert 'Field "sequence_batching" is specified along with field "dynamic_batching"' in message
    assert 'oneof "scheduling_choice"' in message


def test_parse_syntax_error() -> None:
    with pytest.raises(ConfigError, match=r"^failed to parse config file 'c': 1:\d+ : "):
        parse_config_text('input [ { name: "a" ', "c")


def test_parse_bad_enum() -> None:
    with pytest.raises(ConfigError, match="TYPE_NOPE"):
        parse_config_text('input [{ name: "a" data_type: TYPE_NOPE }]', "c")


def test_load_config_file(tmp_path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(ADD_SUB)
    assert load_config_file(path).name == "add_sub"
    path.write_text("bogus: 1\n")
    with pytest.raises(ConfigError, match=f"failed to parse config file '{path}': 1:1 : "):
        load_config_file(str(path))


def test_load_missing_file_is_oserror(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        load_config_file(tmp_path / "nope.pbtxt")


# ---------------------------------------------------------------------------------------------
# Normalization


def test_normalize_defaults_for_empty_config() -> None:
    config = normalize(model_config_pb2.ModelConfig(), "add_sub")
    assert config.name == "add_sub"
    assert config.backend == "python"
    assert config.platform == ""
    assert config.default_model_filename == "model.py"
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    assert (group.name, group.count, group.kind) == ("add_sub", 1, group.KIND_CPU)
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable


def test_normalize_returns_copy() -> None:
    original = model_config_pb2.ModelConfig()
    normalize(original, "m")
    assert original == model_config_pb2.ModelConfig()


def test_normalize_is_idempotent() -> None:
    once = parsed(ADD_SUB, "add_sub")
    assert normalize(once, "add_sub") == once


def test_normalize_keeps_explicit_values() -> None:
    config = parsed("""
        platform: "onnxruntime_onnx"
        version_policy { all {} }
        default_model_filename: "x.onnx"
        optimization { input_pinned_memory { enable: false } }
    """)
    assert config.backend == ""
    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "x.onnx"
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert not config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable


def test_normalize_name_must_match_directory() -> None:
    with pytest.raises(ConfigError) as info:
        parsed('name: "other"', "add_sub")
    assert str(info.value) == (
        "unexpected directory name 'add_sub' for model 'other', directory name must equal "
        "model name"
    )


def test_normalize_instance_groups() -> None:
    config = parsed("""
        instance_group [
          { count: 2 kind: KIND_GPU },
          { name: "named" kind: KIND_AUTO count: 0 },
          { count: 1 kind: KIND_MODEL }
        ]
    """, "m")
    groups = [(g.name, g.count, g.kind) for g in config.instance_group]
    kinds = model_config_pb2.ModelInstanceGroup
    assert groups == [
        ("m_0", 2, kinds.KIND_GPU),
        ("named", 1, kinds.KIND_CPU),
        ("m_2", 1, kinds.KIND_MODEL),
    ]
    assert instance_names(config) == [
        ("m_0", "m_0_0", "GPU"),
        ("m_0", "m_0_1", "GPU"),
        ("named", "named_0", "CPU"),
        ("m_2", "m_2_0", "MODEL"),
    ]


def test_instance_names_add_sub() -> None:
    assert instance_names(parsed(ADD_SUB, "add_sub")) == [("add_sub_0", "add_sub_0_0", "CPU")]


def test_negative_max_batch_size() -> None:
    with pytest.raises(ConfigError, match="'max_batch_size' must be non-negative value for m"):
        parsed("max_batch_size: -1")


@pytest.mark.parametrize(
    "io, pattern",
    [
        ('input [{ data_type: TYPE_FP32 dims: [1] }]', "model input must specify 'name'"),
        ('output [{ data_type: TYPE_FP32 dims: [1] }]', "model output must specify 'name'"),
        ('input [{ name: "A" dims: [1] }]', "model input 'A' must specify 'data_type'"),
        ('output [{ name: "B" dims: [1] }]', "model output 'B' must specify 'data_type'"),
        ('input [{ name: "A" data_type: TYPE_FP32 dims: [0] }]',
         "model input 'A' dimension must be integer >= 1, or -1"),
        ('output [{ name: "B" data_type: TYPE_FP32 dims: [2, -3] }]',
         "model output 'B' dimension must be integer >= 1, or -1"),
        ('input [{ name: "A" data_type: TYPE_FP32 dims: [1] },'
         ' { name: "A" data_type: TYPE_INT32 dims: [1] }]',
         "model input 'A' is specified more than once"),
        ('output [{ name: "B" data_type: TYPE_FP32 dims: [1] },'
         ' { name: "B" data_type: TYPE_FP32 dims: [1] }]',
         "model output 'B' is specified more than once"),
    ],
)
def test_invalid_io(io: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parsed(io)


def test_same_name_for_input_and_output_is_allowed() -> None:
    parsed('input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }] '
           'output [{ name: "X" data_type: TYPE_FP32 dims: [-1] }]')


def test_validate_config_directly() -> None:
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=-2)
    with pytest.raises(ConfigError):
        validate_config(config)


def test_dynamic_batching_preferred_batch_size_default() -> None:
    config = parsed("max_batch_size: 8 dynamic_batching {}")
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    config = parsed("max_batch_size: 8 dynamic_batching { preferred_batch_size: [2, 4] }")
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    config = parsed("max_batch_size: 0 dynamic_batching {}")
    assert list(config.dynamic_batching.preferred_batch_size) == []


def test_sequence_batching_defaults() -> None:
    config = parsed("max_batch_size: 4 sequence_batching { oldest { max_candidate_sequences: 2 } }")
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]
    config = parsed("sequence_batching { max_sequence_idle_microseconds: 5 direct {} }")
    assert config.sequence_batching.max_sequence_idle_microseconds == 5


def test_ensemble_gets_no_instance_group() -> None:
    config = parsed('platform: "ensemble" ensemble_scheduling { step [{ model_name: "a" '
                    'model_version: -1 }] }')
    assert len(config.instance_group) == 0
    assert config.backend == ""


# ---------------------------------------------------------------------------------------------
# Queries


def test_is_decoupled() -> None:
    assert not is_decoupled(parsed(""))
    assert is_decoupled(parsed("model_transaction_policy { decoupled: true }"))
    assert not is_decoupled(parsed("model_transaction_policy { decoupled: false }"))


def test_config_parameters() -> None:
    config = parsed("""
        parameters {
          key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/e" }
        }
        parameters [{ key: "K" value { string_value: "v" } }]
    """)
    assert config_parameters(config) == {
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/e",
        "K": "v",
    }
    assert config_parameters(parsed("")) == {}


def test_metadata_non_batching() -> None:
    metadata = model_metadata(parsed(ADD_SUB, "add_sub"), ["1"])
    assert metadata == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [4]},
        ],
    }


def test_metadata_batching_and_datatypes() -> None:
    config = parsed("""
        max_batch_size: 8
        input [{ name: "S" data_type: TYPE_STRING dims: [-1, 2] },
               { name: "B" data_type: TYPE_BOOL dims: [1] }]
        output [{ name: "H" data_type: TYPE_BF16 dims: [3] }]
    """)
    metadata = model_metadata(config, ["1", "3"])
    assert metadata["versions"] == ["1", "3"]
    assert metadata["inputs"] == [
        {"name": "S", "datatype": "BYTES", "shape": [-1, -1, 2]},
        {"name": "B", "datatype": "BOOL", "shape": [-1, 1]},
    ]
    assert metadata["outputs"] == [{"name": "H", "datatype": "BF16", "shape": [-1, 3]}]
    assert all(type(d) is int for t in metadata["inputs"] for d in t["shape"])


def test_metadata_platform_wins() -> None:
    config = parsed('platform: "pytorch_libtorch"')
    assert model_metadata(config, [])["platform"] == "pytorch_libtorch"


# ---------------------------------------------------------------------------------------------
# JSON

FULL = """
max_batch_size: 8
version_policy { specific { versions: [1, 3] } }
input [{ name: "I" data_type: TYPE_FP32 dims: [4] reshape { shape: [2, 2] } }]
output [{ name: "O" data_type: TYPE_STRING dims: [-1] reshape { shape: [1, -1] } }]
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { default_timeout_microseconds: 5 }
  priority_queue_policy [{ key: 1 value { default_timeout_microseconds: 7 } }]
}
model_warmup [{
  name: "w" batch_size: 1
  inputs [{ key: "I" value { data_type: TYPE_FP32 dims: [4] zero_data: true } }]
}]
parameters [{ key: "K" value { string_value: "v" } }]
"""

SEQUENCE = """
max_batch_size: 2
sequence_batching {
  max_sequence_idle_microseconds: 7000
  oldest { max_candidate_sequences: 2 max_queue_delay_microseconds: 300 }
  state [{
    input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT32 dims: [1, -1]
    initial_state [{ name: "init" data_type: TYPE_INT32 dims: [1, 3] zero_data: true }]
  }]
}
"""


def test_json_int64_fields_are_numbers() -> None:
    data = config_to_json(parsed(FULL))
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert data["input"][0]["dims"] == [4]
    assert data["input"][0]["reshape"] == {"shape": [2, 2]}
    assert data["output"][0]["dims"] == [-1]
    assert data["output"][0]["reshape"] == {"shape": [1, -1]}
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 3
    assert batching["default_priority_level"] == 2
    assert batching["preferred_batch_size"] == [8]
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7
    assert data["model_warmup"][0]["inputs"]["I"]["dims"] == [4]
    assert data["model_warmup"][0]["batch_size"] == 1
    assert data["parameters"] == {"K": {"string_value": "v"}}


def test_json_int64_zero_defaults_are_numbers() -> None:
    data = config_to_json(parsed("max_batch_size: 4 dynamic_batching {} "
                                 "input [{ name: \"I\" data_type: TYPE_FP32 dims: [1] }]"))
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 0
    assert batching["priority_levels"] == 0
    assert batching["default_priority_level"] == 0
    assert "default_queue_policy" not in batching
    assert batching["priority_queue_policy"] == {}


def test_json_sequence_int64_fields() -> None:
    data = config_to_json(parsed(SEQUENCE))
    sequence = data["sequence_batching"]
    assert sequence["max_sequence_idle_microseconds"] == 7000
    assert sequence["oldest"]["max_queue_delay_microseconds"] == 300
    assert sequence["oldest"]["preferred_batch_size"] == [2]
    assert sequence["state"][0]["dims"] == [1, -1]
    assert sequence["state"][0]["initial_state"][0]["dims"] == [1, 3]
    direct = config_to_json(
        parsed("sequence_batching { direct { max_queue_delay_microseconds: 9 } }")
    )
    assert direct["sequence_batching"]["direct"]["max_queue_delay_microseconds"] == 9
    assert direct["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000


def test_json_ensemble_model_version() -> None:
    data = config_to_json(parsed("""
        platform: "ensemble"
        ensemble_scheduling { step [
          { model_name: "a" model_version: -1 input_map { key: "x" value: "y" } },
          { model_name: "b" model_version: 2 }
        ] }
    """))
    assert [step["model_version"] for step in data["ensemble_scheduling"]["step"]] == [-1, 2]


def test_json_has_every_field() -> None:
    data = config_to_json(parsed(ADD_SUB, "add_sub"))
    for key in ("name", "platform", "backend", "version_policy", "max_batch_size", "input",
                "output", "instance_group", "optimization", "parameters", "model_warmup",
                "default_model_filename", "batch_input", "batch_output"):
        assert key in data
    assert data["max_batch_size"] == 0
    assert data["version_policy"] == {"latest": {"num_versions": 1}}
    assert data["instance_group"][0]["name"] == "add_sub_0"
    assert data["instance_group"][0]["count"] == 1
    assert data["instance_group"][0]["kind"] == "KIND_CPU"
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["input"][0]["optional"] is False
    json.dumps(data)  # serializable as it is


def test_json_no_string_int64_left() -> None:
    """Every listed field converts; the only strings left are real strings."""
    for text in (FULL, SEQUENCE):
        data = config_to_json(parsed(text))
        assert not any(_digit_strings(data)), list(_digit_strings(data))


def _digit_strings(node: object, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _digit_strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for value in node:
            yield from _digit_strings(value, path + "[]")
    elif isinstance(node, str) and node.lstrip("-").isdigit():
        yield path


@pytest.mark.parametrize("text", [ADD_SUB, FULL, SEQUENCE])
def test_json_round_trip(text: str) -> None:
    config = parsed(text, "add_sub" if text is ADD_SUB else "m")
    data = config_to_json(config)
    assert config_from_json(data) == config
    assert config_from_json(json.dumps(data)) == config


def test_config_from_json_accepts_strings_for_int64() -> None:
    config = config_from_json({"name": "m", "input": [{"name": "I", "dims": ["4", 5]}]})
    assert list(config.input[0].dims) == [4, 5]


def test_config_from_json_does_not_mutate_input() -> None:
    data = {"name": "m", "max_batch_size": 2}
    config_from_json(data)
    assert data == {"name": "m", "max_batch_size": 2}


@pytest.mark.parametrize("bad", [
    "{not json",
    '{"nope": 1}',
    {"max_batch_size": "many"},
    {"input": [{"data_type": "TYPE_NOPE"}]},
    '{"dynamic_batching": {}, "sequence_batching": {}}',
])
def test_config_from_json_errors(bad: object) -> None:
    with pytest.raises(ConfigError, match="failed to parse model configuration JSON"):
        config_from_json(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("batching, text", [
    ("preferred_batch_size: [ 16 ]", "preferred size must be positive and <= max batch size 8"),
    ("priority_levels: 2 default_priority_level: 3", "default priority level must be in range [1, 2]"),
])
def test_dynamic_batching_config_is_checked(batching, text):
    from pystub_backend.backend.config.model_config import ConfigError, normalize, parse_config_text
    config = parse_config_text(
        'max_batch_size: 8 input [ { name: "A" data_type: TYPE_INT32 dims: [1] } ] '
        'output [ { name: "O" data_type: TYPE_INT32 dims: [1] } ] dynamic_batching { ' + batching + " }", "t")
    with pytest.raises(ConfigError, match=re.escape(text)):
        normalize(config, "m")
