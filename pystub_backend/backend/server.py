"""Running the server: check the ports are free, load the repository, open the listeners, wait for
a signal, shut down.

Shutdown (SIGINT/SIGTERM): stop accepting, let in-flight requests finish (bounded by
`--exit-timeout-secs`), finalize and stop every stub, unlink every shm object, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pystub_backend._native_loader import STATE as NATIVE_STATE
from pystub_backend.backend.core import Core, CoreOptions
from pystub_backend.backend.features.response_cache import CacheConfigError
from pystub_backend.backend.frontends.http.access_log import HttpAccessLogger
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.http.timeouts import ReadTimeouts, TimedAppRunner
from pystub_backend.backend.models.overrides import sweep_stale_override_dirs
from pystub_backend.backend.models.repository import RepositoryError
from pystub_backend.backend.options import GrpcOptions, ServerOptions
from pystub_backend.backend.port_check import busy_listeners
from pystub_backend.backend.telemetry.gpu_metrics import GpuSampler
from pystub_backend.backend.telemetry.tracing import Tracer
from pystub_backend.backend.worker_pool.pool import WorkerStartError
from pystub_backend.devices import DeviceSystem, discover
from pystub_backend.ipc.isolation import forbid_inspection
from pystub_backend.ipc.names import sweep_stale

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.http.app import HttpApp
    from pystub_backend.backend.frontends.openai import OpenAIServing

__all__ = ["serve", "Listeners"]

log = logging.getLogger("pystub.server")


class Listeners:
    """The HTTP, gRPC and metrics endpoints; each one optional."""

    def __init__(self) -> None:
        self._stoppers: list[Callable[[], Awaitable[Any]]] = []

    async def start_inference_http(self, app: HttpApp, address: str, port: int, grace: float = 60.0,
                                   reuse_port: bool = False, read_timeouts: ReadTimeouts | None = None) -> int:
        """The inference port (frontends/http/listener.py); `grace` bounds how long stopping waits
        for requests in progress. The bound port."""
        listener = HttpListener(app, read_timeouts)
        bound = await listener.start_tcp(address, port, reuse_port=reuse_port)  # --reuse-http-port
        self._stoppers.append(lambda: listener.stop(grace))
        log.info("Started HTTPService at %s:%d", address, bound)
        return bound

    async def start_http(self, app: web.Application, address: str, port: int, label: str,
                         grace: float = 60.0, reuse_port: bool = False,
                         read_timeouts: ReadTimeouts | None = None) -> int:
        """An aiohttp application's port (metrics, OpenAI). The bound port."""
        # `grace` bounds how long stopping waits for running handlers (aiohttp's default is 60 s,
        # whatever --exit-timeout-secs says).
        # The access logger checks --log-verbose per request (frontends.http.access_log).
        runner = TimedAppRunner(app, read_timeouts=read_timeouts or ReadTimeouts(), access_log=log,
                                access_log_class=HttpAccessLogger, handle_signals=False, shutdown_timeout=grace)
        await runner.setup()
        # reuse_port (SO_REUSEPORT) lets several servers share the port: --reuse-http-port.
        site = web.TCPSite(runner, address, port, reuse_address=True, reuse_port=reuse_port or None)
        await site.start()
        self._stoppers.append(runner.cleanup)
        bound = runner.addresses[0][1]
        log.info("Started %s at %s:%d", label, address, bound)
        return bound

    async def start_grpc(self, core: Core, address: str, port: int, grace: float,
                         options: GrpcOptions | None = None) -> int:
        from pystub_backend.backend.frontends.grpc.listener import create_grpc_listener
        listener = create_grpc_listener(core, address, port, options, core.tracer)
        await listener.start()
        self._stoppers.append(lambda: listener.stop(grace))
        log.info("Started GRPCInferenceService at %s:%d", address, listener.port)
        return listener.port

    def add_stopper(self, stop: Callable[[], Awaitable[Any]]) -> None:
        """Run `stop` at shutdown (in reverse order of adding)."""
        self._stoppers.append(stop)

    async def stop(self) -> None:
        for stop in reversed(self._stoppers):
            try:
                await stop()
            except Exception:  # a listener that fails to close must not keep stubs alive
                log.exception("error while closing a listener")
        self._stoppers.clear()


async def _open_listeners(core: Core, options: ServerOptions, listeners: Listeners, devices: DeviceSystem,
                          openai: OpenAIServing | None = None) -> None:
    from pystub_backend.backend.frontends.admin import admin_routes
    from pystub_backend.backend.frontends.http.server import create_http_app
    from pystub_backend.backend.frontends.metrics import create_metrics_app
    read_timeouts = ReadTimeouts(options.http_header_timeout_secs, options.http_body_timeout_secs)
    if options.frontend_workers:  # workers serve the public ports; the core keeps the metrics port
        await _start_frontend_workers(core, options, listeners, devices)
    if options.allow_grpc and not options.frontend_workers:
        await listeners.start_grpc(core, options.grpc_address, options.grpc_port, options.settings.exit_timeout_seconds,
                                   options.grpc)
    if options.allow_http and not options.frontend_workers:
        app = create_http_app(core, max_input_size=options.http_max_input_size,
                              restrictions=options.http_restrictions,
                              header_forward_pattern=options.http_header_forward_pattern,
                              remote_control=options.remote_control, tracer=core.tracer)
        app.add_routes(admin_routes(core, devices))
        await listeners.start_inference_http(app, options.http_address, options.http_port,
                                             options.settings.exit_timeout_seconds, options.reuse_http_port,
                                             read_timeouts)
    if options.allow_metrics:
        gpus = GpuSampler(devices) if options.allow_gpu_metrics and devices.gpus() else None
        metrics_app = create_metrics_app(core, options.metrics_interval_ms, options.allow_cpu_metrics, gpus)
        await listeners.start_http(metrics_app, options.metrics_address, options.metrics_port, "Metrics Service",
                                   options.settings.exit_timeout_seconds, read_timeouts=read_timeouts)
    if openai is not None and options.openai.port is not None:  # the core serves it, with or without workers
        from pystub_backend.backend.frontends.openai import create_openai_app
        openai_app = create_openai_app(core, openai, max_input_size=options.http_max_input_size,
                                       restrictions=options.http_restrictions, tracer=core.tracer)
        await listeners.start_http(openai_app, options.openai.address, options.openai.port, "OpenAIService",
                                   options.settings.exit_timeout_seconds, read_timeouts=read_timeouts)


async def _start_frontend_workers(core: Core, options: ServerOptions, listeners: Listeners,
                                  devices: DeviceSystem) -> None:
    """The core's full apps on private sockets, and the workers on the public ports."""
    from pystub_backend.backend.frontends.admin import admin_routes
    from pystub_backend.backend.frontends.http.server import create_http_app
    from pystub_backend.backend.worker_pool import FrontendWorkers
    app = create_http_app(core, max_input_size=options.http_max_input_size, restrictions=options.http_restrictions,
                          header_forward_pattern=options.http_header_forward_pattern,
                          remote_control=options.remote_control, tracer=core.tracer, trust_internal_peer=True)
    app.add_routes(admin_routes(core, devices))
    workers = FrontendWorkers(core, core.tracer, options)
    listeners.add_stopper(workers.stop)  # before start: a failed start still cleans up
    http_port, grpc_port = await workers.start(app)
    if options.allow_grpc:
        log.info("Started GRPCInferenceService at %s:%d", options.grpc_address, grpc_port)
    if options.allow_http:
        log.info("Started HTTPService at %s:%d", options.http_address, http_port)


def _core(options: ServerOptions) -> Core:
    """Raises CacheConfigError for a --cache-config pystub cannot honour."""
    return Core(CoreOptions(
        repositories=options.repositories, settings=options.settings, auto_complete=options.auto_complete,
        strict_readiness=options.strict_readiness, server_id=options.server_id,
        model_control_mode=options.model_control_mode, startup_models=options.load_models,
        poll_seconds=options.repository_poll_secs, allow_client_shm=options.allow_client_shm,
        load_thread_count=options.model_load_thread_count, load_retry_count=options.model_load_retry_count,
        backend_directory=options.backend_directory, model_config_name=options.model_config_name,
        # response cache and rate limiter hook
        cache_config=options.cache_config, rate_limit=options.rate_limit,
        rate_limit_resources=options.rate_limit_resources))


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # The handler only records the signal; the main coroutine acts on it.
        loop.add_signal_handler(sig, stop.set)


def _preflight(options: ServerOptions) -> tuple[list[str], OpenAIServing | None]:
    """What keeps the listeners from starting (busy ports, a chat template or tokenizer that cannot
    load), and what the OpenAI port is set up with."""
    problems = busy_listeners(options)
    if options.openai.port is None:
        return problems, None
    from pystub_backend.backend.frontends.openai import OpenAISetupError, load_openai_serving
    try:
        return problems, load_openai_serving(options.openai)
    except OpenAISetupError as exc:
        return [*problems, str(exc)], None


async def serve(options: ServerOptions) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit status."""
    busy, openai = _preflight(options)
    if busy:  # before any model loads: an operator should not wait for every initialize to learn it
        for problem in busy:
            log.error("failed to start a listener: %s", problem)
        return 1
    _log_native_state()
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    forbid_inspection()  # models (same uid) cannot read the arenas through /proc/<backend pid>
    removed = sweep_stale(options.settings.shm_prefix)
    if removed:
        log.info("removed %d stale shared memory objects of dead processes", len(removed))
    for path in sweep_stale_override_dirs():
        log.info("removed stale model override directory %s", path)
    devices = _discover_gpus(options)
    try:
        return await _serve_with(options, devices, stop, openai)
    finally:
        devices.close()


def _log_native_state() -> None:
    """Say whether the hot path runs compiled: a compiled module older than its source is a warning."""
    state = NATIVE_STATE
    if state.stale:
        log.warning("hot path: %s; stale: %s", state.reason, ", ".join(state.stale))
    else:
        log.info("hot path: %s (%s)", state.mode, state.reason)


def _discover_gpus(options: ServerOptions) -> DeviceSystem:
    """The visible GPUs (NVML; none without the `gpu` extra or a driver): where instances may run."""
    devices = discover(os.environ)
    options.settings.gpus = tuple(gpu.device_id for gpu in devices.gpus())
    for gpu in devices.gpus():
        log.info("GPU %d: %s (%s)", gpu.device_id, gpu.name, gpu.uuid)
    return devices


async def _serve_with(options: ServerOptions, devices: DeviceSystem, stop: asyncio.Event,
                      openai: OpenAIServing | None) -> int:
    try:
        core = _core(options)
    except CacheConfigError as exc:  # response cache hook: Triton fails at start-up too
        log.error("%s", exc)
        return 1
    core.tracer = Tracer.from_config(options.trace)  # tracing hook
    listeners = Listeners()
    try:
        try:
            failed = await core.load_repository()
        except RepositoryError as exc:
            log.error("%s", exc)
            return 1
        if failed and options.exit_on_error:
            log.error("failed to load %s; exiting (use --exit-on-error=false to serve the other models)",
                      ", ".join(repr(name) for name in failed))
            return 1
        try:
            await _open_listeners(core, options, listeners, devices, openai)
        except (OSError, WorkerStartError) as exc:
            log.error("failed to start a listener: %s", exc)
            return 1
        await stop.wait()
        log.info("shutting down")
        return 0
    finally:
        core.begin_shutdown()
        await listeners.stop()
        await core.unload_all()
        log.info("all stubs stopped")
        await asyncio.get_running_loop().run_in_executor(None, core.tracer.shutdown)  # flush the last spans
