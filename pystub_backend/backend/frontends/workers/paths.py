"""The names of the sockets in the server's private frontend-worker directory (mode 0700)."""

from __future__ import annotations

__all__ = ["CORE_SOCKET", "HTTP_SOCKET", "GRPC_SOCKET", "DIRECTORY_PREFIX"]

DIRECTORY_PREFIX = "pystub-frontend-"
CORE_SOCKET = "core.sock"  # the core link (link.py)
HTTP_SOCKET = "http.sock"  # the core's full HTTP application, for the HTTP proxy
GRPC_SOCKET = "grpc.sock"  # the core's full gRPC server, for the gRPC proxy
