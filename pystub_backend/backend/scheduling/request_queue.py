"""The dynamic batcher's queue: priority levels, queue policies, and the rule that forms a batch.

Pure bookkeeping with no asyncio in it (the batcher owns the clock and the timers), so every rule
here is unit-tested on its own. It follows Triton's `dynamic_batching` semantics:

    priority_levels N      levels 1..N, 1 is served first; a request's `priority` 0 or > N gets
                           `default_priority_level`; N = 0 means one level
    queue policy           per level (`priority_queue_policy`, else `default_queue_policy`):
                           max_queue_size (0 = unbounded), default_timeout_microseconds,
                           allow_timeout_override (a request may only shorten the timeout),
                           timeout_action REJECT (fail it) or DELAY (serve it after the level's
                           requests that did not time out)
    batch                  the longest run of requests, in service order, whose inputs can be
                           concatenated (same names, datatypes and non-batch dims), whose batch
                           sizes add up to at most the largest preferred size (else max_batch_size)

`form_batch` sends the run at once when it cannot grow (next request incompatible or too big, or
the cap reached) or when there is no queue delay; otherwise the largest prefix of a preferred
size; otherwise waits until the oldest request of the run has waited `max_queue_delay`.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

__all__ = ["QueueEntry", "QueuePolicy", "QueueFullError", "PriorityQueue", "BatchLimits", "form_batch",
           "REJECT", "DELAY"]

REJECT = 0  # model_config_pb2.ModelQueuePolicy.REJECT
DELAY = 1  # model_config_pb2.ModelQueuePolicy.DELAY


class QueueFullError(Exception):
    """The request's priority level holds `max_queue_size` requests already."""


class QueueEntry:
    """What the queue needs to know of a request. The batcher subclasses it."""

    __slots__ = ("batch_size", "key", "enqueued_ns", "deadline_ns", "level", "delayed", "queued")

    def __init__(self, batch_size: int, key: Hashable, enqueued_ns: int) -> None:
        self.batch_size = batch_size
        self.key = key  # requests batch together only when their keys are equal
        self.enqueued_ns = enqueued_ns
        self.deadline_ns = 0  # 0: no queue timeout
        self.level = 0
        self.delayed = False  # timed out under DELAY: served after the level's other requests
        self.queued = False


@dataclass(frozen=True)
class QueuePolicy:
    timeout_action: int = REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_proto(cls, policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
        return cls(int(policy.timeout_action), int(policy.default_timeout_microseconds),
                   bool(policy.allow_timeout_override), int(policy.max_queue_size))

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request that asked for `requested_us` (0: none asked)."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and requested_us > 0 and (timeout == 0 or requested_us < timeout):
            timeout = requested_us
        return timeout


class _Level:
    __slots__ = ("policy", "waiting", "delayed")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.waiting: collections.deque[QueueEntry] = collections.deque()
        self.delayed: collections.deque[QueueEntry] = collections.deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)


class PriorityQueue:
    """Requests by priority level, each level FIFO with its delayed requests behind."""

    def __init__(self, priority_levels: int = 0, default_level: int = 0,
                 default_policy: QueuePolicy = QueuePolicy(),
                 level_policies: dict[int, QueuePolicy] | None = None) -> None:
        count = max(int(priority_levels), 1)
        self._levels = [_Level((level_policies or {}).get(n, default_policy)) for n in range(1, count + 1)]
        self._priority_levels = int(priority_levels)
        # Triton refuses a default outside [1, N] at load; pystub falls back to the lowest level.
        self._default = default_level if 1 <= default_level <= count else count
        self._deadlines: list[tuple[int, int, QueueEntry]] = []
        self._sequence = itertools.count()
        self._size = 0

    @classmethod
    def from_config(cls, batching: model_config_pb2.ModelDynamicBatching) -> PriorityQueue:
        """From a `ModelDynamicBatching` proto."""
        return cls(int(batching.priority_levels), int(batching.default_priority_level),
                   QueuePolicy.from_proto(batching.default_queue_policy),
                   {int(level): QueuePolicy.from_proto(policy)
                    for level, policy in batching.priority_queue_policy.items()})

    def __len__(self) -> int:
        return self._size

    def level_of(self, priority: int) -> int:
        """The level (1 = first served) of a request's `priority` parameter."""
        if priority <= 0 or priority > self._priority_levels:
            return self._default
        return int(priority)

    def push(self, entry: QueueEntry, priority: int, timeout_us: int, now_ns: int) -> None:
        """Queue `entry` at the back of its level. Raises QueueFullError."""
        entry.level = self.level_of(priority)
        level = self._levels[entry.level - 1]
        if level.policy.max_queue_size and len(level) >= level.policy.max_queue_size:
            raise QueueFullError("Exceeds maximum queue size")
        timeout = level.policy.timeout_us(timeout_us)
        entry.deadline_ns = now_ns + timeout * 1000 if timeout else 0
        level.waiting.append(entry)
        self._queued(entry)

    def _queued(self, entry: QueueEntry) -> None:
        entry.queued = True
        self._size += 1
        if entry.deadline_ns and not entry.delayed:
            heapq.heappush(self._deadlines, (entry.deadline_ns, next(self._sequence), entry))

    def push_front(self, entries: list[QueueEntry]) -> None:
        """Put entries taken by `pop` back in front of their levels, in their order (no size check)."""
        for entry in reversed(entries):
            level = self._levels[entry.level - 1]
            (level.delayed if entry.delayed else level.waiting).appendleft(entry)
        for entry in entries:
            self._queued(entry)

    def discard(self, entry: QueueEntry) -> bool:
        """Remove a queued entry (its client went away); False if it was not queued."""
        if not entry.queued:
            return False
        level = self._levels[entry.level - 1]
        (level.delayed if entry.delayed else level.waiting).remove(entry)
        entry.queued = False
        self._size -= 1
        return True

    def __iter__(self) -> Iterator[QueueEntry]:
        """Entries in service order: level 1 first; in a level, FIFO, the delayed ones last."""
        for level in self._levels:
            yield from level.waiting
            yield from level.delayed

    def pop(self, count: int) -> list[QueueEntry]:
        """Take the first `count` entries in service order."""
        taken: list[QueueEntry] = []
        for level in self._levels:
            for line in (level.waiting, level.delayed):
                while line and len(taken) < count:
                    entry = line.popleft()
                    entry.queued = False
                    taken.append(entry)
        self._size -= len(taken)
        return taken

    def drain(self) -> list[QueueEntry]:
        return self.pop(self._size)

    def expire(self, now_ns: int) -> list[QueueEntry]:
        """Apply the timeout action to entries whose deadline passed; returns the rejected ones."""
        rejected = []
        while self._deadlines and self._deadlines[0][0] <= now_ns:
            deadline, _, entry = heapq.heappop(self._deadlines)
            if not entry.queued or entry.delayed or entry.deadline_ns != deadline:
                continue  # stale: served, cancelled or already delayed
            level = self._levels[entry.level - 1]
            if level.policy.timeout_action == DELAY:
                level.waiting.remove(entry)
                level.delayed.append(entry)
                entry.delayed = True
            else:
                self.discard(entry)
                rejected.append(entry)
        return rejected

    def next_deadline(self) -> int | None:
        """When `expire` will next have work, or None."""
        while self._deadlines:
            deadline, _, entry = self._deadlines[0]
            if entry.queued and not entry.delayed and entry.deadline_ns == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None


@dataclass(frozen=True)
class BatchLimits:
    """How large a batch may grow and how long the first request may wait for it."""

    max_batch_size: int  # 0: the model does not batch; every request runs alone
    preferred: tuple[int, ...] = ()
    delay_ns: int = 0

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> BatchLimits:
        """From a `ModelConfig` with `dynamic_batching`. Preferred sizes above max_batch_size
        (which Triton refuses at load) are ignored."""
        batching = config.dynamic_batching
        maximum = int(config.max_batch_size)
        preferred = tuple(sorted({int(s) for s in batching.preferred_batch_size if 0 < s <= maximum}))
        return cls(maximum, preferred, int(batching.max_queue_delay_microseconds) * 1000)

    @property
    def cap(self) -> int:
        if self.max_batch_size <= 0:
            return 1
        return self.preferred[-1] if self.preferred else self.max_batch_size


def form_batch(entries: Iterable[QueueEntry], now_ns: int,
               limits: BatchLimits) -> tuple[int, int | None]:
    """`(n, wake)`: send the first `n` entries now (n > 0), or wait until `wake` (ns, monotonic)
    and ask again (n == 0; wake None means the queue is empty)."""
    cap = limits.cap
    pending = count = preferred_count = 0
    oldest = now_ns
    key: Hashable = None
    full = False
    for entry in entries:
        if count == 0:
            key = entry.key
        elif entry.key != key or pending + entry.batch_size > cap:
            full = True  # the batch cannot grow past this request
            break
        pending += entry.batch_size
        count += 1
        oldest = min(oldest, entry.enqueued_ns)
        if pending in limits.preferred:
            preferred_count = count
        if pending >= cap:
            full = True
            break
    if count == 0:
        return 0, None
    wake = oldest + limits.delay_ns
    if full or limits.delay_ns == 0 or now_ns >= wake:
        return count, None
    if preferred_count:
        return preferred_count, None
    return 0, wake
