"""A request's send window in the stub (stub/senders.SendWindow): at most CREDIT_WINDOW unreleased
responses, no new one once WINDOW_BYTES are unreleased (but one of any size always goes), a credit
retires the oldest, and a cancellation opens it for good."""

from __future__ import annotations

import threading

from pystub_backend.stub.senders import CREDIT_WINDOW, WINDOW_BYTES, SendWindow


def test_one_response_of_any_size_goes_then_the_window_is_full_until_a_credit():
    window = SendWindow()
    assert window.wait_room(0)
    window.sent(4 * WINDOW_BYTES)  # larger than the whole window: still allowed as the first
    assert not window.wait_room(0.01)
    assert window.unreleased == (1, 4 * WINDOW_BYTES)
    window.credit()
    assert window.unreleased == (0, 0) and window.wait_room(0)


def test_bytes_bound_the_window_before_the_count_does():
    window = SendWindow()
    size = WINDOW_BYTES // 4
    for _ in range(4):
        assert window.wait_room(0)
        window.sent(size)
    assert not window.wait_room(0.01)  # 4 x 64 KiB = WINDOW_BYTES unreleased
    window.credit()
    assert window.wait_room(0)


def test_small_responses_are_bounded_by_count():
    window = SendWindow()
    for _ in range(CREDIT_WINDOW):
        assert window.wait_room(0)
        window.sent(1)
    assert not window.wait_room(0.01)


def _waits_until(release: str) -> SendWindow:
    window = SendWindow()
    window.sent(WINDOW_BYTES)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(window.wait_room(30)))
    waiter.start()
    getattr(window, release)()
    waiter.join(30)
    assert result == [True], release
    return window


def test_a_waiting_sender_wakes_on_a_credit_or_a_cancellation():
    _waits_until("credit")
    window = _waits_until("open_wide")
    window.sent(10 * WINDOW_BYTES)
    assert window.wait_room(0)  # opened wide: a cancelled request never waits again
