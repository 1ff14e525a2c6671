"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers (gRPC
metadata) whose name matches the pattern become string parameters of the inference request, as in
Triton (a partial match, like RE2::PartialMatch). A parameter the request already sets wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pystub_backend.backend.inference import ParameterValue

__all__ = ["forward_headers"]


def forward_headers(headers: Iterable[tuple[str, str | bytes]], parameters: dict[str, ParameterValue],
                    pattern: re.Pattern[str] | None) -> None:
    """Copy the matching `headers` into `parameters` (binary gRPC metadata is skipped)."""
    if pattern is None:
        return
    for name, value in headers:
        if isinstance(value, str) and name not in parameters and pattern.search(name):
            parameters[name] = value
