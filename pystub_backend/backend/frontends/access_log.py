"""One access line per request at `--log-verbose 1` (a pystub extension; Triton has none):

    I1124 23:40:01.123456 4242 access_log.py:61] HTTP POST /v2/models/add_sub/infer 200 0.412 ms peer=127.0.0.1
    I1124 23:40:01.223456 4242 access_log.py:61] gRPC ModelInfer add_sub OK 0.388 ms peer=ipv4:127.0.0.1:50112

With `--log-format json` the same facts are keys (`method`, `path`, `model`, `request_id`,
`status`, `duration_ms`, `peer`). What the client sent (path, model name, request id) is escaped
by the log's formatters like every message (backend.log).

Cheap when off: the HTTP logger (http/access.py) returns after one integer comparison, and the
gRPC interceptor (grpc/access.py) hands the call straight on without wrapping its handler. The
level is read per request, so a change through the logging extension applies to the next request.
"""

from __future__ import annotations

import logging

__all__ = ["access_line"]

log = logging.getLogger("pystub.access")


def access_line(kind: str, what: str, status: str, seconds: float, peer: str, model: str, request_id: str) -> None:
    """Log one request: `kind` "HTTP" or "gRPC", `what` its method and path or its gRPC method."""
    extra: dict[str, object] = {"method": what, "status": status, "duration_ms": round(seconds * 1000, 3),
                                "peer": peer}
    if model:
        extra["model"] = model
    if request_id:
        extra["request_id"] = request_id
    text = f"{kind} {what}{' ' + model if model and kind == 'gRPC' else ''} {status} {seconds * 1000:.3f} ms"
    if request_id:
        text += f" id={request_id}"
    log.info("%s peer=%s", text, peer, extra=extra)
