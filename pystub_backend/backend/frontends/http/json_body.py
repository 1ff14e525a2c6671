"""Parsing a request's JSON body: the one place every HTTP endpoint that reads JSON goes through.

    parse_json_body(text) -> the parsed value, or ServerError(INVALID_ARG) "failed to parse the
                             request JSON buffer: <why>" (the HTTP status is 400)

Why not plain `json.loads`: CPython's decoder recurses once per nesting level, so 100,000 `[`
raised RecursionError, which left as a 500 with a logged traceback; and a document nested a few
hundred levels deep parses but then breaks code that walks it recursively (the tensor flattener).
So the nesting depth is bounded (`MAX_JSON_DEPTH`) and checked before parsing, in C-speed passes:

    1. cheap bound: count('[') + count('{') <= MAX_JSON_DEPTH   -> cannot be too deep, parse
    2. drop escapes (`\\x`), keep only `"[]{}`, drop strings    -> a bracket skeleton
    3. remove innermost `[]` / `{}` pairs, at most MAX_JSON_DEPTH passes: still shrinking after
       that many passes means deeper than the limit; stuck early means malformed (the decoder
       then reports where)

Step 1 is all most bodies pay (a flat tensor has one bracket pair per input). The size of a body is
bounded before it reaches here (`--http-max-input-size`, the read limit); this module only parses.

The signature is deliberately narrow (bytes in, value out) so the decoder behind it can be swapped
(a faster JSON library) without touching an endpoint.
"""

from __future__ import annotations

import json
import re

from pystub_backend.backend.errors import ServerError, Status

__all__ = ["JSON_PARSE_ERROR", "MAX_JSON_DEPTH", "parse_json_body"]

JSON_PARSE_ERROR = "failed to parse the request JSON buffer"
# Deep enough for any request the protocol describes (an inference request nests 4 levels around
# a tensor's `data`, which nests once per dimension), far below where recursion becomes a risk.
MAX_JSON_DEPTH = 128

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_INNER_PAIR = re.compile(rb"\[\]|\{\}")
_DEEP_OPENING = re.compile(rb"[\[{]{%d}" % (MAX_JSON_DEPTH + 1))
# translate() deletes every byte except the structural ones.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{}')


def parse_json_body(text: bytes | bytearray) -> object:
    """The JSON value `text` holds (UTF-8). Raises ServerError(INVALID_ARG) for malformed JSON,
    invalid UTF-8, or nesting deeper than MAX_JSON_DEPTH."""
    if _too_deep(text):
        raise ServerError(f"{JSON_PARSE_ERROR}: nesting deeper than {MAX_JSON_DEPTH} levels", Status.INVALID_ARG)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise ServerError(f"{JSON_PARSE_ERROR}: {exc}", Status.INVALID_ARG) from None


def _too_deep(text: bytes | bytearray) -> bool:
    if text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:
        return False
    skeleton = bytes(text)
    if b"\\" in skeleton:
        skeleton = _ESCAPE.sub(b"", skeleton)  # so that every remaining '"' opens or closes a string
    skeleton = _STRING.sub(b"", skeleton.translate(None, _NOT_STRUCTURAL))
    for _ in range(MAX_JSON_DEPTH):
        reduced = _INNER_PAIR.sub(b"", skeleton)
        if not reduced:
            return False
        if reduced == skeleton:  # malformed: unclosed, or closed by the wrong kind
            return _DEEP_OPENING.search(skeleton) is not None  # else the decoder says where
        skeleton = reduced
    return True
