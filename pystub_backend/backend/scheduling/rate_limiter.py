"""The rate limiter: `--rate-limit=execution_count` runs an instance only while the resources its
instance group's `rate_limiter` names are free, and hands free resources out by `priority`.

    scheduler ──▶ RateLimitedInstance.gate.enter ──▶ RateLimiter.acquire(needs, priority)
                      │ (waits: the resources are taken)      ▲
                      ▼                                       │ release (gate.leave): the waiters
                  ModelInstance.submit ── execute returned ───┘ that now fit go, best priority first

What Triton 2.51 does, and so pystub (checked against it):
- `--rate-limit` is `off` by default: `rate_limiter` sections are then ignored;
- resources are server-wide (every model's instances share them). How many of a resource there
  are: `--rate-limit-resource=<name>:<count>[:<device>]`, else the largest count any one loaded
  instance asks for (so two instances that each need 1 of a resource nobody declared take turns);
- an instance that needs more than `--rate-limit-resource` declares fails to load with Triton's
  text (`capacity_error`); a malformed flag is a usage error with Triton's text;
- a lower `priority` number goes first (Triton weights chances by priority; pystub serves the best
  priority that fits, oldest first within a priority).

pystub's instances are CPU processes: per-device resources all count on device 0, `global`
resources are shared by every device, and a `<device>` other than 0 in the flag counts for nothing.
An instance holds its resources for its `execute`, from the moment it is handed a batch until the
model returns (not while a decoupled model keeps sending afterwards).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.scheduling.base import Gate, StubInstance

__all__ = ["RATE_LIMIT_MODES", "ResourceLimit", "RateLimiter", "RateLimitedInstance", "parse_resource_limit",
           "rate_limited", "limit_instances", "unregister", "RateLimitError"]

RATE_LIMIT_MODES = ("off", "execution_count")
_GLOBAL = -1  # the device key of `global: true` resources
_CPU_DEVICE = 0
_KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU


class RateLimitError(ValueError):
    """A rate_limiter configuration pystub cannot honour; the message is Triton's text."""


@dataclass(frozen=True)
class ResourceLimit:
    """One `--rate-limit-resource`: `device` None means every device."""

    name: str
    count: int
    device: int | None = None


def _number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"Invalid option value. Got {text}") from None
    if value < 0:
        raise ValueError(f"Invalid option value. Got {text}")
    return value


def parse_resource_limit(text: str) -> ResourceLimit:
    """`<name>:<count>[:<device>]`. Raises ValueError with Triton's text."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                         f"'<resource_name>:<count>'. Got {text}")
    device = _number(parts[2]) if len(parts) == 3 else None
    return ResourceLimit(parts[0], _number(parts[1]), device)


Needs = dict[tuple[str, int], int]  # (resource, device key) -> count


def instance_needs(group: model_config_pb2.ModelInstanceGroup) -> Needs:
    """What one instance of the `instance_group` entry needs while it executes."""
    needs: Needs = {}
    for resource in group.rate_limiter.resources:
        key = (resource.name, _GLOBAL if getattr(resource, "global") else _CPU_DEVICE)
        needs[key] = needs.get(key, 0) + int(resource.count)
    return needs


def capacity_error(name: str, available: int, needed: int) -> str:
    return (f'Resource count for "{name}" is limited to {available} which will prevent scheduling of one or more '
            f'model instances, the minimum required count is {needed}')


class RateLimiter:
    """The server's resources and who waits for them. Event-loop only."""

    def __init__(self, limits: list[ResourceLimit]) -> None:
        self._declared: dict[tuple[str, int], int] = {}
        for limit in limits:
            # A resource declared without a device counts for every device, a global one included.
            if limit.device is None:
                self._declared[(limit.name, _CPU_DEVICE)] = limit.count
                self._declared[(limit.name, _GLOBAL)] = limit.count
            elif limit.device == _CPU_DEVICE:
                self._declared[(limit.name, _CPU_DEVICE)] = limit.count
        self._registered: list[Needs] = []  # the loaded instances' needs: undeclared counts follow them
        self._in_use: dict[tuple[str, int], int] = {}
        self._waiters: list[tuple[int, int, Needs, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def available(self, key: tuple[str, int]) -> int:
        if key in self._declared:
            return self._declared[key]
        return max((needs.get(key, 0) for needs in self._registered), default=0)

    def register(self, instances_needs: list[Needs]) -> None:
        """A model's instances with these needs are loading: all or none are registered. Raises
        RateLimitError (Triton's text) when a declared resource has fewer than one needs."""
        for needs in instances_needs:
            for key, count in needs.items():
                if key in self._declared and self._declared[key] < count:
                    raise RateLimitError(capacity_error(key[0], self._declared[key], count))
        self._registered.extend(instances_needs)

    def unregister(self, instances_needs: list[Needs]) -> None:
        """Those instances are gone (unloaded, or their load failed)."""
        for needs in instances_needs:
            self._registered.remove(needs)
        self._grant()

    def _fits(self, needs: Needs) -> bool:
        return all(self._in_use.get(key, 0) + count <= self.available(key) for key, count in needs.items())

    async def acquire(self, needs: Needs, priority: int) -> None:
        """Wait until `needs` fit, then take them. Cancellation leaves nothing taken."""
        if not self._waiters and self._fits(needs):
            self._take(needs)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (priority, next(self._order), needs, future)
        self._waiters.append(waiter)
        self._waiters.sort(key=lambda w: (w[0], w[1]))
        try:
            await future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif future.done() and not future.cancelled():
                self.release(needs)  # granted as we were cancelled: give it back
            raise

    def release(self, needs: Needs) -> None:
        for key, count in needs.items():
            self._in_use[key] = self._in_use.get(key, 0) - count
        self._grant()

    def _take(self, needs: Needs) -> None:
        for key, count in needs.items():
            self._in_use[key] = self._in_use.get(key, 0) + count

    def _grant(self) -> None:
        """Start the waiters that fit now, best priority (then oldest) first; a waiter that does not
        fit does not hold back a later one that does."""
        for waiter in list(self._waiters):
            _, _, needs, future = waiter
            if future.done():
                self._waiters.remove(waiter)
            elif self._fits(needs):
                self._waiters.remove(waiter)
                self._take(needs)
                future.set_result(None)


class RateLimitedInstance:
    """A model instance whose executes take its group's resources first; everything else is the
    instance's own (schedulers use it in place of the instance)."""

    def __init__(self, instance: StubInstance, limiter: RateLimiter, needs: Needs, priority: int) -> None:
        self._instance = instance
        self.limiter = limiter
        self.needs = needs
        self._priority = priority

    def __getattr__(self, name: str) -> Any:
        return getattr(self._instance, name)

    @property
    def gate(self) -> Gate:
        """Each batch takes the group's resources first (`enter`) and gives them back when its
        `execute` returned (`leave`)."""
        return self

    async def enter(self) -> None:
        await self.limiter.acquire(self.needs, self._priority)

    def leave(self) -> None:
        self.limiter.release(self.needs)


def rate_limited(instances: Sequence[StubInstance], config: model_config_pb2.ModelConfig, limiter: RateLimiter | None
                 ) -> Sequence[StubInstance]:
    """The instances as schedulers should see them: wrapped when rate limiting is on and their group
    names resources. `instances` are in `instance_names` order (group by group). Raises
    RateLimitError."""
    if limiter is None:
        return instances
    groups = [group for group in config.instance_group for _ in range(max(1, int(group.count)) * _devices(group))]
    if len(groups) != len(instances):
        return instances  # not one instance per group slot (cannot happen for instance_names)
    return limit_instances(instances, groups, limiter)


def limit_instances(instances: Sequence[StubInstance], groups: Sequence[model_config_pb2.ModelInstanceGroup],
                    limiter: RateLimiter | None) -> list[StubInstance]:
    """`rate_limited` for instances whose groups are named one by one (`groups[i]` is the group
    of `instances[i]`): those a model update adds. Raises RateLimitError."""
    if limiter is None:
        return list(instances)
    needs = [instance_needs(group) for group in groups]
    limiter.register([n for n in needs if n])
    return [RateLimitedInstance(instance, limiter, n, int(group.rate_limiter.priority) or 1) if n else instance
            for instance, group, n in zip(instances, groups, needs, strict=True)]


def _devices(group: model_config_pb2.ModelInstanceGroup) -> int:
    """How many devices each of the group's `count` instances runs on (one per listed GPU)."""
    return max(1, len(group.gpus)) if group.kind == _KIND_GPU else 1


def unregister(instances: Sequence[StubInstance]) -> None:
    """The model version these (`rate_limited`) instances belong to is gone: its needs no longer
    size undeclared resources."""
    for instance in instances:
        if isinstance(instance, RateLimitedInstance):
            instance.limiter.unregister([instance.needs])
