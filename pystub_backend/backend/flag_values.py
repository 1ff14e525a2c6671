"""Values of the command-line flags: the argparse `type=` functions and the composite formats.

Each function raises `argparse.ArgumentTypeError` (a usage error, exit status 2) with a message
that quotes the bad text; the formats are Triton's (`tritonserver --help`).
"""

from __future__ import annotations

import argparse

from pystub_backend.backend.header_patterns import HeaderPattern, HeaderPatternError
from pystub_backend.backend.options import API_GROUPS, OPEN_FLAG, STATE_GROUPS, Restriction, Restrictions
from pystub_backend.backend.scheduling.rate_limiter import ResourceLimit, parse_resource_limit

__all__ = ["parse_bool", "positive_seconds", "non_negative_seconds", "positive_int", "non_negative_int",
           "compression_level", "header_pattern", "restrictions", "remote_control", "setting", "cache_setting",
           "rate_limit_resource"]

_COMPRESSION_LEVELS = ("none", "low", "medium", "high")  # grpc_compression_level 0..3


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}'")
    return value


def non_negative_seconds(text: str) -> float:
    """Seconds >= 0 (0 turns a timeout off); finite."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got '{text}'")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got '{text}'")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got '{text}'")
    return value


def header_pattern(text: str) -> HeaderPattern:
    """A header forward pattern, read as Triton reads it (header_patterns.py: RE2, case-insensitive)."""
    try:
        return HeaderPattern(text)
    except HeaderPatternError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def compression_level(text: str) -> int:
    """none, low, medium or high as gRPC's compression level 0..3."""
    lowered = text.strip().lower()
    if lowered not in _COMPRESSION_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(_COMPRESSION_LEVELS)}, got '{text}'")
    return _COMPRESSION_LEVELS.index(lowered)


def restrictions(entries: list[str], flag: str) -> Restrictions:
    """`<group>[,<group>...]:<key>=<value>` entries as group -> Restriction.

    The format is the one tritonserver 2.51 parses (its --help shows a comma before the key, which
    it refuses). A group named in two entries is an error, as in Triton."""
    result: Restrictions = {}
    for entry in entries:
        groups_text, colon, pair = entry.partition(":")
        key, equals, value = pair.partition("=")
        if not colon or not groups_text or not equals or not key.strip():
            raise argparse.ArgumentTypeError(
                f"{flag} option format is '<api>[,<api>...]:<key>=<value>', got '{entry}'")
        for group in (g.strip() for g in groups_text.split(",")):
            if group not in API_GROUPS:
                raise argparse.ArgumentTypeError(
                    f"{flag}: unknown API group '{group}' (known: {', '.join(API_GROUPS)})")
            if group in result:
                raise argparse.ArgumentTypeError(f"{flag}: API group '{group}' is given more than once")
            result[group] = Restriction(key.strip().lower(), value)
    return result


def remote_control(entries: list[str]) -> frozenset[str]:
    """`--allow-remote-control` entries (`<group>[,<group>...]` or `all`) as the opened groups."""
    opened: set[str] = set()
    for entry in entries:
        for group in (g.strip() for g in entry.split(",")):
            if group == "all":
                opened.update(STATE_GROUPS)
            elif group in STATE_GROUPS:
                opened.add(group)
            else:
                raise argparse.ArgumentTypeError(
                    f"{OPEN_FLAG}: '{group}' is not a group of state-changing calls (known: "
                    f"{', '.join(STATE_GROUPS)}, all)")
    return frozenset(opened)


def setting(entries: list[str], flag: str) -> dict[str, str]:
    """`<setting>=<value>` entries (--metrics-config) as a dict; the last one of a name wins."""
    result: dict[str, str] = {}
    for entry in entries:
        name, equals, value = entry.partition("=")
        if not equals or not name.strip():
            raise argparse.ArgumentTypeError(f"{flag} expects <setting>=<value>, got '{entry}'")
        result[name.strip()] = value.strip()
    return result


def cache_setting(entries: list[str], flag: str) -> dict[str, dict[str, str]]:
    """`<cache>,<setting>=<value>` entries (--cache-config) as cache -> {setting: value}."""
    result: dict[str, dict[str, str]] = {}
    for entry in entries:
        cache, comma, pair = entry.partition(",")
        name, equals, value = pair.partition("=")
        if not comma or not equals or not cache.strip() or not name.strip():
            raise argparse.ArgumentTypeError(f"{flag} expects <cache>,<setting>=<value>, got '{entry}'")
        result.setdefault(cache.strip(), {})[name.strip()] = value.strip()
    return result


def rate_limit_resource(text: str) -> ResourceLimit:
    """`<name>:<count>[:<device>]` (--rate-limit-resource), with Triton's error text."""
    try:
        return parse_resource_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
