"""The core process's side of `--frontend-workers N`: it starts, watches and stops the worker
processes and answers their core link. What runs inside a worker is `frontends/workers/`.

    serving.FrontendWorkers   what the server starts: the private sockets, the pool, the link server
    pool.WorkerPool           the worker processes: start (hello with a deadline), restart, stop
    core_side.LinkServer      the core's end of the core link: runs what the workers decoded

This package sits above `frontends/` (it serves the core's full HTTP and gRPC apps on private
sockets) and below the server that starts it.
"""

from __future__ import annotations

from pystub_backend.backend.worker_pool.pool import WorkerStartError
from pystub_backend.backend.worker_pool.serving import FrontendWorkers

__all__ = ["FrontendWorkers", "WorkerStartError"]
