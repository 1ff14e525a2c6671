"""The KServe v2 HTTP frontend: the inference port's own HTTP/1.1 server (`create_http_app` builds its
application), and what the aiohttp ports (metrics, OpenAI) share with it.

    listener.py     the asyncio server;  connection.py  one connection: httptools parsing, requests
                    in order, read deadlines, keep-alive
    messages.py     the request a handler reads and the response it answers
    app.py          the application: routing (router.py), restrictions (restrict.py), errors
    server.py       the routes: inference, metadata, config, statistics, health
    codec.py        JSON + binary inference bodies, both ways (json_tensors.py: JSON documents
                    and tensor data);  raw.py  raw binary requests;  compression.py  gzip/deflate
    generate.py     /generate and /generate_stream (generate_request.py: Triton's document rules)
    control.py      model control and logging;  shm.py  the shared memory extensions
    trace_routes.py the trace extension;  request_link.py  a request's client link for the others
    json_body.py    the one JSON body parser (depth-bounded, 400 on failure)
    timeouts.py     the aiohttp ports' read deadlines;  client_errors.py, access_log.py  their logs
"""

from pystub_backend.backend.frontends.http.restrict import path_group
from pystub_backend.backend.frontends.http.server import create_http_app

__all__ = ["create_http_app", "path_group"]
