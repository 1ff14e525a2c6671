"""Reading Triton's test-hook variables (delay_hooks.py) as Triton 2.51 reads them: C's atoi."""

from __future__ import annotations

import pytest

from pystub_backend.backend.delay_hooks import DelayHooks, QueueHold


@pytest.mark.parametrize("text, count", [(None, 0), ("", 0), ("3", 3), (" 12", 12), ("7x", 7), ("x7", 0),
                                         ("-2", 0), ("+4", 4), ("2.9", 2)])
def test_values_read_as_atoi_reads_them(text: str | None, count: int) -> None:
    environ = {} if text is None else {"TRITONSERVER_DELAY_SCHEDULER": text}
    assert DelayHooks.from_environment(environ).scheduler_count == count


def test_units_as_triton_reads_them() -> None:
    hooks = DelayHooks.from_environment({"TRITONSERVER_DELAY_GRPC_PROCESS": "1500",
                                         "TRITONSERVER_DELAY_GRPC_COMPLETE": "250",
                                         "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": "2"})
    assert (hooks.grpc_process_s, hooks.grpc_complete_s, hooks.grpc_other_s) == (1.5, 0.25, 2.0)  # ms, ms, s


def test_no_hold_unless_set() -> None:
    assert DelayHooks().queue_hold() is None
    assert isinstance(DelayHooks(scheduler_count=2).queue_hold(), QueueHold)


def test_a_hold_lets_go_once_the_count_is_reached() -> None:
    hold = QueueHold(3)
    assert [hold.holds(queued) for queued in (0, 1, 2)] == [True, True, True]
    assert not hold.holds(3)
    assert not hold.holds(0)  # never again, however few wait later
