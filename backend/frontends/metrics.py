"""`GET /metrics` on the metrics port: Prometheus text built from the core's statistics.

Counters per model and version, with Triton's names (PROTOCOL.md section 14).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["create_metrics_app", "render_metrics"]

_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     lambda s: s["inference_stats"]["fail"]["count"]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"]) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s["inference_stats"]["compute_output"]["ns"] // 1000),
)


def _labels(stats: dict[str, Any]) -> str:
    return f'model="{stats["name"]}",version="{stats["version"]}"'


def render_metrics(core: Any) -> str:
    """The Prometheus text exposition of the core's counters."""
    all_stats = core.statistics()
    lines: list[str] = []
    for name, help_text, value in _COUNTERS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} counter")
        for stats in all_stats:
            if name == "nv_inference_request_failure":
                lines.append(f'{name}{{{_labels(stats)},reason="BACKEND"}} {value(stats)}')
            else:
                lines.append(f"{name}{{{_labels(stats)}}} {value(stats)}")
    return "\n".join(lines) + "\n"


def create_metrics_app(core: Any) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render_metrics(core), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
