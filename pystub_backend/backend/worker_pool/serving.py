"""`FrontendWorkers`: what the core runs when `--frontend-workers N` is set (N >= 1).

    private directory (0700)      core.sock   the core link server (core_side.py)
                                  http.sock   the core's full HTTP app, INTERNAL_PEER trusted
                                  grpc.sock   the core's full gRPC server, INTERNAL_PEER trusted
    public HTTP and gRPC ports    N worker processes (worker.py, supervised by pool.py), SO_REUSEPORT

Port 0 is resolved here first: a socket bound with SO_REUSEPORT (never listening, so it gets no
connections) holds the port until every worker has bound it; `start` then returns the ports, for
the server's "Started ..." lines. `stop` stops the workers first (they finish their
in-flight requests through the core), then the private listeners, then removes the directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from pystub_backend.backend.frontends.grpc.listener import GrpcListener, create_grpc_listener
from pystub_backend.backend.frontends.http.app import HttpApp
from pystub_backend.backend.frontends.http.connection import ReadTimeouts
from pystub_backend.backend.frontends.http.listener import HttpListener
from pystub_backend.backend.frontends.workers.paths import CORE_SOCKET, DIRECTORY_PREFIX, GRPC_SOCKET, HTTP_SOCKET
from pystub_backend.backend.inference import FrontendCore
from pystub_backend.backend.options import ServerOptions
from pystub_backend.backend.telemetry.tracing import Tracer
from pystub_backend.backend.worker_pool.core_side import LinkServer
from pystub_backend.backend.worker_pool.pool import WorkerPool
from pystub_backend.ipc.names import pid_alive

__all__ = ["FrontendWorkers"]

log = logging.getLogger("pystub.server")
_START_SECONDS = 60.0


def _reserve(address: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket holding address:port (0: a free port)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((address.strip("[]"), port))
    except OSError:
        holder.close()
        raise
    return holder


def sweep_stale_directories() -> list[Path]:
    """Remove the private directories (ours: same uid) of servers that died without cleaning up."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{DIRECTORY_PREFIX}*-*"):
        owner = path.name[len(DIRECTORY_PREFIX):].split("-", 1)[0]
        try:
            mine = path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and owner.isdigit() and not pid_alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class FrontendWorkers:
    """The private listeners, the core link and the worker pool of one server."""

    def __init__(self, core: FrontendCore, tracer: Tracer, options: ServerOptions) -> None:
        self._core = core
        self._tracer = tracer
        self._options = options
        for stale in sweep_stale_directories():
            log.info("removed the frontend-worker directory %s of a dead server", stale)
        self._directory = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))  # mode 0700
        self._link = LinkServer(core, tracer, str(self._directory / CORE_SOCKET), self._serving)
        self._http: HttpListener | None = None
        self._grpc: GrpcListener | None = None
        self._pool: WorkerPool | None = None

    def _serving(self, index: int, pid: int) -> None:
        if self._pool is not None:
            self._pool.serving(index, pid)

    @property
    def pids(self) -> dict[int, int]:
        return self._pool.pids if self._pool is not None else {}

    async def start(self, http_app: HttpApp) -> tuple[int, int]:
        """Open the private listeners, start the workers, wait until they all listen; the public
        (HTTP, gRPC) ports they listen on (0 for a protocol that is off).

        Raises OSError (a port or socket cannot be bound) or WorkerStartError."""
        options = self._options
        await self._link.start()
        await self._start_http(http_app)
        if options.allow_grpc:
            internal = replace(options.grpc, tls=None, reuse_port=False, trust_internal_peer=True)
            self._grpc = create_grpc_listener(self._core, f"unix:{self._directory / GRPC_SOCKET}", 0, internal,
                                              self._tracer)
            await self._grpc.start()
        holders = [_reserve(options.http_address, options.http_port) if options.allow_http else None,
                   _reserve(options.grpc_address, options.grpc_port) if options.allow_grpc else None]
        try:
            ports = [holder.getsockname()[1] if holder is not None else 0 for holder in holders]
            self._pool = WorkerPool(options.frontend_workers, lambda index: self._command(index, *ports),
                                    options.settings.exit_timeout_seconds, options.settings)
            await self._pool.start(_START_SECONDS)
        finally:
            for holder in holders:
                if holder is not None:
                    holder.close()
        log.info("%d frontend workers serve the public ports: pids %s", options.frontend_workers,
                 sorted(self._pool.pids.values()))
        return ports[0], ports[1]

    async def _start_http(self, app: HttpApp) -> None:
        options = self._options
        timeouts = ReadTimeouts(options.http_header_timeout_secs, options.http_body_timeout_secs)
        self._http = HttpListener(app, timeouts)
        await self._http.start_unix(str(self._directory / HTTP_SOCKET))

    def _command(self, index: int, http_port: int, grpc_port: int) -> list[str]:
        return [sys.executable, "-m", "pystub_backend.backend.frontends.workers.worker",
                "--directory", str(self._directory), "--index", str(index), "--",
                *self._options.argv, "--http-port", str(http_port), "--grpc-port", str(grpc_port)]

    async def stop(self) -> None:
        """Workers first (they finish in-flight requests), then the private listeners; idempotent."""
        try:
            if self._grpc is not None:  # health watchers hear NOT_SERVING through the workers while they still run
                self._grpc.health.close()
                await self._grpc.health.watchers_told(min(self._options.settings.exit_timeout_seconds, 2.0))
            if self._pool is not None:
                await self._pool.stop()
            if self._grpc is not None:
                await self._grpc.stop(self._options.settings.exit_timeout_seconds)
                self._grpc = None
            if self._http is not None:
                await self._http.stop(self._options.settings.exit_timeout_seconds)
                self._http = None
            await self._link.stop()
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)
