"""Which of a version's instances share one copy of the weights, and the stubs that do it
(docs/shared-weights.md).

The config parameter `PYSTUB_SHARE_WEIGHTS: "yes"` (a pystub extension; Triton ignores
parameters it does not know, so the same repository still loads there) makes the version's
KIND_CPU instances forks of one template stub (supervision.template), which runs the model's
`initialize` once. KIND_GPU and KIND_MODEL instances keep the ordinary mode: a GPU context does
not survive a fork. Everything else about an instance (its supervisor, exchange, scheduler) is
what it would be; only its StubFactory differs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pystub_backend.backend.config.model_config import ModelConfig, config_parameters
from pystub_backend.backend.config.placement import Placement
from pystub_backend.backend.supervision.forked import ForkedStub
from pystub_backend.backend.supervision.instance import InstanceSpec, ModelInstance
from pystub_backend.backend.supervision.stub_process import StubProcess
from pystub_backend.backend.supervision.template import WeightsTemplate

__all__ = ["SHARE_WEIGHTS_PARAMETER", "InstancePlan", "plan_instances", "shares_weights"]

log = logging.getLogger("pystub.model")

SHARE_WEIGHTS_PARAMETER = "PYSTUB_SHARE_WEIGHTS"
_SHARED_KIND = "CPU"


class InstancePlan(NamedTuple):
    instances: list[ModelInstance]
    template: WeightsTemplate | None  # None: no instance is forked


def shares_weights(config: ModelConfig) -> bool:
    """Whether the config asks for it: "yes" (any case); "no" or absent: not. Another value is
    logged and read as "no"."""
    value = config_parameters(config).get(SHARE_WEIGHTS_PARAMETER, "").strip().lower()
    if value not in ("", "yes", "no"):
        log.warning("model '%s': config parameter %s is '%s', not yes or no: its weights are not shared",
                    config.name, SHARE_WEIGHTS_PARAMETER, value)
    return value == "yes"


def plan_instances(config: ModelConfig, placements: Sequence[Placement],
                   spec_for: Callable[[Placement], InstanceSpec]) -> InstancePlan:
    """The version's instances (not started); with sharing on, the KIND_CPU ones fork from one
    template, started by the first of them to start."""
    wanted = shares_weights(config)
    shared = [p for p in placements if p.kind == _SHARED_KIND] if wanted else []
    if not shared:
        if wanted:
            log.info("model '%s' has no KIND_CPU instance: its weights are not shared", config.name)
        return InstancePlan([ModelInstance(p.name, spec_for(p)) for p in placements], None)
    template = WeightsTemplate(f"{config.name}_template", spec_for(shared[0]))

    def forked(name: str, spec: InstanceSpec) -> StubProcess:
        if template.refusal is not None:  # refused once: ordinary stubs from then on
            return StubProcess(name, spec.settings, spec.model_name, spec.services)
        return ForkedStub(name, spec.settings, spec.model_name, spec.services, template)

    instances = [ModelInstance(p.name, spec_for(p), forked) if p.kind == _SHARED_KIND
                 else ModelInstance(p.name, spec_for(p)) for p in placements]
    return InstancePlan(instances, template)
