"""Frontend worker processes (`--frontend-workers N`): protocol work leaves the core process.

    client ──TCP──▶ worker i (SO_REUSEPORT, N of them)
                      /infer, ModelInfer: decode ─▶ RemoteCore ─core link (unix, msgpack)─▶ core.infer
                      anything else: HTTP/gRPC proxy ──unix──▶ the core's full HTTP app / gRPC server

Modules: `link` (wire format), `core_side` (the link server in the core), `remote_core` (the
worker's stand-in for the core), `proxy_http`, `proxy_grpc`, `worker` (the worker's entry point),
`pool` (supervision), `serving` (what the core starts), `paths` (socket names).
"""

from __future__ import annotations

from pystub_backend.backend.frontends.workers.pool import WorkerStartError
from pystub_backend.backend.frontends.workers.serving import FrontendWorkers

__all__ = ["FrontendWorkers", "WorkerStartError"]
