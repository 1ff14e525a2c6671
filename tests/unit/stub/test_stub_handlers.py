"""The stub's handler table (pystub_backend/stub/handlers.py) is filled explicitly by
`install_features`, and the rescheduling state lives in one object (stub/rescheduled.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pystub_backend.ipc.messages.bls import BlsResponse
from pystub_backend.ipc.messages.sequences import SequenceDropRescheduled, SequenceEvicted
from pystub_backend.ipc.wire import registered_kinds
from pystub_backend.stub.executor import RELEASE_RESCHEDULE
from pystub_backend.stub.features import install, sequences
from pystub_backend.stub.handlers import PHASES, StubHandlers
from pystub_backend.stub.rescheduled import RescheduledRequests
from pystub_backend.stub.senders import RequestState


def test_install_features_wires_every_feature_once() -> None:
    handlers = StubHandlers()
    install.install_features(handlers)
    handled = handlers.handled_kinds()
    assert {BlsResponse, SequenceEvicted, SequenceDropRescheduled} <= handled
    assert handled <= set(registered_kinds().values())
    assert handlers.main_handler(SequenceEvicted) is not None and handlers.receiver_handler(SequenceEvicted) is None
    assert len(handlers.send_hooks()) == 1  # metrics flushes before other frames
    with pytest.raises(ValueError, match="already has a stub handler"):
        install.install_features(handlers)


def test_each_stub_gets_its_own_table() -> None:
    first, second = StubHandlers(), StubHandlers()
    sequences.register(first)
    assert second.handled_kinds() == set()


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stub phase 'booting'"):
        StubHandlers().on_phase("booting", lambda stub: None)


def test_a_failing_phase_hook_is_logged_and_the_next_runs() -> None:
    handlers, seen, errors = StubHandlers(), [], []

    def broken(stub: Any) -> None:
        raise RuntimeError("boom")

    handlers.on_phase(PHASES[0], broken)
    handlers.on_phase(PHASES[0], lambda stub: seen.append(stub))
    stub = SimpleNamespace(log_error=errors.append)
    handlers.notify_phase(stub, PHASES[0])  # type: ignore[arg-type]
    assert seen == [stub] and "RuntimeError: boom" in errors[0]


class _Request:
    def __init__(self, flags: int) -> None:
        self._release_flags = flags


def test_rescheduled_requests_are_kept_taken_and_dropped_by_one_object() -> None:
    kept = RescheduledRequests()
    requests = [_Request(RELEASE_RESCHEDULE), _Request(1), _Request(RELEASE_RESCHEDULE)]
    states = [RequestState(rid=1, requested=set()), RequestState(rid=2, requested=set()),
              RequestState(rid=3, requested=set(), final=True)]
    assert kept.keep(requests, states) == [1]  # 2 released, 3 answered with a final response
    again = kept.take(1)
    assert again is not None and again[0] is requests[0] and requests[0]._release_flags == 1
    assert kept.take(1) is None and len(kept) == 0
    requests[0]._release_flags = RELEASE_RESCHEDULE  # the model reschedules it once more
    kept.keep(requests, states)
    closed: list[RequestState] = []
    assert kept.drop([1, 7], closed.append) == [1] and closed == [states[0]] and len(kept) == 0
    assert RescheduledRequests().take(1) is None  # nothing shared between instances
