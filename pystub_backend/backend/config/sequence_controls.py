"""What a sequence request carries: its correlation id and flags, and the control input tensors.

    request parameters  sequence_id (uint64 or string; 0 or "" = none), sequence_start,
                        sequence_end (bools)                 ──▶ SequenceFields(correlation_id, flags)
    config              sequence_batching.control_input [ { name, control [ { kind, ... } ] } ]
                                                              ──▶ Controls.tensors(fields): one
                        extra input per control, shape [1] ([1, 1] with a batch dim), filled per
                        request before the request is placed in a stub's arena

    kind                        value                              data type
    CONTROL_SEQUENCE_START      false_true[1] on the START request  int32/fp32/bool_false_true
    CONTROL_SEQUENCE_END        false_true[1] on the END request    "
    CONTROL_SEQUENCE_READY      false_true[1] (pystub never pads     "
                                batches with empty slots)
    CONTROL_SEQUENCE_CORRID     the correlation id                  data_type: UINT64, INT64,
                                                                    UINT32, INT32 or STRING

Pure functions: no asyncio, no scheduler state. `check_config` runs when a model loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.inference import ParameterValue, Tensor
from pystub_backend.ipc.bytes_codec import serialize_bytes
from pystub_backend.ipc.status import Status

__all__ = ["SequenceFields", "Controls", "sequence_fields", "admitted_fields", "check_config", "FLAG_START", "FLAG_END"]

FLAG_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
FLAG_END = 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
_UINT64 = 2**64

_Kind = model_config_pb2.ModelSequenceBatching.Control.Kind
_BOOLEAN_FIELDS = (("int32_false_true", "INT32", np.int32), ("fp32_false_true", "FP32", np.float32),
                   ("bool_false_true", "BOOL", np.bool_))
_CORRID_TYPES = {"TYPE_UINT64": ("UINT64", np.uint64), "TYPE_INT64": ("INT64", np.int64),
                 "TYPE_UINT32": ("UINT32", np.uint32), "TYPE_INT32": ("INT32", np.int32),
                 "TYPE_STRING": ("BYTES", None)}


def _invalid(text: str) -> ServerError:
    return ServerError(text, Status.INVALID_ARG)


@dataclass(frozen=True)
class SequenceFields:
    correlation_id: int | str  # 0 or "" means the request names no sequence
    flags: int

    @property
    def start(self) -> bool:
        return bool(self.flags & FLAG_START)

    @property
    def end(self) -> bool:
        return bool(self.flags & FLAG_END)


def _flag(parameters: dict[str, ParameterValue], key: str) -> bool:
    value = parameters.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _invalid(f"invalid value for '{key}' parameter, expected a boolean, got {value!r}")


def admitted_fields(parameters: dict[str, ParameterValue], model: str, batch_size: int,
                    anonymous: Iterator[int] | None) -> tuple[SequenceFields, int | str, SequenceFields]:
    """A sequence request's fields, the id of its sequence in the batcher's table, and the fields
    the model sees. As in Triton 2.51, an iterative sequence model (`anonymous` gives it ids)
    takes a request without a correlation id as a sequence of its own: the model sees a generated
    id (1, 2, ...) and START; the batcher ends the sequence with the request (its table id is
    negative, which no client id is). Raises ServerError (INVALID_ARG) with Triton's texts."""
    fields = sequence_fields(parameters)
    cid, shown = fields.correlation_id, fields
    if cid == 0 or cid == "":
        if anonymous is None:
            raise _invalid(f"inference request to model '{model}' must specify a non-zero or non-empty "
                           f"correlation ID")
        generated = next(anonymous)
        cid, fields, shown = -generated, SequenceFields(-generated, FLAG_START | FLAG_END), \
            SequenceFields(generated, FLAG_START)
    if batch_size > 1:
        raise _invalid(f"inference request to model '{model}' must specify batch-size 1 due to requirements of "
                       f"sequence batcher")
    return fields, cid, shown


def sequence_fields(parameters: dict[str, ParameterValue]) -> SequenceFields:
    """The correlation id and flags of a request's parameters. Raises ServerError (INVALID_ARG)
    for values of the wrong type."""
    value = parameters.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _invalid(f"invalid value for 'sequence_id' parameter, expected an unsigned integer or a string, "
                       f"got {value!r}")
    if isinstance(value, int):
        value %= _UINT64  # gRPC sends int64: a negative value is the same uint64, as Triton reads it
    flags = (FLAG_START if _flag(parameters, "sequence_start") else 0) | \
        (FLAG_END if _flag(parameters, "sequence_end") else 0)
    return SequenceFields(value, flags)


# -- control inputs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Control:
    name: str
    kind: int
    datatype: str  # wire name
    values: tuple[Any, Any]  # (false, true) for START/END/READY; unused for CORRID
    dtype: Any  # numpy dtype; None for a STRING CORRID


def _boolean_control(name: str, control: Any, model: str) -> _Control:
    kind_name = _Kind.Name(control.kind)
    given = [option for option in _BOOLEAN_FIELDS if len(getattr(control, option[0]))]
    if len(given) != 1:
        raise ValueError(f"sequence batching control '{kind_name}' of input '{name}' for model '{model}' must "
                         f"specify exactly one of int32_false_true, fp32_false_true or bool_false_true")
    field, datatype, dtype = given[0]
    values = tuple(getattr(control, field))
    if len(values) != 2:
        raise ValueError(f"sequence batching control '{kind_name}' of input '{name}' for model '{model}' must "
                         f"have exactly 2 entries in {field} (false, true), got {len(values)}")
    return _Control(name, control.kind, datatype, (values[0], values[1]), dtype)


def _corrid_control(name: str, control: Any, model: str) -> _Control:
    type_name = model_config_pb2.DataType.Name(control.data_type)
    if type_name not in _CORRID_TYPES:
        raise ValueError(f"sequence batching control 'CONTROL_SEQUENCE_CORRID' of input '{name}' for model "
                         f"'{model}' must have data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or "
                         f"TYPE_STRING, got {type_name}")
    datatype, dtype = _CORRID_TYPES[type_name]
    return _Control(name, control.kind, datatype, (0, 0), dtype)


class Controls:
    """The control inputs a model declares, and the tensors they make for one request."""

    def __init__(self, controls: list[_Control], batching: bool) -> None:
        self.controls = controls
        self._shape = (1, 1) if batching else (1,)

    @classmethod
    def from_config(cls, config: Any) -> Controls:
        """From a ModelConfig with `sequence_batching`. Raises ValueError naming what is wrong."""
        model = config.name
        inputs = {tensor.name for tensor in config.input}
        controls: list[_Control] = []
        kinds: set[int] = set()
        for control_input in config.sequence_batching.control_input:
            name = control_input.name
            if not name:
                raise ValueError(f"sequence batching control input for model '{model}' must have a name")
            if name in inputs:
                raise ValueError(f"sequence batching control input '{name}' for model '{model}' has the name "
                                 f"of a model input")
            if len(control_input.control) != 1:
                raise ValueError(f"sequence batching control input '{name}' for model '{model}' must have "
                                 f"exactly one control, got {len(control_input.control)}")
            control = control_input.control[0]
            if control.kind in kinds:
                raise ValueError(f"sequence batching control '{_Kind.Name(control.kind)}' is specified more "
                                 f"than once for model '{model}'")
            kinds.add(control.kind)
            make = _corrid_control if control.kind == _Kind.CONTROL_SEQUENCE_CORRID else _boolean_control
            controls.append(make(name, control, model))
        return cls(controls, config.max_batch_size > 0)

    def tensors(self, fields: SequenceFields, model: str) -> list[Tensor]:
        """One tensor per control input for a request of the sequence. Raises ServerError
        (INVALID_ARG) for a string correlation id when CORRID is numeric."""
        result = []
        for control in self.controls:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                data = self._corrid_bytes(control, fields.correlation_id, model)
            else:
                on = {_Kind.CONTROL_SEQUENCE_START: fields.start, _Kind.CONTROL_SEQUENCE_END: fields.end,
                      _Kind.CONTROL_SEQUENCE_READY: True}[control.kind]
                data = np.full(self._shape, control.values[1 if on else 0], dtype=control.dtype).tobytes()
            result.append(Tensor(control.name, control.datatype, self._shape, data))
        return result

    def _corrid_bytes(self, control: _Control, correlation_id: int | str, model: str) -> bytes:
        if control.dtype is None:
            return serialize_bytes([str(correlation_id)])
        if isinstance(correlation_id, str):
            raise _invalid(f"sequence batching control '{control.name}' of model '{model}' expects a "
                           f"{control.datatype} correlation ID, but the request's correlation ID is the string "
                           f"'{correlation_id}'")
        wrapped = np.array([correlation_id], dtype=np.uint64).astype(control.dtype)  # wraps, as a C cast does
        return np.full(self._shape, wrapped[0], dtype=control.dtype).tobytes()


def check_config(config: Any) -> None:
    """Check a normalized config's `sequence_batching`. Raises ValueError naming the problem."""
    Controls.from_config(config)
    sequence = config.sequence_batching
    if sequence.HasField("oldest"):
        oldest = sequence.oldest
        if oldest.max_candidate_sequences < 0:
            raise ValueError(f"sequence batching max_candidate_sequences must be >= 0 for model '{config.name}'")
        for size in oldest.preferred_batch_size:
            if size < 1 or (config.max_batch_size > 0 and size > config.max_batch_size):
                raise ValueError(f"sequence batching preferred size must be positive and <= max batch size "
                                 f"{config.max_batch_size} for model '{config.name}', got {size}")
    if sequence.HasField("direct") and not 0 <= sequence.direct.minimum_slot_utilization <= 1:
        raise ValueError(f"sequence batching minimum_slot_utilization must be in [0, 1] for model '{config.name}'")
