"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers (gRPC
metadata) in whose name the pattern is found become string parameters of the inference request, as
in Triton 2.51 (header_patterns.py: RE2, case-insensitive unless the pattern says `(?-i)`, found
anywhere in the name; HTTP names as the client wrote them, gRPC keys lowercase).

Triton appends each forwarded header to the request's parameters, after those the request sets,
and the model reads them as one JSON object: of two same-named entries it sees the last. So here a
header replaces a parameter of its name, and a later header an earlier one (gRPC metadata may
repeat a key). Two exceptions keep pystub's own reading of a request intact: a header never
replaces a parameter pystub consumes itself (`RESERVED_PARAMETERS`: `sequence_id`, `priority`, ...;
to Triton a forwarded one is only a string the model sees) nor adds a `triton_*` one, and binary
gRPC metadata (`-bin` keys, whose values are bytes) is not forwarded.
"""

from __future__ import annotations

from collections.abc import Iterable

from pystub_backend.backend.header_patterns import HeaderPattern
from pystub_backend.backend.inference import RESERVED_PARAMETERS, ParameterValue

__all__ = ["forward_headers"]


def forward_headers(headers: Iterable[tuple[str, str | bytes]], parameters: dict[str, ParameterValue],
                    pattern: HeaderPattern | None) -> None:
    """Copy the `headers` the pattern finds into `parameters` (see the module docstring)."""
    if pattern is None:
        return
    for name, value in headers:
        if isinstance(value, str) and pattern.finds(name) and _forwardable(name):
            parameters[name] = value


def _forwardable(name: str) -> bool:
    return name not in RESERVED_PARAMETERS and not name.startswith("triton_")
