"""An update that changes only a model's instances: when a reload is one, and which instances it keeps,
adds and removes, as Triton 2.51 decides both (model_lifecycle.cc, backend_model_instance.cc).

    reload of a loaded version ──▶ `only_instances_differ(old, new)` and its files unchanged?
        no  ──▶ a full reload (new stubs for every instance)
        yes ──▶ `plan(current, wanted)`: each wanted instance takes an existing one of the same
                signature (the last of them), else a new one is made; the existing ones left over
                are removed

A signature is an instance group with its `name` and `count` left out, and the device: a group that
is renamed, or split into two groups of the same settings, keeps its instances (with their old
names); one whose `kind`, `gpus`, `rate_limiter`, `passive`, `host_policy`, `profile` or
`secondary_devices` changed gets new ones. A new instance is named `<group>_<n>` after its place in
its group, as on a first load, even when a kept instance already has that name (Triton 2.51 then has
two of one name). The instance list after an update is the kept instances in the order they were
taken, then the new ones; since each wanted instance takes the LAST existing one of its signature,
the first ones in the list are those removed: after a growth, the oldest.

Pure functions of configs and plain values: the model version applies the plan (models.version).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.config.placement import Placement, placements

__all__ = ["Signature", "Wanted", "Plan", "only_instances_differ", "wanted_instances", "plan", "unique_name"]

Signature = tuple[bytes, int]  # the group's settings but its name and count (serialized), the device id
_Key = TypeVar("_Key", bound=Hashable)


def _without_instances(config: ModelConfig) -> ModelConfig:
    copy = ModelConfig()
    copy.CopyFrom(config)
    copy.ClearField("instance_group")
    return copy


def only_instances_differ(old: ModelConfig, new: ModelConfig) -> bool:
    """Whether two normalized configs are equal but for their instance groups (equal ones too)."""
    return _without_instances(old) == _without_instances(new)


@dataclass(frozen=True)
class Wanted:
    """One instance a config asks for: where it runs (its Triton name included) and its signature."""

    placement: Placement
    signature: Signature


def wanted_instances(config: ModelConfig) -> list[Wanted]:
    """Every instance of a normalized config, in Triton's creation order, with its signature."""
    settings: dict[str, bytes] = {}
    for index, group in enumerate(config.instance_group):
        bare = type(group)()
        bare.CopyFrom(group)
        bare.ClearField("name")
        bare.ClearField("count")
        settings[group.name or f"{config.name}_{index}"] = bare.SerializeToString(deterministic=True)
    return [Wanted(placement, (settings[placement.group], placement.device_id)) for placement in placements(config)]


@dataclass
class Plan(Generic[_Key]):
    """What an update does: `order` is the instance list after it, each entry an existing key or a
    `Wanted` to create; `removed` are the existing keys it drops, in their current order."""

    order: list[_Key | Wanted]
    removed: list[_Key]
    matched: dict[_Key, Wanted]  # what each kept key stands for in the new config

    @property
    def created(self) -> list[Wanted]:
        return [entry for entry in self.order if isinstance(entry, Wanted)]

    @property
    def kept(self) -> list[_Key]:
        return [entry for entry in self.order if not isinstance(entry, Wanted)]


def plan(current: Sequence[tuple[_Key, Signature]], wanted: Sequence[Wanted]) -> Plan[_Key]:
    """Match `wanted` against the `current` instances (in their list order) as Triton does: each
    wanted instance, in order, takes the last unmatched current one of its signature, or is new."""
    pools: dict[Signature, list[_Key]] = {}
    for key, signature in current:
        pools.setdefault(signature, []).append(key)
    kept: list[_Key | Wanted] = []
    created: list[_Key | Wanted] = []
    matched: dict[_Key, Wanted] = {}
    for instance in wanted:
        pool = pools.get(instance.signature)
        if pool:
            key = pool.pop()
            kept.append(key)
            matched[key] = instance
        else:
            created.append(instance)
    left = {key for pool in pools.values() for key in pool}
    return Plan(kept + created, [key for key, _ in current if key in left], matched)


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name.2`, `name.3`... when an instance already has it: what pystub's own views
    (stubctl, /v2/pystub/stubs, the pystub_stub_* metrics) call an instance whose Triton name a kept
    instance holds. The model itself is told the Triton name."""
    if name not in taken:
        return name
    number = 2
    while f"{name}.{number}" in taken:
        number += 1
    return f"{name}.{number}"
