"""The sequence batcher's pure parts: sequence parameters, control tensors, config checks, slots,
the backlog and the batch-forming rules (backend.config.sequence_controls, backend.scheduling.sequence_slots)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.sequence_controls import Controls, SequenceFields, check_config, sequence_fields
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.scheduling.request_queue import BatchLimits
from pystub_backend.backend.scheduling.sequence_slots import Lane, SeqItem, SlotTable, direct_batch, oldest_batch
from pystub_backend.ipc.bytes_codec import deserialize_bytes


def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse('name: "m"\ninput [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n' + text,
                             model_config_pb2.ModelConfig())


# -- parameters ----------------------------------------------------------------------------------


def test_sequence_fields_read_ids_and_flags() -> None:
    assert sequence_fields({"sequence_id": 7, "sequence_start": True}) == SequenceFields(7, 1)
    assert sequence_fields({"sequence_id": "a", "sequence_end": True}) == SequenceFields("a", 2)
    assert sequence_fields({}) == SequenceFields(0, 0)
    assert sequence_fields({"sequence_id": -1}).correlation_id == 2**64 - 1  # int64 on the wire is a uint64


@pytest.mark.parametrize("parameters", [{"sequence_id": 1.5}, {"sequence_id": True},
                                        {"sequence_id": 1, "sequence_start": "maybe"}])
def test_sequence_fields_refuse_other_types(parameters: dict) -> None:
    with pytest.raises(ServerError):
        sequence_fields(parameters)


# -- control inputs ------------------------------------------------------------------------------

CONTROLS = """max_batch_size: 2
sequence_batching {
  control_input [
    { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 5 ] } ] },
    { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ -1, 1 ] } ] },
    { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
}"""


def test_control_tensors_carry_the_configured_values_and_types() -> None:
    controls = Controls.from_config(config(CONTROLS % "TYPE_INT32"))
    tensors = {t.name: t for t in controls.tensors(SequenceFields(2**32 + 3, 1), "m")}
    assert {n: (t.datatype, t.shape) for n, t in tensors.items()} == {
        "S": ("INT32", (1, 1)), "E": ("FP32", (1, 1)), "R": ("BOOL", (1, 1)), "C": ("INT32", (1, 1))}
    assert np.frombuffer(tensors["S"].data, np.int32)[0] == 5
    assert np.frombuffer(tensors["E"].data, np.float32)[0] == -1
    assert bool(np.frombuffer(tensors["R"].data, np.bool_)[0])
    assert np.frombuffer(tensors["C"].data, np.int32)[0] == 3  # wraps like a C cast


def test_a_string_corrid_takes_any_id_and_a_numeric_one_refuses_strings() -> None:
    controls = Controls.from_config(config(CONTROLS % "TYPE_STRING"))
    corrid = controls.tensors(SequenceFields("abc", 2), "m")[3]
    assert corrid.datatype == "BYTES" and list(deserialize_bytes(corrid.data, 1)) == [b"abc"]
    with pytest.raises(ServerError, match="expects a UINT64 correlation ID"):
        Controls.from_config(config(CONTROLS % "TYPE_UINT64")).tensors(SequenceFields("abc", 0), "m")


@pytest.mark.parametrize("body, text", [
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]', "exactly one of"),
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]',
     "exactly 2 entries"),
    ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
     "must have data_type"),
    ('control_input [ { name: "IN" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] } ]',
     "has the name of a model input"),
    ('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },'
     '{ name: "B" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]', "more than once"),
    ("oldest { preferred_batch_size: [ 9 ] }", "preferred size"),
])
def test_bad_sequence_configs_are_refused_with_a_reason(body: str, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        check_config(config(f"max_batch_size: 4\nsequence_batching {{ {body} }}"))


# -- slots and the backlog -----------------------------------------------------------------------


def test_sequences_spread_over_lanes_then_wait_in_the_backlog_for_a_freed_slot() -> None:
    table = SlotTable([Lane(0, "a", 1), Lane(1, "b", 1)])
    first, second, third = table.start(1), table.start(2), table.start("1")
    assert {first.lane.index, second.lane.index} == {0, 1}
    assert third.lane is None and list(table.backlog) == [third]
    assert table.find(1) is first and table.find("1") is third  # 1 and "1" are different ids
    freed = second.lane
    promoted = table.release(second)
    assert promoted is third and third.lane is freed
    assert table.find(2) is None


def test_a_dead_lane_takes_no_sequence() -> None:
    lanes = [Lane(0, "a", 2)]
    table = SlotTable(lanes)
    lanes[0].dead = True
    assert table.start(1).lane is None


def _item(table: SlotTable, cid: int, enqueued: int) -> SeqItem:
    sequence = table.find(cid) or table.start(cid)
    item = SeqItem(None, SequenceFields(cid, 0), sequence, None, enqueued)
    sequence.queue.append(item)
    return item


def test_direct_takes_one_head_per_ready_slot_once_enough_are_ready_or_the_delay_passed() -> None:
    lane = Lane(0, "a", 4)
    table = SlotTable([lane])
    first = _item(table, 1, 100)
    _item(table, 1, 150)  # the second request of sequence 1 waits for the next batch
    assert direct_batch(lane, 200, 0, 1) == ([first], None)
    assert direct_batch(lane, 200, 1000, 2) == ([], 1100)  # one of two slots ready: wait
    second = _item(table, 2, 300)
    assert direct_batch(lane, 400, 1000, 2) == ([first, second], None)
    assert direct_batch(lane, 1100, 1000, 3) == ([first, second], None)  # the delay passed


def test_oldest_takes_the_oldest_heads_up_to_a_preferred_size() -> None:
    lane = Lane(0, "a", 4)
    table = SlotTable([lane])
    late, early = _item(table, 1, 300), _item(table, 2, 100)
    _item(table, 3, 200)
    limits = BatchLimits(4, (2,), 10_000)
    items, wake = oldest_batch(lane, 400, limits)
    assert items == [early, table.find(3).queue[0]] and wake is None
    table.find(2).running = early  # sequence 2 is running: only its next request could join
    assert oldest_batch(lane, 400, BatchLimits(4, (), 10_000)) == ([], 10_200)
    assert late in oldest_batch(lane, 10_300, BatchLimits(4, (), 10_000))[0]
