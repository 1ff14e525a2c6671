"""Protocol frontends: the listeners that translate the wire into `pystub_backend.backend.inference`.

    http/      KServe v2 over HTTP (a server of its own, on httptools): inference, generate, model
               control, shared memory
    grpc/      KServe v2 over gRPC (pystub's h2 stack, or grpc.aio), with grpc.health.v1 and reflection
    heap_trim.py  a closed connection that carried much gives the freed heap back (both protocols)
    forwarding.py --http/grpc-header-forward-pattern: matching headers become request parameters
    openai/    the OpenAI-compatible API on --openai-port (aiohttp): completions, chat, embeddings
    metrics.py Prometheus text on the metrics port
    admin.py   pystub's admin endpoint behind `stubctl` (/v2/pystub/stubs, group "model-repository")

Names load on first use: the HTTP side does not import grpc, nor the reverse.
"""

from __future__ import annotations

import importlib

__all__ = ["create_http_app", "create_grpc_listener", "GrpcListener", "create_metrics_app", "admin_routes",
           "create_openai_app"]

_HOMES = {"create_http_app": "http.server", "create_grpc_listener": "grpc.listener", "GrpcListener": "grpc.listener",
          "create_metrics_app": "metrics", "admin_routes": "admin", "create_openai_app": "openai.server"}


def __getattr__(name: str) -> object:
    """The public names, imported from their modules when first asked for (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
