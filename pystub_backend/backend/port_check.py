"""Busy ports found before any model loads.

Triton (and pystub before this check) opens its listeners after the repository has loaded, so a
port another process holds was reported only after every model's `initialize` had run: minutes
for a big repository. `busy_listeners` binds a throw-away socket to each enabled listener's
address and port (the same SO_REUSEADDR / SO_REUSEPORT the listener itself will use) and closes it
at once; the real bind after loading still reports the rare port taken in between.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from pystub_backend.backend.options import ServerOptions

__all__ = ["Endpoint", "enabled_endpoints", "busy_listeners"]


@dataclass(frozen=True)
class Endpoint:
    label: str  # "HTTP", "gRPC", "metrics", "OpenAI"
    address: str
    port: int
    reuse_port: bool


def enabled_endpoints(options: ServerOptions) -> list[Endpoint]:
    """The listeners the options enable, with a fixed port (port 0 picks a free one: never busy)."""
    candidates = (
        (options.allow_http, Endpoint("HTTP", options.http_address, options.http_port, options.reuse_http_port)),
        (options.allow_grpc, Endpoint("gRPC", options.grpc_address, options.grpc_port, options.grpc.reuse_port)),
        (options.allow_metrics, Endpoint("metrics", options.metrics_address, options.metrics_port, False)),
        (options.openai.port is not None,
         Endpoint("OpenAI", options.openai.address, options.openai.port or 0, False)),
    )
    return [endpoint for enabled, endpoint in candidates if enabled and endpoint.port != 0]


def _bind_error(endpoint: Endpoint) -> OSError | None:
    """Why `endpoint` cannot be bound now, or None. Raises nothing."""
    try:
        infos = socket.getaddrinfo(endpoint.address, endpoint.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp and grpc bind
        if endpoint.reuse_port and hasattr(socket, "SO_REUSEPORT"):
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc
    return None


def busy_listeners(options: ServerOptions) -> list[str]:
    """One message per enabled listener whose address and port cannot be bound now."""
    problems = []
    for endpoint in enabled_endpoints(options):
        error = _bind_error(endpoint)
        if error is not None:
            problems.append(f"{endpoint.label} port {endpoint.address}:{endpoint.port} cannot be bound: "
                            f"{error.strerror or error}")
    return problems
