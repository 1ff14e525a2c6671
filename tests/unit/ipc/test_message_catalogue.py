"""The message catalogue (pystub_backend/ipc/messages/catalogue.py) and the wire registry agree,
and the records inside messages decode into their named types."""

from __future__ import annotations

from collections import Counter
from typing import get_args

import msgpack
import pytest

from pystub_backend.backend.features.install import install_features as install_backend_features
from pystub_backend.backend.supervision.handlers import BackendHandlers
from pystub_backend.ipc import messages
from pystub_backend.ipc.messages import core as msg
from pystub_backend.ipc.messages.catalogue import CATALOGUE, Direction
from pystub_backend.ipc.messages.forks import Fork, ForkCheck
from pystub_backend.ipc.messages.multiplex import MultiplexLoaded
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled
from pystub_backend.ipc.messages.to_backend import TO_BACKEND, ToBackend, is_to_backend
from pystub_backend.ipc.records import WireError, WireRequest, WireResponse, WireTensor
from pystub_backend.ipc.wire import MessageDecodeError, decode, encode, kind_of, registered_kinds
from pystub_backend.stub.features.install import install_features
from pystub_backend.stub.handlers import StubHandlers

_FEATURE_RANGES = {"core": range(1, 20), "bls": range(20, 30), "model_control": range(20, 30),
                   "metrics": range(30, 40), "sequences": range(40, 50), "multiplex": range(50, 60),
                   "client_shm": range(60, 70), "workers": range(70, 80), "forks": range(80, 90)}


def test_every_registered_kind_is_in_the_catalogue_exactly_once() -> None:
    registered = registered_kinds()
    numbers = Counter(entry.kind for entry in CATALOGUE)
    names = Counter(entry.name for entry in CATALOGUE)
    assert [k for k, n in numbers.items() if n > 1] == [], "a kind number is reused"
    assert [k for k, n in names.items() if n > 1] == [], "a message name is listed twice"
    assert {entry.kind: entry.name for entry in CATALOGUE} == {k: cls.__name__ for k, cls in registered.items()}
    assert len(CATALOGUE) == 49


def test_each_kind_lies_in_its_features_range_and_module() -> None:
    registered = registered_kinds()
    for entry in CATALOGUE:
        assert entry.kind in _FEATURE_RANGES[entry.feature], entry
        module = registered[entry.kind].__module__.rsplit(".", 1)[1]
        assert module == ("bls" if entry.feature == "model_control" else entry.feature), entry
        assert messages.entry_of(entry.kind) is entry and kind_of(registered[entry.kind]) == entry.kind


def test_what_the_stub_handles_is_sent_to_the_stub() -> None:
    handlers = StubHandlers()
    install_features(handlers)
    core_to_stub = {msg.AutoComplete, msg.Init, msg.Execute, msg.Finalize, msg.IsReady, msg.Release, msg.Cancel,
                    msg.Spilled}
    core_to_stub |= {ForkCheck, Fork}  # what a shared-weights template's own loop reads (stub/fork_server.py)
    for cls in handlers.handled_kinds() | core_to_stub:
        assert messages.entry_of(kind_of(cls)).direction in (Direction.TO_STUB, Direction.BOTH), cls
    to_stub = {e.name for e in CATALOGUE if e.direction in (Direction.TO_STUB, Direction.BOTH)}
    assert to_stub == {cls.__name__ for cls in handlers.handled_kinds() | core_to_stub}


def test_the_core_links_kinds_never_go_to_or_from_a_stub() -> None:
    from pystub_backend.ipc.messages.workers import LINK_MESSAGES

    link = {e.name for e in CATALOGUE if e.direction in (Direction.TO_CORE, Direction.TO_WORKER)}
    assert link == {cls.__name__ for cls in LINK_MESSAGES}
    assert {e.feature for e in CATALOGUE if e.name in link} == {"workers"}


def test_records_decode_into_named_types_and_stay_positional() -> None:
    tensor = WireTensor("INPUT0", "FP32", [2], [0, 64, 8])
    request = WireRequest(7, "id", [tensor], ["OUTPUT0"], "{}", 0, 0, 0)
    execute = decode(encode(msg.Execute(3, [request], [[0, 0, 8]])))
    (got,) = execute.requests
    assert type(got) is WireRequest and got == request and got.output_regions is None
    assert type(got.inputs[0]) is WireTensor and got.inputs[0].handle == [0, 64, 8]
    rid, _, inputs, requested, *_ = got  # backend code destructures records positionally
    assert (rid, requested) == (7, ["OUTPUT0"])
    done = decode(encode(msg.ExecuteDone(3, WireError(1, "boom"), [WireResponse(7, 1, None, [tensor], "{}")])))
    assert type(done.error) is WireError and done.error.message == "boom"
    assert type(done.responses[0]) is WireResponse and type(done.responses[0].outputs[0]) is WireTensor
    drop = decode(encode(SequenceDropRescheduled([7], WireError(3, "evicted"))))
    assert drop.error == WireError(3, "evicted")


def test_an_eight_field_request_array_is_a_request_without_regions() -> None:
    frame = msgpack.packb([kind_of(msg.Execute), 1, [[7, "", [], [], "{}", 0, 0, 0]], []])
    assert decode(frame).requests[0].output_regions is None


@pytest.mark.parametrize("request_array, why", [
    ([7, "", [], [], "{}", 0, 0], "WireRequest record must be an array of 8-11 fields"),
    ([7, "", [["I", "FP32", [1]]], [], "{}", 0, 0, 0], "WireTensor record must be an array of 4-4 fields"),
    ([7, "", [["I", 5, [1], [0, 0, 4]]], [], "{}", 0, 0, 0], "record WireTensor has a field 'datatype' of type int"),
    ([7, "", {}, [], "{}", 0, 0, 0], "record WireRequest has a field 'inputs' of type dict"),
    ("request", "WireRequest record must be an array"),
])
def test_a_malformed_record_is_a_corrupt_frame(request_array: object, why: str) -> None:
    frame = msgpack.packb([kind_of(msg.Execute), 1, [request_array], []])
    with pytest.raises(MessageDecodeError, match=why):
        decode(frame)


def test_metric_entries_are_told_apart_by_length() -> None:
    from pystub_backend.ipc.messages.metrics import (
        ENTRY_CREATE,
        ENTRY_DELETE,
        ENTRY_UPDATE,
        MetricCreate,
        MetricDelete,
        MetricOps,
        MetricUpdate,
    )
    entries = [[ENTRY_CREATE, "f", {"a": "b"}, None], [ENTRY_UPDATE, "f", {}, None, 1.5, [2.0]],
               [ENTRY_DELETE, "f", {}]]
    decoded = decode(msgpack.packb([kind_of(MetricOps), entries]))
    assert [type(e) for e in decoded.entries] == [MetricCreate, MetricUpdate, MetricDelete]
    assert decoded.entries[1].delta == 1.5 and decoded.entries[1].observations == [2.0]
    with pytest.raises(MessageDecodeError, match=r"MetricCreate \| MetricUpdate \| MetricDelete record must be an "
                                                 r"array of \[3, 4, 6\] fields"):
        decode(msgpack.packb([kind_of(MetricOps), [[ENTRY_DELETE, "f", {}, None, 1]]]))


def test_the_backends_union_is_every_kind_a_stub_sends() -> None:
    from_stub = {entry.name for entry in CATALOGUE if entry.direction in (Direction.TO_BACKEND, Direction.BOTH)}
    assert {cls.__name__ for cls in TO_BACKEND} == from_stub
    assert set(get_args(ToBackend)) == set(TO_BACKEND) and len(TO_BACKEND) == len(from_stub)
    assert is_to_backend(MultiplexLoaded("m", 0.5)) and is_to_backend(msg.Release([], []))
    assert not is_to_backend(msg.Execute(1, [], [])) and not is_to_backend(("a", "tuple"))


def test_the_backends_feature_handlers_take_kinds_a_stub_sends() -> None:
    handled = install_backend_features(BackendHandlers()).handled_kinds()
    assert MultiplexLoaded in handled and handled <= set(TO_BACKEND)
