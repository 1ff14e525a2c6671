"""Which scheduler a model version gets, from its config's `scheduling_choice`.

    dynamic_batching  → dynamic_batcher.DynamicBatcher
    sequence_batching → sequence_batcher.SequenceBatcher (slots per sequence, eviction hooks)
    (none)            → scheduler.DefaultScheduler (next free instance)
                        multiplex_router.MultiplexScheduler when the model multiplexes (it routes)

Every scheduler has the same face: `start()`, `schedule(request, batch_size)`,
`schedule_stream(request, batch_size)`, `fail_queued(error)`, `stop(reason)`, `queued`.
"""

from __future__ import annotations

from typing import Any

from pystub_backend.backend.config.model_config import ModelConfig
from pystub_backend.backend.scheduling.default import DefaultScheduler
from pystub_backend.backend.scheduling.dynamic import DynamicBatcher
from pystub_backend.backend.scheduling.multiplex import MultiplexScheduler, multiplex_state
from pystub_backend.backend.scheduling.sequence import SequenceBatcher
from pystub_backend.backend.telemetry.statistics import ModelStatistics

__all__ = ["make_scheduler"]


def make_scheduler(config: ModelConfig, instances: list[Any], stats: ModelStatistics) -> Any:
    multiplexed = multiplex_state(config, instances, stats)  # MAX_MULTIPLEXED_MODELS
    if multiplexed is not None:
        instances = multiplexed.instances  # they set up each stub's sub-model cache
    choice = config.WhichOneof("scheduling_choice")
    if choice == "dynamic_batching":
        return DynamicBatcher(instances, stats, config)
    if choice == "sequence_batching":
        return SequenceBatcher(instances, stats, config)
    if multiplexed is not None:
        return MultiplexScheduler(multiplexed, stats)
    return DefaultScheduler(instances, stats)
