"""`GET /metrics` on the metrics port (docs/reference/protocol.md#metrics-endpoint): Prometheus text, exposition
format 0.0.4 (`pystub_backend.backend.telemetry.prometheus_text`), `text/plain; charset=utf-8`.

    nv_inference_* {model, version}          each loaded version's statistics (telemetry.statistics)
    nv_inference_*_summary_us                latency summaries with --metrics-config (telemetry.latency)
    nv_inference_*_histogram_us              latency histograms with histogram_latencies=true (same)
    nv_inference_request_failure {.., reason} REJECTED, CANCELED, BACKEND, OTHER
    nv_inference_pending_request_count       requests waiting in the version's scheduler queue
    pystub_inflight_requests                 queued + executing per version: the autoscaling signal
    nv_model_load_duration_secs              how long the version took to load
    nv_gpu_*, nv_energy_consumption {gpu_uuid} each visible GPU, polled (telemetry.gpu_metrics)
    nv_cpu_utilization, nv_cpu_memory_*      the machine, polled every --metrics-interval-ms
    nv_pinned_memory_pool_*                  always 0: pystub has no pinned-memory pool
    pystub_stub_* {model, version, instance} each stub: up, restarts, heartbeat age, RSS (polled),
                                             GPU memory ({..., gpu_uuid}, NVML's per-process figure),
                                             p2s arena bytes used/total, requests in flight,
                                             requests served/failed
    pystub_multiplexed_*                     model multiplexing (scheduling.multiplex)
    <custom families>                        pb_utils.MetricFamily from the models (features.custom_metrics)
    pystub_openai_*                          the OpenAI port per model: requests, failures, time to first
                                             token, inter-token latency (telemetry.token_latency)

Everything but the polled gauges is read at scrape time from memory: a scrape costs no system
call and no round trip to a stub, so it stays fast while the stubs are busy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import psutil
from aiohttp import web

from pystub_backend.backend.core import Core
from pystub_backend.backend.features.cache_metrics import write_cache_gauges, write_model_cache_families
from pystub_backend.backend.features.custom_metrics import KIND_NAMES, CustomMetrics, registry_for
from pystub_backend.backend.models.version import ModelVersion
from pystub_backend.backend.scheduling.multiplex import multiplex_metrics
from pystub_backend.backend.supervision.instance import ModelInstance
from pystub_backend.backend.telemetry import latency
from pystub_backend.backend.telemetry.gpu_metrics import GpuSampler
from pystub_backend.backend.telemetry.prometheus_text import TextWriter
from pystub_backend.backend.telemetry.statistics import FAILURE_REASONS, ModelStatistics
from pystub_backend.backend.telemetry.token_latency import token_metrics_for

__all__ = ["create_metrics_app", "render_metrics", "SystemPoller", "DEFAULT_INTERVAL_MS", "inflight_requests"]

log = logging.getLogger("pystub.metrics")

DEFAULT_INTERVAL_MS = 2000  # Triton's --metrics-interval-ms

_Getter = Callable[[ModelStatistics], int]
_SUCCESS = ("nv_inference_request_success", "Number of successful inference requests, all batch sizes")
_FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
_COUNTERS: tuple[tuple[str, str, _Getter], ...] = (  # after success and failure, in Triton's order
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached "
     "requests)", lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not "
     "include cached requests)", lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds "
     "(does not include cached requests)", lambda s: s.compute_output.ns // 1000),
)


class SystemPoller:
    """The gauges that cost system calls (CPU, memory, stub RSS), sampled every `interval_s` on a
    worker thread and read at scrape time."""

    def __init__(self, core: Core, interval_s: float, cpu_metrics: bool = True,
                 gpus: GpuSampler | None = None) -> None:
        self._core = core
        self.interval_s = interval_s
        self.cpu_metrics = cpu_metrics
        self.gpus = gpus  # None: --allow-gpu-metrics=false
        self.cpu_utilization = 0.0
        self.memory_total = 0
        self.memory_used = 0
        self.rss: dict[int, int] = {}
        self._processes: dict[int, psutil.Process] = {}

    async def run(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        while True:
            pids = [i.stub.pid for v in self._core.model_versions() for i in v.instances
                    if i.stub is not None and i.healthy and i.stub.pid is not None]
            try:
                await asyncio.to_thread(self.sample, pids)
            except Exception:  # a failed sample must not end polling
                log.exception("sampling the metrics gauges failed")
            await asyncio.sleep(self.interval_s)

    def sample(self, pids: list[int]) -> None:
        """Take one sample (worker thread; assignments are atomic for the loop's readers)."""
        if self.gpus is not None:
            self.gpus.sample()
        if self.cpu_metrics:
            self.cpu_utilization = psutil.cpu_percent(interval=None) / 100.0
            memory = psutil.virtual_memory()
            self.memory_total, self.memory_used = memory.total, memory.total - memory.available
        rss: dict[int, int] = {}
        for pid in pids:
            process = self._processes.get(pid)
            try:
                if process is None:
                    process = self._processes[pid] = psutil.Process(pid)
                rss[pid] = process.memory_info().rss
            except psutil.Error:
                self._processes.pop(pid, None)
        for gone in set(self._processes) - set(pids):
            del self._processes[gone]
        self.rss = rss


def _version_labels(version: ModelVersion) -> list[tuple[str, str]]:
    return [("model", version.name), ("version", str(version.version))]


def _per_version(writer: TextWriter, versions: list[ModelVersion], name: str, kind: str, help_text: str,
                 value: Callable[[ModelVersion], float | int | None]) -> None:
    """One family with a sample per version (none where `value` is None)."""
    writer.family(name, kind, help_text)
    for version in versions:
        found = value(version)
        if found is not None:
            writer.sample(name, _version_labels(version), found)


def _of_stats(getter: _Getter) -> Callable[[ModelVersion], int]:
    """`getter` applied to a version's statistics."""
    return lambda version: getter(version.stats)


def _inference_families(writer: TextWriter, versions: list[ModelVersion]) -> None:
    _per_version(writer, versions, _SUCCESS[0], "counter", _SUCCESS[1], lambda v: v.stats.success.count)
    writer.family(_FAILURE[0], "counter", _FAILURE[1])
    for version in versions:
        for reason in FAILURE_REASONS:  # every reason, zeros included, as Triton does
            writer.sample(_FAILURE[0], [*_version_labels(version), ("reason", reason)], version.stats.failures[reason])
    for name, help_text, getter in _COUNTERS:
        if not latency.config.counters and name.endswith("_duration_us"):
            continue  # --metrics-config counter_latencies=false
        _per_version(writer, versions, name, "counter", help_text, _of_stats(getter))
    write_model_cache_families(writer, versions)  # response cache hook: nv_cache_*_per_model, in Triton's place
    _per_version(writer, versions, "nv_inference_pending_request_count", "gauge",
                 "Instantaneous number of pending requests awaiting execution per-model.",
                 lambda v: v.scheduler.queued if v.scheduler is not None else 0)
    _per_version(writer, versions, "nv_model_load_duration_secs", "gauge", "Model load time in seconds",
                 lambda v: v.stats.load_duration_s)
    _per_version(writer, versions, "pystub_inflight_requests", "gauge",
                 "Requests of the model version queued in pystub or executing in its stubs (what to scale on)",
                 inflight_requests)


def inflight_requests(version: ModelVersion) -> int:
    """Queued in the version's scheduler plus sent to its stubs and not yet completed: the load
    that another replica would share. An ensemble counts its requests in its steps' models."""
    queued = version.scheduler.queued if version.scheduler is not None else 0
    return queued + sum(instance.stub.in_flight for instance in version.instances if instance.stub is not None)


def _pinned_memory_families(writer: TextWriter) -> None:
    # Triton exports its CUDA pinned-memory pool even without a GPU; pystub has no such pool (tensors
    # cross through shared-memory arenas), so both gauges are always 0.
    for name, help_text in (("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes"),
                            ("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes")):
        writer.family(name, "gauge", help_text)
        writer.sample(name, [], 0)


def _system_families(writer: TextWriter, poller: SystemPoller | None) -> None:
    if poller is None or not poller.cpu_metrics:
        return
    for name, help_text, value in (
            ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", float(poller.cpu_utilization)),
            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", poller.memory_total),
            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", poller.memory_used)):
        writer.family(name, "gauge", help_text)
        writer.sample(name, [], value)


def _stub_facts(instance: ModelInstance, poller: SystemPoller | None) -> dict[str, float | int]:
    """This instance's pystub_stub_* values; a fact that is unknown now (no healthy stub) is left out."""
    stub, healthy = instance.stub, instance.healthy
    facts: dict[str, float | int] = {"up": int(healthy), "restarts_total": instance.restarts,
                                     "in_flight": stub.in_flight if stub is not None else 0,
                                     "served_total": instance.served, "failed_total": instance.failed}
    if healthy and stub is not None:
        age = stub.control.heartbeat_age() if stub.control is not None else None
        if age is not None:
            facts["heartbeat_age_seconds"] = age
        if stub.p2s is not None:
            facts["arena_used_bytes"], facts["arena_total_bytes"] = stub.p2s.used, stub.p2s.total
        rss = poller.rss.get(stub.pid) if poller is not None and stub.pid is not None else None
        if rss is not None:
            facts["rss_bytes"] = rss
    return facts


_STUB_FAMILIES = (
    ("up", "gauge", "1 when the model instance's stub process is running and healthy, else 0"),
    ("restarts_total", "counter", "Times the model instance's stub process was restarted"),
    ("heartbeat_age_seconds", "gauge", "Seconds since the stub's last heartbeat"),
    ("rss_bytes", "gauge", "Resident memory of the stub process, in bytes (polled)"),
    ("arena_used_bytes", "gauge", "Bytes in use in the stub's request (p2s) shared-memory arena"),
    ("arena_total_bytes", "gauge", "Size of the stub's request (p2s) shared-memory arena, in bytes"),
    ("in_flight", "gauge", "Requests sent to the stub and not yet completed"),
    ("served_total", "counter", "Requests the model instance answered successfully"),
    ("failed_total", "counter", "Requests the model instance failed"),
)


def _stub_families(writer: TextWriter, versions: list[ModelVersion], poller: SystemPoller | None) -> None:
    rows = [(_version_labels(version) + [("instance", instance.name)], _stub_facts(instance, poller))
            for version in versions for instance in version.instances]
    for fact, kind, help_text in _STUB_FAMILIES:
        name = f"pystub_stub_{fact}"
        writer.family(name, kind, help_text)
        for labels, facts in rows:
            if fact in facts:
                writer.sample(name, labels, facts[fact])


def _custom_families(writer: TextWriter, registry: CustomMetrics) -> None:
    for family in registry.families():
        if not family.series:   # as prometheus-cpp (Triton) does: a family shows once it has a metric
            continue
        writer.family(family.name, KIND_NAMES[family.kind], family.description)
        for series in family.series.values():
            if series.buckets is None:
                writer.sample(family.name, series.labels, series.value)
            else:
                writer.histogram(family.name, series.labels, series.buckets, series.bucket_counts, series.total,
                                 series.count)


def render_metrics(core: Core, poller: SystemPoller | None = None) -> str:
    """The Prometheus text exposition of everything `/metrics` serves."""
    writer = TextWriter()
    versions = core.model_versions()
    _inference_families(writer, versions)
    _pinned_memory_families(writer)
    if poller is not None and poller.gpus is not None:
        poller.gpus.write(writer)
    _system_families(writer, poller)
    write_cache_gauges(writer, core.response_cache)  # response cache hook: nv_cache_util, ...
    windows = [(v.name, str(v.version), v.stats.latency) for v in versions if v.stats.latency is not None]
    writer.raw(latency.summary_lines(windows))
    writer.raw(latency.histogram_lines(windows))  # --metrics-config histogram_latencies=true
    _stub_families(writer, versions, poller)
    if poller is not None and poller.gpus is not None:  # pystub_stub_gpu_memory_bytes, per GPU
        poller.gpus.write_stub_memory(writer, [(_version_labels(v) + [("instance", i.name)], i.stub.pid)
                                               for v in versions for i in v.instances
                                               if i.stub is not None and i.healthy and i.stub.pid is not None])
    writer.raw(multiplex_metrics(core))  # pystub_multiplexed_* (pystub_backend.backend.scheduling.multiplex_stats)
    _custom_families(writer, registry_for(core))
    token_metrics = token_metrics_for(core)  # the OpenAI port's pystub_openai_*
    token_metrics.forget({version.name for version in versions})
    writer.raw(token_metrics.lines())
    return writer.text()


def create_metrics_app(core: Core, interval_ms: int = DEFAULT_INTERVAL_MS, cpu_metrics: bool = True,
                       gpus: GpuSampler | None = None) -> web.Application:
    """The metrics listener's app; its poller runs while the app does."""
    poller = SystemPoller(core, interval_ms / 1000.0, cpu_metrics, gpus)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render_metrics(core, poller), content_type="text/plain", charset="utf-8")

    async def polling(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.ensure_future(poller.run())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(polling)
    return app
