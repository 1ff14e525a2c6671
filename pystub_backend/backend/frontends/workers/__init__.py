"""What runs in a frontend worker process (`--frontend-workers N`): protocol work leaves the core.

    client ──TCP──▶ worker i (SO_REUSEPORT, N of them)
                      /infer, ModelInfer: decode ─▶ RemoteCore ─core link (unix)─▶ core.infer
                      anything else: HTTP/gRPC proxy ──unix──▶ the core's full HTTP app / gRPC server

Modules: `worker` (the worker's entry point), `remote_core` (the worker's stand-in for the core),
`proxy_http`, `proxy_grpc`, and what both ends share: `link` (the core link's records and framing)
and `paths` (socket names). The core's side (starting, watching and answering the workers) is
`pystub_backend.backend.worker_pool`.
"""

__all__ = ["link", "paths", "proxy_grpc", "proxy_http", "remote_core", "worker"]
