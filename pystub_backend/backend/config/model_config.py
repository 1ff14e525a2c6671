"""Model configuration: parse `config.pbtxt`, normalize it the way Triton does, render it.

    config.pbtxt --parse_config_text--> ModelConfig --normalize--> ModelConfig
                                                                     |-- config_to_json
                                                                     |-- model_metadata
                                                                     `-- instance_names

`config_to_json` is HTTP `/config` and `args["model_config"]`; `model_metadata` is the v2
metadata; `instance_names` lists one stub per instance.

The proto is `tritonclient.grpc.model_config_pb2.ModelConfig` (PROTOCOL.md section 5).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Union

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc.model_config_pb2 import ModelConfig  # a class, so mypy takes it as a type

from pystub_backend.backend.config.sequence_controls import check_config as check_sequence_batching
from pystub_backend.ipc.dtypes import config_to_wire

__all__ = [
    "ConfigError",
    "ModelConfig",
    "parse_config_text",
    "load_config_file",
    "normalize",
    "validate_config",
    "instance_names",
    "config_to_json",
    "config_from_json",
    "model_metadata",
    "is_decoupled",
    "config_parameters",
]

_Group = model_config_pb2.ModelInstanceGroup

_PYTHON_BACKEND = "python"
_PYTHON_FILENAME = "model.py"
# Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS.
_SEQUENCE_IDLE_DEFAULT_US = 1_000_000
_KIND_NAMES = {
    _Group.KIND_AUTO: "CPU",
    _Group.KIND_CPU: "CPU",
    _Group.KIND_GPU: "GPU",
    _Group.KIND_MODEL: "MODEL",
}

# int64/uint64 fields that proto3 JSON renders as strings and Triton's `/config` renders as numbers.
# "*" walks every list item or map value.
_INT64_PATHS: tuple[tuple[str, ...], ...] = (
    ("input", "*", "dims"),
    ("input", "*", "reshape", "shape"),
    ("output", "*", "dims"),
    ("output", "*", "reshape", "shape"),
    ("version_policy", "specific", "versions"),
    ("dynamic_batching", "max_queue_delay_microseconds"),
    ("dynamic_batching", "priority_levels"),
    ("dynamic_batching", "default_priority_level"),
    ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
    ("dynamic_batching", "priority_queue_policy", "*", "default_timeout_microseconds"),
    ("sequence_batching", "max_sequence_idle_microseconds"),
    ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
    ("sequence_batching", "direct", "max_queue_delay_microseconds"),
    ("sequence_batching", "state", "*", "dims"),
    ("sequence_batching", "state", "*", "initial_state", "*", "dims"),
    ("ensemble_scheduling", "step", "*", "model_version"),
    ("model_warmup", "*", "inputs", "*", "dims"),
)


class ConfigError(Exception):
    """An invalid model configuration; the message is the full client/log-visible text."""


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse protobuf text format into a ModelConfig.

    Raises ConfigError naming `source` and protobuf's `line:col : reason` on any parse error
    (syntax, unknown field, two members of `oneof scheduling_choice`).
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"failed to parse config file '{source}': {exc}") from None
    return config


def load_config_file(path: str | os.PathLike[str]) -> ModelConfig:
    """Read and parse a `config.pbtxt`. Raises OSError if unreadable, ConfigError if invalid."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return parse_config_text(text, os.fspath(path))


# ---------------------------------------------------------------------------------------------
# Normalization


def normalize(config: ModelConfig, model_name: str) -> ModelConfig:
    """A normalized copy of `config` for the model in directory `model_name`.

    Fills Triton's defaults (name, backend, version policy, instance groups, pinned memory,
    preferred batch size, sequence idle time) and validates the result. Idempotent.
    Raises ConfigError for a name differing from the directory, a negative `max_batch_size`,
    or malformed inputs/outputs.
    """
    result = ModelConfig()
    result.CopyFrom(config)
    if not result.name:
        result.name = model_name
    elif result.name != model_name:
        raise ConfigError(
            f"unexpected directory name '{model_name}' for model '{result.name}', "
            "directory name must equal model name"
        )
    _default_backend(result)
    if not result.HasField("version_policy"):
        result.version_policy.latest.num_versions = 1
    _default_scheduling(result)
    if result.WhichOneof("scheduling_choice") != "ensemble_scheduling":
        _default_instance_groups(result)
        _default_pinned_memory(result)
    validate_config(result)
    return result


def _default_backend(config: ModelConfig) -> None:
    if not config.platform and not config.backend:
        config.backend = _PYTHON_BACKEND
    if config.backend == _PYTHON_BACKEND and not config.default_model_filename:
        config.default_model_filename = _PYTHON_FILENAME


def _default_scheduling(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = _SEQUENCE_IDLE_DEFAULT_US
        if (sequence.HasField("oldest") and not sequence.oldest.preferred_batch_size
                and config.max_batch_size > 0):
            sequence.oldest.preferred_batch_size.append(config.max_batch_size)


def _default_instance_groups(config: ModelConfig) -> None:
    # As Triton: the group it adds itself is named after the model (instances `<model>_0`...);
    # an unnamed group the config gives is `<model>_<index>`.
    if not config.instance_group:
        config.instance_group.add().name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
        # No accelerator is assumed: AUTO resolves to CPU. KIND_GPU stays GPU in the config
        # (clients see it) but pystub runs it on the CPU.
        if group.kind == _Group.KIND_AUTO:
            group.kind = _Group.KIND_CPU


def _default_pinned_memory(config: ModelConfig) -> None:
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def validate_config(config: ModelConfig) -> None:
    """Check `max_batch_size` and the inputs/outputs. Raises ConfigError with Triton's texts."""
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {config.name}")
    _validate_io(config.input, "input", config.name)
    _validate_io(config.output, "output", config.name)
    if config.WhichOneof("scheduling_choice") == "dynamic_batching":
        _validate_dynamic_batching(config)
    if config.WhichOneof("scheduling_choice") == "sequence_batching":
        try:  # control inputs and strategy (pystub_backend.backend.config.sequence_controls)
            check_sequence_batching(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _validate_dynamic_batching(config: ModelConfig) -> None:
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size < 1 or (config.max_batch_size > 0 and size > config.max_batch_size):
            raise ConfigError(f"dynamic batching preferred size must be positive and <= max batch size "
                              f"{config.max_batch_size} for {config.name}, got {size}")
    levels = batching.priority_levels
    if levels and not 1 <= batching.default_priority_level <= levels:
        raise ConfigError(f"default priority level must be in range [1, {levels}] for {config.name}")


def _validate_io(tensors: Iterable[Any], kind: str, model: str) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if not tensor.name:
            raise ConfigError(f"model {kind} must specify 'name' for {model}")
        if tensor.name in seen:
            raise ConfigError(
                f"model {kind} '{tensor.name}' is specified more than once for {model}"
            )
        seen.add(tensor.name)
        if tensor.data_type == model_config_pb2.TYPE_INVALID:
            raise ConfigError(f"model {kind} '{tensor.name}' must specify 'data_type' for {model}")
        if any(dim < 1 and dim != -1 for dim in tensor.dims):
            raise ConfigError(
                f"model {kind} '{tensor.name}' dimension must be integer >= 1, or -1 to indicate "
                f"a variable-size dimension for {model}"
            )


# ---------------------------------------------------------------------------------------------
# Queries


def instance_names(config: ModelConfig) -> list[tuple[str, str, str]]:
    """`(group name, instance name, kind)` for every instance, in order; kind is CPU/GPU/MODEL.

    Expects a normalized config; a group with count < 1 still yields one instance.
    """
    names = []
    for index, group in enumerate(config.instance_group):
        group_name = group.name or f"{config.name}_{index}"
        kind = _KIND_NAMES.get(group.kind, "CPU")
        for number in range(max(group.count, 1)):
            names.append((group_name, f"{group_name}_{number}", kind))
    return names


def is_decoupled(config: ModelConfig) -> bool:
    """True when `model_transaction_policy { decoupled: true }`."""
    return bool(config.model_transaction_policy.decoupled)


def config_parameters(config: ModelConfig) -> dict[str, str]:
    """The config's `parameters` map as plain strings (their `string_value`)."""
    return {key: value.string_value for key, value in config.parameters.items()}


def model_metadata(config: ModelConfig, versions: list[str]) -> dict[str, Any]:
    """The KServe v2 model metadata of a (normalized) config (PROTOCOL.md section 5)."""
    return {
        "name": config.name,
        "versions": [str(version) for version in versions],
        "platform": config.platform or config.backend,
        "inputs": [_tensor_metadata(tensor, config.max_batch_size) for tensor in config.input],
        "outputs": [_tensor_metadata(tensor, config.max_batch_size) for tensor in config.output],
    }


def _tensor_metadata(tensor: Any, max_batch_size: int) -> dict[str, Any]:
    dims = [int(dim) for dim in tensor.dims]
    datatype = config_to_wire(model_config_pb2.DataType.Name(tensor.data_type))
    return {
        "name": tensor.name,
        "datatype": datatype,
        "shape": [-1] + dims if max_batch_size > 0 else dims,
    }


# ---------------------------------------------------------------------------------------------
# JSON


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's HTTP `/config` renders it: every field, int64 fields as numbers."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for path in _INT64_PATHS:
        _ints_at(data, path)
    return data


def _ints_at(node: Any, path: tuple[str, ...]) -> None:
    """Convert the string values at `path` below `node` to ints, in place."""
    key, rest = path[0], path[1:]
    if key == "*":
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            _ints_at(child, rest)
        return
    if not isinstance(node, dict) or key not in node:
        return
    if rest:
        _ints_at(node[key], rest)
    elif isinstance(node[key], list):
        node[key] = [int(value) for value in node[key]]
    else:
        node[key] = int(node[key])


def config_from_json(data: Union[str, bytes, dict[str, Any]]) -> ModelConfig:
    """Parse a JSON config (int64 as numbers or strings). Raises ConfigError when invalid."""
    config = ModelConfig()
    try:
        if isinstance(data, dict):
            json_format.ParseDict(data, config)
        else:
            json_format.Parse(data, config)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ConfigError(f"failed to parse model configuration JSON: {exc}") from None
    return config
