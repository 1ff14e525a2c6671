"""The dynamic batcher's queue rules (backend/scheduling/request_queue.py): priority levels, queue policies
(max_queue_size, timeouts with REJECT and DELAY, timeout override), and batch forming (preferred
sizes, queue delay, max size, incompatible shapes)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.scheduling.request_queue import (
    DELAY,
    REJECT,
    BatchLimits,
    PriorityQueue,
    QueueEntry,
    QueueFullError,
    QueuePolicy,
    form_batch,
)

MS = 1_000_000


def entry(size: int = 1, key: object = "a", at: int = 0) -> QueueEntry:
    return QueueEntry(size, key, at)


def push(queue: PriorityQueue, *entries: QueueEntry, priority: int = 0, timeout_us: int = 0) -> None:
    for e in entries:
        queue.push(e, priority, timeout_us, e.enqueued_ns)


# -- policies and priorities ---------------------------------------------------------------------


def test_priority_levels_serve_level_one_first_and_map_zero_and_out_of_range_to_the_default() -> None:
    queue = PriorityQueue(priority_levels=3, default_level=2)
    low, default, high, too_high = entry(), entry(), entry(), entry()
    push(queue, low, priority=3)
    push(queue, default, priority=0)
    push(queue, too_high, priority=9)
    push(queue, high, priority=1)
    assert [e.level for e in (low, default, too_high, high)] == [3, 2, 2, 1]
    assert list(queue) == [high, default, too_high, low]
    assert queue.pop(2) == [high, default] and len(queue) == 2


def test_without_priority_levels_everything_is_one_fifo() -> None:
    queue = PriorityQueue()
    entries = [entry() for _ in range(3)]
    push(queue, entries[0], priority=5)
    push(queue, entries[1], priority=1)
    push(queue, entries[2])
    assert list(queue) == entries


def test_an_invalid_default_level_falls_back_to_the_lowest_level() -> None:
    assert PriorityQueue(priority_levels=4, default_level=0).level_of(0) == 4
    assert PriorityQueue(priority_levels=4, default_level=7).level_of(0) == 4


def test_max_queue_size_is_per_level() -> None:
    queue = PriorityQueue(priority_levels=2, default_level=2, level_policies={1: QueuePolicy(max_queue_size=1)})
    push(queue, entry(), priority=1)
    with pytest.raises(QueueFullError, match="^Exceeds maximum queue size$"):
        push(queue, entry(), priority=1)
    push(queue, entry(), entry(), entry(), priority=2)  # the default level is unbounded
    assert len(queue) == 4


def test_timeout_override_may_only_shorten_the_default() -> None:
    assert QueuePolicy(default_timeout_us=100).timeout_us(10) == 100  # no override allowed
    allowed = QueuePolicy(default_timeout_us=100, allow_timeout_override=True)
    assert allowed.timeout_us(10) == 10
    assert allowed.timeout_us(500) == 100
    assert allowed.timeout_us(0) == 100
    assert QueuePolicy(allow_timeout_override=True).timeout_us(500) == 500  # no default: any timeout
    assert QueuePolicy().timeout_us(500) == 0


def test_reject_removes_expired_entries() -> None:
    queue = PriorityQueue(default_policy=QueuePolicy(REJECT, default_timeout_us=1000))
    first, second = entry(at=0), entry(at=5 * MS)
    push(queue, first, second)
    assert queue.next_deadline() == 1 * MS
    assert queue.expire(MS - 1) == []
    assert queue.expire(MS) == [first]
    assert list(queue) == [second] and queue.next_deadline() == 6 * MS


def test_delay_moves_expired_entries_behind_the_level() -> None:
    queue = PriorityQueue(default_policy=QueuePolicy(DELAY, default_timeout_us=1000))
    old, new = entry(at=0), entry(at=2 * MS)
    push(queue, old, new)
    assert queue.expire(2 * MS) == []
    assert list(queue) == [new, old] and old.delayed
    assert queue.next_deadline() == 3 * MS


def test_served_or_discarded_entries_do_not_expire() -> None:
    queue = PriorityQueue(default_policy=QueuePolicy(REJECT, default_timeout_us=1000))
    served, gone = entry(), entry()
    push(queue, served, gone)
    assert queue.pop(1) == [served]
    assert queue.discard(gone) and not queue.discard(gone)
    assert queue.expire(10 * MS) == [] and queue.next_deadline() is None and len(queue) == 0


def test_push_front_restores_the_order_and_the_deadlines() -> None:
    queue = PriorityQueue(default_policy=QueuePolicy(REJECT, default_timeout_us=1000))
    entries = [entry(at=0) for _ in range(3)]
    push(queue, *entries)
    taken = queue.pop(2)
    queue.expire(10 * MS)  # their stale heap entries go
    queue.push_front(taken)
    assert list(queue) == taken and len(queue) == 2
    assert queue.expire(10 * MS) == taken


def test_from_config_reads_the_proto() -> None:
    config = model_config_pb2.ModelConfig(max_batch_size=8)
    batching = config.dynamic_batching
    batching.priority_levels = 2
    batching.default_priority_level = 1
    batching.default_queue_policy.max_queue_size = 3
    batching.priority_queue_policy[2].timeout_action = model_config_pb2.ModelQueuePolicy.DELAY
    batching.priority_queue_policy[2].default_timeout_microseconds = 7
    batching.preferred_batch_size.extend([4, 2, 16])
    batching.max_queue_delay_microseconds = 250
    queue = PriorityQueue.from_config(batching)
    assert queue.level_of(0) == 1
    assert queue._levels[0].policy == QueuePolicy(max_queue_size=3)
    assert queue._levels[1].policy == QueuePolicy(DELAY, 7, False, 0)
    assert BatchLimits.from_config(config) == BatchLimits(8, (2, 4), 250_000)  # 16 > max is ignored


# -- forming batches -----------------------------------------------------------------------------


def test_no_delay_sends_whatever_is_queued() -> None:
    limits = BatchLimits(8)
    assert form_batch([entry(), entry()], 0, limits) == (2, None)
    assert form_batch([], 0, limits) == (0, None)


def test_the_queue_delay_waits_for_the_oldest_request() -> None:
    limits = BatchLimits(8, delay_ns=10 * MS)
    entries = [entry(at=2 * MS), entry(at=5 * MS)]
    assert form_batch(entries, 6 * MS, limits) == (0, 12 * MS)
    assert form_batch(entries, 12 * MS, limits) == (2, None)


def test_batches_never_exceed_max_batch_size() -> None:
    limits = BatchLimits(4, delay_ns=10 * MS)
    assert form_batch([entry(2), entry(1), entry(2)], 0, limits) == (2, None)  # 2 + 1 fits, + 2 does not
    assert form_batch([entry(4), entry(1)], 0, limits) == (1, None)
    assert form_batch([entry(1)] * 6, 0, limits) == (4, None)


def test_preferred_sizes_send_the_largest_reachable_prefix_at_once() -> None:
    limits = BatchLimits(16, preferred=(2, 4, 8), delay_ns=10 * MS)
    assert form_batch([entry()] * 5, 0, limits) == (4, None)
    assert form_batch([entry()] * 3, 0, limits) == (2, None)
    assert form_batch([entry()] * 1, 0, limits) == (0, 10 * MS)
    assert form_batch([entry(3)] * 2, 0, limits) == (0, 10 * MS)  # 3, 6: no preferred size reached
    assert form_batch([entry()] * 12, 0, limits) == (8, None)  # the largest preferred size caps it


def test_an_incompatible_request_ends_the_batch_without_waiting() -> None:
    limits = BatchLimits(16, delay_ns=10 * MS)
    assert form_batch([entry(key="a"), entry(key="a"), entry(key="b"), entry(key="a")], 0, limits) == (2, None)
    assert form_batch([entry(key="b"), entry(key="a")], 0, limits) == (1, None)


def test_a_model_without_batching_runs_requests_one_by_one() -> None:
    limits = BatchLimits(0, delay_ns=10 * MS)
    assert form_batch([entry(), entry()], 0, limits) == (1, None)
