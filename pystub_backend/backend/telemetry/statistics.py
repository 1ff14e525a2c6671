"""Per model-version inference statistics (docs/reference/protocol.md#statistics-extension) and the counters `/metrics`
derives from them (section 14).

What is counted where, as Triton does:
- an execution (`record_execution`): `execution_count` += 1 and one batch_stats entry of its size
  (the sum of the batch sizes of the requests the model's `execute` received);
- a request the model answered: `inference_count` += its batch size (every success; a failure
  only when `record_failure` is told so). As in Triton 2.51, an error response the model returned
  counts; a request whose `execute` raised (the whole batch fails) or whose stub died does not (a
  model that raises for 3 of 10 requests: inference_count 7, execution_count 10);
- a request that succeeds (`record_success`): `success` (request duration), `queue` (enqueue to
  execution start: the send to the stub, plus what it then waited in the stub's queue) and the
  batch's compute_input/compute_infer/compute_output durations;
- a request that fails (`record_failure`): `fail` (its duration so far) and one failure of its
  `reason`: REJECTED (validation, full queue, queue timeout), CANCELED (cancelled by the client),
  BACKEND (the model or its stub failed it), OTHER (anything else, e.g. unloading with queued work).
- `last_inference` (ms since the epoch) is the end of the last request, successful or not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pystub_backend.backend.telemetry.latency import new_window
from pystub_backend.ipc.status import Status

if TYPE_CHECKING:
    from pystub_backend.backend.errors import ServerError

__all__ = ["Duration", "ModelStatistics", "BatchTiming", "FAILURE_REASONS", "REJECTED", "CANCELED",
           "BACKEND", "OTHER", "reason_for"]

REJECTED = "REJECTED"
CANCELED = "CANCELED"
BACKEND = "BACKEND"
OTHER = "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        if ns > 0:  # a clock step can make a span negative: it counts as 0
            self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchTiming:
    """Where one execution's time went, in nanoseconds."""

    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # Of the span from the send to the stub to EXECUTE_DONE, the part the batch waited in the
    # stub's queue behind earlier batches (an instance with several slots): queue time, as in
    # Triton, whose instance takes one batch at a time and keeps the rest in its queue.
    queued_in_stub_ns: int = 0


@dataclass
class _BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


def _add3(compute_input: Duration, compute_infer: Duration, compute_output: Duration, timing: BatchTiming) -> None:
    """One batch's three compute durations, added in one call (two per request on the hot path)."""
    compute_input.count += 1
    compute_infer.count += 1
    compute_output.count += 1
    if timing.compute_input_ns > 0:  # a clock step can make a span negative: it counts as 0
        compute_input.ns += timing.compute_input_ns
    if timing.compute_infer_ns > 0:
        compute_infer.ns += timing.compute_infer_ns
    if timing.compute_output_ns > 0:
        compute_output.ns += timing.compute_output_ns


def reason_for(error: ServerError | None, cancelled: bool = False) -> str:
    """The failure reason of a request that ended with `error` after it reached the model:
    CANCELED when it was answered as cancelled or cancelled by its client, else BACKEND."""
    return CANCELED if cancelled or (error is not None and error.status == Status.CANCELLED) else BACKEND


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
        self.cache_hit = Duration()  # the response cache (pystub_backend.backend.features.response_cache)
        self.cache_miss = Duration()
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self._batches: dict[int, _BatchStats] = {}
        self._created = time.monotonic()
        self.load_duration_s: float | None = None  # set by loaded()
        self.latency = new_window()  # --metrics-config summary_latencies (telemetry.latency)

    def loaded(self) -> None:
        """The version finished loading: its load duration is the time since these statistics
        were created (with the version, before its stubs started)."""
        if self.load_duration_s is None:
            self.load_duration_s = time.monotonic() - self._created

    def record_execution(self, batch_size: int, timing: BatchTiming) -> None:
        self.execution_count += 1
        stats = self._batches.get(batch_size)
        if stats is None:
            stats = self._batches[batch_size] = _BatchStats()
        _add3(stats.compute_input, stats.compute_infer, stats.compute_output, timing)

    def record_executed_success(self, batch_size: int, total_ns: int, queue_ns: int, timing: BatchTiming) -> None:
        """`record_execution` and `record_success` of a request that ran alone and succeeded (the
        default scheduler's usual request: one call where there were two)."""
        self.record_execution(batch_size, timing)
        self.record_success(batch_size, total_ns, queue_ns, timing)

    def record_success(self, batch_size: int, total_ns: int, queue_ns: int, timing: BatchTiming) -> None:
        """One request of `batch_size` that succeeded (and so is an inference)."""
        self.inference_count += batch_size
        self.last_inference_ms = int(time.time() * 1000)
        self.success.add(total_ns)
        queue_ns += timing.queued_in_stub_ns
        self.queue.add(queue_ns)
        _add3(self.compute_input, self.compute_infer, self.compute_output, timing)
        if self.latency is not None:
            self.latency.observe(request=total_ns, queue=queue_ns, compute_input=timing.compute_input_ns,
                                 compute_infer=timing.compute_infer_ns, compute_output=timing.compute_output_ns)

    def record_failure(self, total_ns: int, reason: str = BACKEND, inferences: int = 0) -> None:
        """One failed request; `inferences`: its batch size when the model answered it (an error
        response). Raises ValueError for a reason not in FAILURE_REASONS."""
        if reason not in self.failures:
            raise ValueError(f"unknown failure reason {reason!r}; expected one of {FAILURE_REASONS}")
        self.inference_count += inferences
        self.last_inference_ms = int(time.time() * 1000)
        self.fail.add(total_ns)
        self.failures[reason] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(), "fail": self.fail.as_dict(), "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(), "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(), "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, "compute_input": s.compute_input.as_dict(),
                 "compute_infer": s.compute_infer.as_dict(), "compute_output": s.compute_output.as_dict()}
                for size, s in sorted(self._batches.items())
            ],
            "memory_usage": [],
        }
