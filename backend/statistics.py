"""Per model-version inference statistics (PROTOCOL.md section 8).

`inference_count` counts batch elements, `execution_count` executions; durations accumulate as
`{count, ns}`. Successful requests add to queue and compute durations; failed ones only to `fail`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Duration", "ModelStatistics", "BatchTiming"]


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, ns)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchTiming:
    """Where one execution's time went, in nanoseconds."""

    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


@dataclass
class _BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStatistics:
    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self._batches: dict[int, _BatchStats] = {}

    def record_execution(self, batch_size: int, timing: BatchTiming) -> None:
        self.execution_count += 1
        stats = self._batches.setdefault(batch_size, _BatchStats())
        stats.compute_input.add(timing.compute_input_ns)
        stats.compute_infer.add(timing.compute_infer_ns)
        stats.compute_output.add(timing.compute_output_ns)

    def record_success(self, batch_size: int, total_ns: int, queue_ns: int, timing: BatchTiming) -> None:
        self.last_inference_ms = int(time.time() * 1000)
        self.inference_count += batch_size
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(timing.compute_input_ns)
        self.compute_infer.add(timing.compute_infer_ns)
        self.compute_output.add(timing.compute_output_ns)

    def record_failure(self, total_ns: int) -> None:
        self.last_inference_ms = int(time.time() * 1000)
        self.fail.add(total_ns)

    def as_dict(self) -> dict[str, Any]:
        empty = Duration().as_dict()
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(), "fail": self.fail.as_dict(), "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(), "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(), "cache_hit": empty, "cache_miss": empty,
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": s.compute_input.as_dict(),
                 "compute_infer": s.compute_infer.as_dict(), "compute_output": s.compute_output.as_dict()}
                for size, s in sorted(self._batches.items())
            ],
            "memory_usage": [],
        }
