"""What a model version keeps to update its instances in place (models.version), and the update being
made: which instance has which signature, what a new instance starts from, the removed instances
that still end their sequences.

    ModelVersion.load ──▶ keeper.loaded(instances, config, config_json, sources)
    ModelVersion.prepare_instances(config) ──▶ keeper.prepare: a PreparedUpdate (the plan, Triton's
        names, pystub's unique names) ──▶ new instances started ──▶ ModelVersion.apply_instances
        ──▶ the removed ones drained and stopped (sequence models: keeper.drain_in_background)

A new instance is given the config JSON and the model's files of the version's load, not the
updated config: Triton 2.51's Python backend hands every instance the config its model was first
loaded with (its `model_config` argument shows the old instance groups after an update too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace

from tritonclient.grpc import model_config_pb2

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.models.instance_update import Plan, Signature, Wanted, plan, unique_name, wanted_instances
from pystub_backend.backend.scheduling.base import StubInstance
from pystub_backend.backend.supervision.instance import InstanceState, ModelInstance

__all__ = ["InstanceKeeper", "PreparedUpdate"]

log = logging.getLogger("pystub.model")


@dataclass
class PreparedUpdate:
    """An update whose new instances are started (`started`), not yet serving."""

    config: ModelConfig
    plan: Plan[ModelInstance]
    stale: list[ModelInstance]  # FAILED for good: replaced in their place, removed
    taken: set[str]  # the names pystub's views already show
    own_names: list[str | None]  # per new instance: the name of the FAILED one it replaces
    created: list[ModelInstance] = field(default_factory=list)
    scheduled: list[StubInstance] = field(default_factory=list)  # `created` as the scheduler sees them

    def names(self) -> list[tuple[str, Wanted]]:
        """Each new instance's unique name and what it is (its Triton name is its placement's)."""
        named = []
        for wanted, own in zip(self.plan.created, self.own_names, strict=True):
            name = own or unique_name(wanted.placement.name, self.taken)
            self.taken.add(name)
            named.append((name, wanted))
        return named

    def groups(self) -> list[model_config_pb2.ModelInstanceGroup]:
        """The instance group of each new instance."""
        by_name = {group.name: group for group in self.config.instance_group}
        return [by_name[wanted.placement.group] for wanted in self.plan.created]

    def started(self, created: list[ModelInstance], scheduled: list[StubInstance]) -> None:
        self.created, self.scheduled = created, scheduled

    def order(self) -> list[ModelInstance]:
        """The version's instances after the update, in Triton's order."""
        made = iter(self.created)
        return [next(made) if isinstance(entry, Wanted) else entry for entry in self.plan.order]

    @property
    def removed(self) -> list[ModelInstance]:
        return [*self.plan.removed, *self.stale]


class InstanceKeeper:
    def __init__(self) -> None:
        self.config_json = ""  # what every instance's `initialize` is given as `model_config`
        self.sources: dict[str, bytes] = {}  # the model's files at load (models.snapshot)
        self._signatures: dict[ModelInstance, Signature] = {}
        self._draining: dict[ModelInstance, asyncio.Task[None]] = {}

    def loaded(self, instances: Sequence[ModelInstance], config: ModelConfig, config_json: str,
               sources: dict[str, bytes]) -> None:
        """The version made `instances` for `config` (in `placements` order)."""
        self.config_json, self.sources = config_json, sources
        self._signatures = {instance: wanted.signature
                            for instance, wanted in zip(instances, wanted_instances(config), strict=True)}

    def prepare(self, instances: Sequence[ModelInstance], config: ModelConfig) -> PreparedUpdate:
        """The plan that turns `instances` into those `config` asks for. An instance FAILED for good
        that the plan keeps is replaced: a new instance in its place, of its names (Triton's, as its
        model was told it, and pystub's, as its views show it)."""
        the_plan = plan([(instance, self._signatures[instance]) for instance in instances], wanted_instances(config))
        order: list[ModelInstance | Wanted] = []
        own_names: list[str | None] = []  # per new instance: the name of the one it replaces
        failed: list[ModelInstance] = []
        for entry in the_plan.order:
            if isinstance(entry, Wanted):
                own_names.append(None)
            elif entry.state is InstanceState.FAILED:
                failed.append(entry)
                wanted = the_plan.matched.pop(entry)
                entry = Wanted(replace(wanted.placement, name=entry.spec.args["model_instance_name"]),
                               wanted.signature)
                own_names.append(failed[-1].name)
            order.append(entry)
        the_plan.order = order
        taken = {i.name for i in [*instances, *self._draining]} - {i.name for i in failed}
        return PreparedUpdate(config, the_plan, failed, taken, own_names)

    def adopt(self, update: PreparedUpdate) -> None:
        """The update serves: remember the new instances' signatures."""
        for instance, wanted in zip(update.created, update.plan.created, strict=True):
            self._signatures[instance] = wanted.signature

    @property
    def draining(self) -> list[ModelInstance]:
        """Removed instances that still end the sequences they hold."""
        return list(self._draining)

    def drain_in_background(self, instance: ModelInstance, removal: Awaitable[None]) -> None:
        task = asyncio.ensure_future(removal)
        self._draining[instance] = task
        task.add_done_callback(lambda done: self._drained(instance, done))

    def _drained(self, instance: ModelInstance, task: asyncio.Task[None]) -> None:
        if self._draining.get(instance) is task:
            del self._draining[instance]
        if not task.cancelled() and task.exception() is not None:
            log.error("removing instance '%s' failed", instance.name, exc_info=task.exception())

    def forget(self, instance: ModelInstance) -> None:
        self._signatures.pop(instance, None)

    async def stop_draining(self) -> list[ModelInstance]:
        """The version unloads: stop waiting for the removed instances' sequences; returns those
        instances (the version stops them with the others)."""
        tasks = dict(self._draining)
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        return [instance for instance in tasks if instance.state is not InstanceState.STOPPED]
