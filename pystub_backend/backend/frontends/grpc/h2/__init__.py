"""The h2 gRPC stack: a gRPC server on libnghttp2 (ngh2, sans-I/O) on pystub's asyncio loop, hosting
the same grpc method handlers, servicers and grpc.aio interceptors as a grpc.aio server.

    server.py      H2Server: registration, interceptors, bind (TCP, unix, TLS), start, stop
    accept.py      accepting connections; a failed accept pauses accepting
    connection.py  one client connection: ngh2's events, in fair turns; flushing; the calls it carries
    call.py        one call's stream: responses out (backpressure), status, cancellation
    inbound.py     one call's requests in: flow control, the connection's memory budget, inflating,
                   the request-read timeout
    incidents.py   one rate-limited log line per misbehaving connection
    dispatch.py    runs a method handler and ends the call with its status
    context.py     the servicer context (what pystub uses of grpc.aio.ServicerContext)
    policy.py      keepalive, ping abuse, floods, idle/age and size limits from channel arguments;  timers.py
    wire.py        messages, metadata, grpc-timeout, status trailers, compression
"""

from pystub_backend.backend.frontends.grpc.h2.context import H2ServicerContext
from pystub_backend.backend.frontends.grpc.h2.policy import ConnectionPolicy
from pystub_backend.backend.frontends.grpc.h2.server import H2Server, tls_context

__all__ = ["H2Server", "H2ServicerContext", "ConnectionPolicy", "tls_context"]
