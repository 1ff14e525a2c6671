"""The JSON codec of HTTP inference bodies: simdjson in, orjson out, the standard library behind both.

Why these two (measured on 262,144 FP32 values, a 5 MB body; see docs/performance.md):

    parse  json.loads 80 ms + list -> array 16 ms | orjson.loads 15 ms + 16 ms | simdjson 7.7 ms
    write  tolist 11 ms + json.dumps 136 ms       | orjson (numpy arrays) 6 ms

Headers up to 4 KiB (every binary-tensor request, small JSON tensors) are parsed by orjson into
plain objects. Larger ones go to simdjson, which parses the header into a tape without building
Python objects; everything except the inputs' `data` is converted to plain dicts and lists at
once, while each `data` stays a lazy
`simdjson.Array` that `json_tensors` turns into a typed array with one `as_buffer` call (no Python
float per element). orjson writes numeric outputs straight from numpy arrays.

The standard `json` module stays the authority on what a body means: any document orjson or
simdjson refuses (malformed, NaN/Infinity, lone surrogate escapes, integers past 64 bits, ...) is parsed
again by `json.loads`, which then either accepts it as before or raises the error it always
raised; likewise any header orjson cannot write (non-UTF-8 BYTES elements, non-finite floats) is
written by `json.dumps` exactly as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson
import simdjson

__all__ = ["JsonOnlyList", "LazyArray", "dump_header", "load_document"]

LazyArray = simdjson.Array  # a JSON array not yet converted to Python objects
_SIMDJSON_ERRORS = (ValueError, RuntimeError, TypeError, UnicodeDecodeError)
# Below this many bytes orjson's plain objects cost less than simdjson's tape and proxies (a binary
# request's header: 0.5 us against 3 us); its few data values convert the slow way in no time.
_SMALL = 4096
# orjson reads an integer past 64 bits as a float, json as an int (an error the slow path names):
# such a header (19+ digits in a row, in a number or not) is left to json.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def load_document(text: bytes | bytearray) -> Any:
    """The parsed JSON `text`; each input's `data` array may be left as a `LazyArray`.

    Raises ValueError (json.JSONDecodeError, UnicodeDecodeError) for text that is not JSON.
    """
    if len(text) <= _SMALL and not _LONG_NUMBER.search(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return json.loads(text)
    try:
        document = simdjson.Parser().parse(text)
    except _SIMDJSON_ERRORS:
        return json.loads(text)  # the authority: accepts what it always accepted, or says why not
    try:
        return _plain_document(document)
    except _SIMDJSON_ERRORS:
        return json.loads(text)


def _plain_document(document: Any) -> Any:
    if not isinstance(document, simdjson.Object):
        return _plain(document)
    return _convert_object(document, "inputs", _inputs)


def _convert_object(item: simdjson.Object, special: str, convert: Callable[[Any], Any]) -> Any:
    """`item` as a dict with `convert` applied to its `special` key and `_plain` to the others."""
    keys = list(item.keys())
    if len(set(keys)) != len(keys):
        return item.as_dict()  # duplicate keys: the last one wins, as in json.loads (no fast path)
    # item[key] is a lazy proxy for arrays and objects; items() would convert them all.
    return {key: convert(item[key]) if key == special else _plain(item[key]) for key in keys}


def _inputs(value: Any) -> Any:
    if not isinstance(value, simdjson.Array):
        return _plain(value)
    return [
        _convert_object(item, "data", _keep_array) if isinstance(item, simdjson.Object)
        else _plain(item)
        for item in value
    ]


def _keep_array(value: Any) -> Any:
    return value if isinstance(value, simdjson.Array) else _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def dump_header(document: dict[str, Any]) -> bytes:
    """`document` as compact UTF-8 JSON; numpy arrays in it are written as flat lists.

    Non-UTF-8 BYTES elements (carried as surrogate escapes) come out as their raw bytes, as Triton
    writes them. Raises TypeError for a value JSON cannot hold.
    """
    try:
        return orjson.dumps(document, default=_refuse, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), default=_tolist)
        return text.encode("utf-8", "surrogateescape")


class JsonOnlyList(list[float]):
    """A list that only `json.dumps` may write: it holds NaN or infinities, which orjson would
    write as null (Triton and the json module write NaN, Infinity)."""


# Subclasses of list, dict, str and int go to `_refuse` instead of being written by orjson.
_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is written by the json module")


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
