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
       that many passes means deeper than the limit; stuck early means malformed: then the
       deepest prefix decides (a cut-off document 129 levels deep is still too deep), else the
       decoder reports where

Step 1 is all most bodies pay (a flat tensor has one bracket pair per input). The size of a body is
bounded before it reaches here (`--http-max-input-size`, the read limit); this module only parses.

A large body (a model load carrying files) is parsed by `parse_json_body_off_loop` in a worker
thread. The C scanner holds the interpreter lock for the whole document (40 ms for 22 MB of
override files, longer under load), stalling the event loop even from a thread; the Python-level
scanner lets go between values, so one string is its longest hold, but its per-value bytecode
competes with the loop for the lock (20,000 small values: 70 ms probe delays). So a document of
few strings (at most _FEW_STRINGS) gets the Python scanner, one of many (small) strings the C one.

The signature is deliberately narrow (bytes in, value out) so the decoder behind it can be swapped
(a faster JSON library) without touching an endpoint.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import re
from collections.abc import Callable

import numpy as np

from pystub_backend.backend.errors import ServerError, Status

__all__ = ["JSON_PARSE_ERROR", "MAX_JSON_DEPTH", "parse_json_body", "parse_json_body_off_loop"]

JSON_PARSE_ERROR = "failed to parse the request JSON buffer"
# Deep enough for any request the protocol describes (an inference request nests 4 levels around
# a tensor's `data`, which nests once per dimension), far below where recursion becomes a risk.
MAX_JSON_DEPTH = 128
_FEW_STRINGS = 4096

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_INNER_PAIR = re.compile(rb"\[\]|\{\}")
# translate() deletes every byte except the structural ones.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{}')


def parse_json_body(text: bytes | bytearray,
                    loads: Callable[[bytes | bytearray], object] = json.loads) -> object:
    """The JSON value `text` holds (UTF-8). Raises ServerError(INVALID_ARG) for malformed JSON,
    invalid UTF-8, or nesting deeper than MAX_JSON_DEPTH. `loads` is the decoder behind the depth
    check (the inference codec passes json_tensors.load_document: typed arrays for tensor data);
    it raises ValueError for text that is not JSON."""
    return _parse(text, loads)


async def parse_json_body_off_loop(text: bytes | bytearray) -> object:
    """`parse_json_body` in a worker thread, letting go of the interpreter lock between values so
    the event loop keeps serving meanwhile. Raises as `parse_json_body`."""
    few_strings = text.count(b'"') <= 2 * _FEW_STRINGS
    return await asyncio.to_thread(_parse, text, _yielding_loads if few_strings else json.loads)


def _parse(text: bytes | bytearray, loads: Callable[[bytes | bytearray], object]) -> object:
    if _too_deep(text):
        raise ServerError(f"{JSON_PARSE_ERROR}: nesting deeper than {MAX_JSON_DEPTH} levels", Status.INVALID_ARG)
    try:
        return loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise ServerError(f"{JSON_PARSE_ERROR}: {exc}", Status.INVALID_ARG) from None


def _yielding_loads(text: bytes | bytearray) -> object:
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(text.decode(json.detect_encoding(text), "surrogatepass"))


def _too_deep(text: bytes | bytearray) -> bool:
    if text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:
        return False
    skeleton = bytes(text)
    if b"\\" in skeleton:
        skeleton = _ESCAPE.sub(b"", skeleton)  # so that every remaining '"' opens or closes a string
    skeleton = _STRING.sub(b"", skeleton.translate(None, _NOT_STRUCTURAL))
    original = skeleton
    for _ in range(MAX_JSON_DEPTH):
        reduced = _INNER_PAIR.sub(b"", skeleton)
        if not reduced:
            return False
        if reduced == skeleton:  # malformed: unclosed, or closed by the wrong kind
            return _deepest_prefix(original) > MAX_JSON_DEPTH  # else the decoder says where
        skeleton = reduced
    return True


def _deepest_prefix(skeleton: bytes) -> int:
    """The deepest nesting any prefix of a bracket skeleton reaches (openers minus closers so
    far): what the decoder would recurse to before it finds the document malformed. Vectorised,
    since a malformed body may be as large as the body limit."""
    codes = np.frombuffer(skeleton.replace(b'"', b""), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))
