"""The KServe v2 HTTP frontend: `create_http_app` builds the aiohttp application.

    server.py       routes, error middleware, body reading (--http-max-input-size: the JSON part)
    codec.py        JSON + binary request bodies;  raw.py  raw binary requests
    encode.py       responses;  compression.py  gzip/deflate both ways
    generate.py     /generate and /generate_stream (generate_request.py: Triton's document rules)
    control.py      model control and logging
    shm.py          shared memory extension;  restrict.py  --http-restricted-api groups
    json_body.py    the one JSON body parser (depth-bounded, 400 on failure)
    timeouts.py     header and body read timeouts (--http-header/body-timeout-secs)
"""

from pystub_backend.backend.frontends.http.restrict import path_group
from pystub_backend.backend.frontends.http.server import create_http_app

__all__ = ["create_http_app", "path_group"]
