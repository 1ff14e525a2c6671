"""The event loop the backend and its frontend workers run on: uvloop where it is installed (a
serving dependency on Linux and macOS), else the standard library's.

uvloop's loop and transports are libuv's, in C: per 16 B gRPC request the backend spends about a
tenth less CPU on them than on asyncio's selector loop, per HTTP request a few per cent
(docs/performance.md). `PYSTUB_EVENT_LOOP=asyncio` keeps the standard loop (to compare, or to
rule the loop out when chasing a problem).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

_T = TypeVar("_T")


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """Run `main` to completion on a new event loop, as asyncio.run does."""
    if os.environ.get("PYSTUB_EVENT_LOOP", "") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
