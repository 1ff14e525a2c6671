"""The admin endpoint behind `stubctl`: per-stub facts, read from the supervisor and the OS.

    GET  /v2/pystub/stubs                          -> {"stubs": [row, ...]}   (read-only; with a GPU a
                                                      row has each stub's device memory, from NVML)
    GET  /v2/pystub/build                          -> whether the hot path runs compiled (read-only)
    POST /v2/pystub/stubs/{model}/restart          restart every instance of the model
    POST /v2/pystub/stubs/{model}/{instance}/restart

Restarts change state: the HTTP frontend's access policy (frontends/access.py, group
"model-repository") decides who may call them, as for model load/unload. Anyone who can reach the
port can look.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pystub_backend._native_loader import STATE as NATIVE_STATE
from pystub_backend.backend.core import Core
from pystub_backend.backend.core.table import check_model_name
from pystub_backend.backend.errors import ServerError
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response, json_response
from pystub_backend.backend.frontends.http.router import Route, get, post
from pystub_backend.backend.models.version import ModelVersion
from pystub_backend.backend.scheduling.multiplex import held_ids
from pystub_backend.backend.supervision.instance import ModelInstance
from pystub_backend.backend.telemetry.process_cpu import ProcessSampler
from pystub_backend.devices import DeviceSystem

__all__ = ["stub_rows", "admin_routes"]


def _process_facts(pid: int | None, sampler: ProcessSampler) -> dict[str, Any]:
    found = sampler.sample(pid) if pid is not None else None
    if found is None:
        return {"rss_bytes": 0, "cpu_percent": 0.0}
    return {"rss_bytes": found.rss_bytes, "cpu_percent": found.cpu_percent}


def _gpu_facts(pid: int | None, gpu_memory: dict[int, dict[int, int]] | None) -> dict[str, Any]:
    """The stub's device memory on each GPU (NVML's per-process figures); None without a GPU."""
    if gpu_memory is None:
        return {"gpu_memory_bytes": None, "gpu_memory_by_device": {}}
    held = gpu_memory.get(pid, {}) if pid is not None else {}
    return {"gpu_memory_bytes": sum(held.values()),
            "gpu_memory_by_device": {str(device): size for device, size in sorted(held.items())}}


def _stub_row(model_version: ModelVersion, instance: ModelInstance, sampler: ProcessSampler,
              gpu_memory: dict[int, dict[int, int]] | None = None) -> dict[str, Any]:
    stub = instance.stub
    healthy = instance.healthy
    control = stub.control if stub is not None else None
    heartbeat_age = control.heartbeat_age() if control is not None and healthy else None
    p2s = stub.p2s if stub is not None and healthy else None
    row = {
        "model": model_version.name,
        "version": str(model_version.version),
        "instance": instance.name,
        "kind": instance.spec.args.get("model_instance_kind", "CPU"),
        "device_id": int(instance.spec.args.get("model_instance_device_id", "0")),  # the GPU of a GPU instance
        "pid": stub.pid if stub is not None else None,
        "state": instance.state.value,
        "healthy": healthy,
        "uptime_s": round(time.monotonic() - stub.started_at, 3) if stub is not None and healthy else 0.0,
        "heartbeat_age_s": None if heartbeat_age is None else round(heartbeat_age, 3),
        "restarts": instance.restarts,
        "in_flight": stub.in_flight if stub is not None else 0,
        "served": instance.served,
        "failed": instance.failed,
        "arena_used_bytes": p2s.used if p2s is not None else 0,
        "arena_total_bytes": p2s.total if p2s is not None else 0,
        "s2p_used_bytes": control.s2p_used if control is not None and healthy else 0,
        "s2p_total_bytes": control.s2p_total if control is not None and healthy else 0,
        "queue_depth": model_version.scheduler.queued if model_version.scheduler is not None else 0,
        "last_error": instance.last_error,
        "multiplexed_models": held_ids(instance),  # sub-model ids the stub holds, LRU first
    }
    row.update(_process_facts(row["pid"] if healthy else None, sampler))
    row.update(_gpu_facts(row["pid"] if healthy else None, gpu_memory))
    return row


def stub_rows(core: Core, sampler: ProcessSampler | None = None,
              gpu_memory: dict[int, dict[int, int]] | None = None) -> list[dict[str, Any]]:
    """One row per stub of every loaded model version. `sampler` keeps each stub's process across
    calls, so CPU% is measured since the previous call (without one: since the stub started).
    `gpu_memory` is DeviceSystem.process_memory() (None: no GPU), for each stub's device memory."""
    sampler = sampler or ProcessSampler()
    rows = [_stub_row(version, instance, sampler, gpu_memory) for version in core.model_versions()
            for instance in version.instances]
    sampler.forget_others({row["pid"] for row in rows if row["pid"] is not None})
    return rows


def _error(status: int, text: str) -> Response:
    return json_response({"error": text}, status=status)


async def _restart(core: Core, request: HttpRequest) -> Response:
    model = request.match_info["model"]
    wanted = request.match_info.get("instance")
    try:
        check_model_name(model)
    except ServerError as exc:
        return _error(400, exc.message)
    targets = [i for v in core.model_versions() if v.name == model for i in v.instances
               if wanted is None or i.name == wanted]
    if not targets:
        what = f"instance '{wanted}' of model '{model}'" if wanted else f"model '{model}'"
        return _error(404, f"no loaded {what}")
    try:
        await asyncio.gather(*(instance.restart() for instance in targets))
    except Exception as exc:  # the instance records it; the operator sees it here
        return _error(500, f"restart failed: {exc}")
    return json_response({"restarted": [instance.name for instance in targets]})


def admin_routes(core: Core, devices: DeviceSystem | None = None) -> list[Route]:
    """The routes; `devices` (the server's GPUs) gives each stub row its device memory."""
    sampler = ProcessSampler()  # lives as long as the routes: CPU% between two `stubctl` calls
    gpus = devices if devices is not None and devices.gpus() else None

    async def stubs(_: HttpRequest) -> Response:
        gpu_memory = await asyncio.to_thread(gpus.process_memory) if gpus is not None else None  # NVML blocks
        return json_response({"stubs": stub_rows(core, sampler, gpu_memory)})

    async def restart(request: HttpRequest) -> Response:
        return await _restart(core, request)

    async def build(_: HttpRequest) -> Response:
        return json_response(NATIVE_STATE.as_dict())

    return [get("/v2/pystub/stubs", stubs),
            get("/v2/pystub/build", build),
            post("/v2/pystub/stubs/{model}/restart", restart),
            post("/v2/pystub/stubs/{model}/{instance}/restart", restart)]
