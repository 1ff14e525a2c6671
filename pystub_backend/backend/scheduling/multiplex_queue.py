"""The queue of a multiplexed model: a free worker takes the work its instance suits best.

Workers pull (`get_for(instance)`) rather than requests being pushed to an instance, so no instance
idles while work it may take is waiting. Under the `affinity` policy a free worker of instance I
looks at the oldest WINDOW entries and takes, in this order of preference:

    1. the oldest entry whose id I holds (or runs a request for now): a cache hit
    2. the oldest entry that no other healthy instance holds (a miss anyway), if I is the idle
       instance that loses least by loading it: one with a free slot, else the one whose least
       recently used sub-model (which its cache will evict) is the least popular. Rare ids thus
       cycle through the instances whose sub-models are rare too, and popular ones stay loaded.
       An entry without an id may go to any instance.
    3. the oldest entry whose holders are too busy: waiting for them would take longer than
       loading the id here. Up to this entry, the H holders have W entries each waiting for them
       (the fewest of any holder); W / H turns is more than `view.patience()`, the turns a holder
       serves in the time of one load. I loads the id too: a hot id ends up on several instances
       instead of piling up on one.

Otherwise I waits; the holder takes the entry when one of its workers frees. An entry that has
been passed over MAX_PASSES times (affinity let newer work go first) is taken by the next free
worker whatever it holds, so nothing starves. Under the `random` policy each entry is pinned to a
random instance when it is queued (the baseline routing is measured against).

The queue also offers the asyncio.Queue calls the default scheduler makes (`put_nowait`,
`get_nowait`, `empty`, `qsize`). Pure bookkeeping on the event loop; no locks.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from typing import Generic, Protocol, TypeVar

from pystub_backend.backend.inference import InferRequest
from pystub_backend.backend.scheduling.pipelined import Work
from pystub_backend.ipc.messages.multiplex import MODEL_ID_PARAMETER

__all__ = ["AFFINITY", "RANDOM", "ROUTING_POLICIES", "RoutedQueue", "WINDOW", "MAX_PASSES", "routed_id"]

AFFINITY = "affinity"
RANDOM = "random"
ROUTING_POLICIES = (AFFINITY, RANDOM)
WINDOW = 256  # entries a worker looks at; beyond it, work waits its turn in FIFO order
MAX_PASSES = 32
RECHECK_SECONDS = 0.25  # idle workers look again this often (an instance died, a holder restarted)
POPULARITY_HALF_LIFE = 200  # requests after which an id's past requests count half
_RESCALE_AT = 1e100


def routed_id(request: InferRequest) -> str | None:
    """The sub-model id the request is routed by (checked by then: a string, or None)."""
    model_id = request.parameters.get(MODEL_ID_PARAMETER)
    return model_id if isinstance(model_id, str) else None


class Routable(Protocol):
    """What the queue asks of an instance itself (multiplex.MultiplexedInstance; a fake in tests)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def usable(self) -> bool: ...


_Instance = TypeVar("_Instance", bound=Routable)
_Viewed = TypeVar("_Viewed", bound=Routable, contravariant=True)


class HoldingsView(Protocol[_Viewed]):
    """What the queue needs to know of the instances' caches."""

    def holds(self, instance: _Viewed, model_id: str) -> bool:
        """Whether the instance holds the id, or runs a request for it now."""

    def victim(self, instance: _Viewed) -> str | None:
        """The id the instance's cache would evict to load another, None when it has room."""

    def patience(self) -> float:
        """How many turns (entries per holder) waiting for a holder may last before another
        instance loads the id as well: about the entries a holder serves while one load runs."""


class _Entry(Generic[_Instance]):
    __slots__ = ("work", "model_id", "passes", "pinned")

    def __init__(self, work: Work, model_id: str | None, pinned: _Instance | None) -> None:
        self.work = work
        self.model_id = model_id
        self.passes = 0
        self.pinned = pinned


class RoutedQueue(Generic[_Instance]):
    def __init__(self, instances: list[_Instance], view: HoldingsView[_Instance], policy: str = AFFINITY,
                 rng: random.Random | None = None) -> None:
        self._instances = instances
        self._holds = view.holds
        self._victim = view.victim
        self._patience = view.patience
        self._policy = policy
        self._rng = rng or random.Random()
        self._entries: collections.deque[_Entry[_Instance]] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []
        self._idle: collections.Counter[int] = collections.Counter()  # waiting workers per instance id()
        # Exponentially decayed request counts per id, kept as growing increments (no decay pass).
        self._popularity: dict[str, float] = {}
        self._increment = 1.0

    # -- the asyncio.Queue subset the default scheduler uses --------------------------------------
    def put_nowait(self, work: Work) -> None:
        model_id = routed_id(work.request)
        pinned = None
        if self._policy == RANDOM:
            usable = [i for i in self._instances if i.usable] or self._instances
            pinned = self._rng.choice(usable)
        if model_id is not None:
            self._count_request(model_id)
        self._entries.append(_Entry(work, model_id, pinned))
        self.notify()

    def get_nowait(self) -> Work:
        """The oldest work. Raises asyncio.QueueEmpty."""
        if not self._entries:
            raise asyncio.QueueEmpty
        return self._entries.popleft().work

    def empty(self) -> bool:
        return not self._entries

    def qsize(self) -> int:
        return len(self._entries)

    # -- routing -----------------------------------------------------------------------------------
    def notify(self) -> None:
        """Something changed (new work, holdings, a worker finished): waiting workers look again."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def get_for(self, instance: _Instance) -> Work:
        """The work a free worker of `instance` should run next; waits until there is some."""
        loop = asyncio.get_running_loop()
        self._idle[id(instance)] += 1
        try:
            while True:
                index = self.pick(instance)
                if index is not None:
                    return self._take(index)
                waiter = loop.create_future()
                self._waiters.append(waiter)
                try:
                    await asyncio.wait_for(waiter, RECHECK_SECONDS)
                except asyncio.TimeoutError:
                    pass
        finally:
            self._idle[id(instance)] -= 1
            if self._idle[id(instance)] <= 0:
                del self._idle[id(instance)]
            self.notify()  # the idle instances changed: one that deferred to this one looks again

    def pick(self, instance: _Instance) -> int | None:
        """The index of the entry `instance` should take, or None to wait."""
        self._drop_abandoned()
        if not self._entries:
            return None
        if self._policy == RANDOM:
            return self._pick_pinned(instance)
        if not instance.healthy:
            return None  # its worker is about to wait for the restart
        if self._entries[0].passes >= MAX_PASSES:
            return 0
        others = [other for other in self._instances if other is not instance and other.healthy]
        waiting: collections.Counter[int] = collections.Counter()  # entries so far per holder
        fallback = None
        best_loader: bool | None = None  # whether `instance` should load ids nobody holds
        patience = self._patience()
        for index, entry in enumerate(self._entries):
            if index >= WINDOW:
                break
            if entry.model_id is None:
                fallback = index if fallback is None else fallback
                continue
            if self._holds(instance, entry.model_id):
                return index
            if fallback is not None:
                continue  # only a hit may still beat it
            holders = [id(other) for other in others if self._holds(other, entry.model_id)]
            for holder in holders:
                waiting[holder] += 1
            if holders:
                if min(waiting[holder] for holder in holders) / len(holders) > patience:
                    fallback = index  # every holder is too busy
                continue
            if best_loader is None:
                best_loader = self._is_best_loader(instance, others)
            if best_loader:
                fallback = index
        return fallback

    def _is_best_loader(self, instance: _Instance, others: list[_Instance]) -> bool:
        """Whether `instance` loses least, among the idle instances, by loading a new id."""
        def cost(candidate: _Instance) -> float:
            victim = self._victim(candidate)
            return -1.0 if victim is None else self._popularity.get(victim, 0.0)

        mine = cost(instance)
        mine_rank = self._instances.index(instance)
        for other in others:
            if self._idle[id(other)] > 0:
                theirs = cost(other)
                if theirs < mine or (theirs == mine and self._instances.index(other) < mine_rank):
                    return False
        return True

    def _count_request(self, model_id: str) -> None:
        self._increment *= 2 ** (1 / POPULARITY_HALF_LIFE)
        self._popularity[model_id] = self._popularity.get(model_id, 0.0) + self._increment
        if self._increment > _RESCALE_AT:
            self._popularity = {key: value / self._increment for key, value in self._popularity.items()
                                if value / self._increment > 1e-9}
            self._increment = 1.0

    def _pick_pinned(self, instance: _Instance) -> int | None:
        for index, entry in enumerate(self._entries):
            if index >= WINDOW:
                break
            if entry.pinned is None or entry.pinned is instance or not entry.pinned.usable:
                return index
        return None

    def _take(self, index: int) -> Work:
        entries = self._entries
        for skipped in range(index):
            entries[skipped].passes += 1
        entry = entries[index]
        del entries[index]
        return entry.work

    def _drop_abandoned(self) -> None:
        # A client that gave up leaves a done future; its entry must not count as waiting work.
        if any(entry.work.future.done() for entry in itertools.islice(self._entries, WINDOW)):
            self._entries = collections.deque(e for e in self._entries if not e.work.future.done())
