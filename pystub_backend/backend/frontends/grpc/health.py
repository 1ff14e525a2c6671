"""`grpc.health.v1.Health`: SERVING while the server is ready, NOT_SERVING otherwise (as Triton).

`Check` reads the core's readiness when asked, whatever service is named: tritonserver 2.51
answers every name with the server's status, and so does pystub. (Triton 2.51 answers `Watch`
with UNIMPLEMENTED; pystub implements it.) `Watch` sends the current status, then each change;
it samples readiness every `_WATCH_PERIOD` seconds rather than being told, because readiness is
derived from many model states and no single place sets it. At shutdown (`close()`) every watcher
gets NOT_SERVING and its stream ends, so open watches do not hold the server's stop grace period.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pystub_backend.backend.inference import FrontendCore

__all__ = ["HealthService", "SERVICE_NAME"]

SERVICE_NAME = "grpc.health.v1.Health"
_WATCH_PERIOD = 0.2
_Status = int  # a health_pb2.HealthCheckResponse.ServingStatus value


class HealthService(health_pb2_grpc.HealthServicer):
    def __init__(self, core: FrontendCore) -> None:
        self._core = core
        self._closed = asyncio.Event()
        self._watchers = 0
        self._no_watchers = asyncio.Event()
        self._no_watchers.set()

    def _status(self) -> _Status:
        if self._closed.is_set() or not self._core.is_ready():
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self._status())

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> None:
        self._watchers += 1
        self._no_watchers.clear()
        try:
            await self._watch(context)
        finally:
            self._watchers -= 1
            if self._watchers == 0:
                self._no_watchers.set()

    async def _watch(self, context: grpc.aio.ServicerContext) -> None:
        last: _Status | None = None
        while True:
            status = self._status()
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if self._closed.is_set():
                return
            try:
                await asyncio.wait_for(self._closed.wait(), _WATCH_PERIOD)
            except asyncio.TimeoutError:
                pass

    def close(self) -> None:
        """Shutdown: NOT_SERVING from now on, and open watches end after saying so."""
        self._closed.set()

    async def watchers_told(self, timeout: float) -> None:
        """After `close()`: wait (at most `timeout` s) until every open watch has written its
        NOT_SERVING and ended, so stopping the server cannot cut that last message off."""
        try:
            await asyncio.wait_for(self._no_watchers.wait(), timeout)
        except asyncio.TimeoutError:
            pass  # a watcher that cannot be written to (a stalled client) does not hold the stop
