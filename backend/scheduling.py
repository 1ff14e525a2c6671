"""Which scheduler a model version gets, from its config's `scheduling_choice`.

    dynamic_batching  → dynamic_batcher.DynamicBatcher
    (none)            → scheduler.DefaultScheduler (next free instance)

Every scheduler has the same face: `start()`, `schedule(request, batch_size)`,
`schedule_stream(request, batch_size)`, `fail_queued(error)`, `stop(reason)`, `queued`.
"""

from __future__ import annotations

from typing import Any

from backend.dynamic_batcher import DynamicBatcher
from backend.model_config import ModelConfig
from backend.scheduler import DefaultScheduler
from backend.statistics import ModelStatistics

__all__ = ["make_scheduler"]


def make_scheduler(config: ModelConfig, instances: list[Any], stats: ModelStatistics) -> Any:
    choice = config.WhichOneof("scheduling_choice")
    if choice == "dynamic_batching":
        return DynamicBatcher(instances, stats, config)
    return DefaultScheduler(instances, stats)
