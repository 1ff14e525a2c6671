"""Implicit state: `sequence_batching { state [...] }`, as Triton 2.51 serves it to a Python model.

    load ──▶ ImplicitState.from_config: each state's initial value (zero_data, or
             <model dir>/initial_state/<data_file>), checked as Triton checks it
    SequenceBatcher admits a request ──▶ one input per state (`input_name`), holding its initial value
    the model's responses ──▶ the state outputs (`output_name`) are taken out: the client never sees them

What Triton 2.51 does with a Python-backend model (checked against it, and so pystub):
- every request of a sequence carries the state input, and it always holds the *initial* state:
  the Python backend never hands the model's state output back to the sequence batcher, so the
  state does not advance from one request to the next;
- the state output the model returns is not returned to the client, and a client that asks for it
  gets "unexpected inference output"; a client that sends the state input gets the usual
  "expected N inputs but got M" (both come from ordinary request validation: neither is in the
  config's inputs and outputs);
- without `initial_state` the state input holds whatever memory Triton had (pystub: zeros);
- a `data_file` that is missing or has too few bytes fails the load, with `file_error` / `size_error`.

The state has the shape of `initial_state.dims` (else the state's `dims`, -1 read as 1), with a
batch dimension of 1 in front when the model batches.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.inference import InferResponse, Tensor
from pystub_backend.ipc.dtypes import config_to_wire, element_size

__all__ = ["ImplicitState", "StateConfigError", "INITIAL_STATE_FOLDER"]

INITIAL_STATE_FOLDER = "initial_state"
_BYTES_LENGTH_PREFIX = 4  # an empty BYTES element is its 4-byte length, 0


class StateConfigError(ValueError):
    """A `sequence_batching.state` that cannot be served; the message is Triton's text."""


@dataclass(frozen=True)
class _State:
    input_name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


def _shape(state: model_config_pb2.ModelSequenceBatching.State, batching: bool) -> tuple[int, ...]:
    dims = [int(d) for d in state.initial_state[0].dims] if state.initial_state else [int(d) for d in state.dims]
    dims = [1 if d < 0 else d for d in dims]
    return tuple([1, *dims] if batching else dims)


def _initial_bytes(state: model_config_pb2.ModelSequenceBatching.State, datatype: str, shape: tuple[int, ...],
                   model_dir: str) -> bytes:
    """Raises StateConfigError."""
    count = math.prod(shape)
    size = count * (element_size(datatype) or _BYTES_LENGTH_PREFIX)
    initial = state.initial_state[0] if state.initial_state else None
    if initial is None or initial.WhichOneof("state_data") != "data_file":
        return bytes(size)  # zero_data (and, with no initial_state, pystub's choice of zeros)
    path = os.path.join(model_dir, INITIAL_STATE_FOLDER, initial.data_file)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise StateConfigError(f"failed to open text file for read {path}: {exc.strerror}") from None
    if datatype == "BYTES":
        return data  # length-prefixed elements, as they are
    if len(data) < size:
        # Triton's text, its missing space included.
        raise StateConfigError(f"initial_state setting expects {size} bytes, but the data provided from "
                               f"{initial.data_file}only has {len(data)} bytes.")
    return data[:size]


class ImplicitState:
    """The state inputs a sequence's requests carry and the state outputs its responses lose."""

    def __init__(self, states: Iterable[_State], output_names: Iterable[str]) -> None:
        self._states = tuple(states)
        self.output_names = frozenset(output_names)

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig, model_dir: str) -> ImplicitState | None:
        """None when the model has no implicit state. Raises StateConfigError."""
        if config.WhichOneof("scheduling_choice") != "sequence_batching" or not config.sequence_batching.state:
            return None
        batching = int(config.max_batch_size) > 0
        states = []
        for state in config.sequence_batching.state:
            datatype = config_to_wire(model_config_pb2.DataType.Name(state.data_type))
            shape = _shape(state, batching)
            states.append(_State(state.input_name, datatype, shape, _initial_bytes(state, datatype, shape, model_dir)))
        return cls(states, (state.output_name for state in config.sequence_batching.state))

    def tensors(self) -> list[Tensor]:
        """The state inputs of one request (their bytes are shared: nothing writes into them)."""
        return [Tensor(state.input_name, state.datatype, state.shape, state.data) for state in self._states]

    def hide_outputs(self, response: InferResponse) -> None:
        """Take the state outputs out of a response before the client sees it."""
        if response.outputs:
            response.outputs = [tensor for tensor in response.outputs if tensor.name not in self.output_names]
