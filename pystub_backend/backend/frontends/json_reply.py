"""JSON replies as Triton sends them: compact, `Content-Type: application/json` exactly
(aiohttp's `json_response` says `application/json; charset=utf-8`).

    json_reply(value, status=200, headers=None) -> web.Response
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

__all__ = ["JSON_CONTENT_TYPE", "json_reply"]

JSON_CONTENT_TYPE = "application/json"


def json_reply(value: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """`value` as a compact JSON body (the standard library's writer: ASCII, escapes as it writes them)."""
    body = json.dumps(value, separators=(",", ":")).encode()
    return web.Response(body=body, status=status, headers=headers, content_type=JSON_CONTENT_TYPE)
