"""`stubctl`: per-stub health of a running pystub-backend, from its admin endpoint.

    stubctl [status] [--url URL] [--json] [--watch [SECONDS]]
    stubctl restart MODEL [INSTANCE] [--url URL]

Exit status 1 when any stub is unhealthy (usable as a probe), 2 when the backend cannot be reached,
141 (128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe) when whoever reads
the output stopped reading (`stubctl --json | head -1`): that ends stubctl quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["main", "fetch_stubs", "format_table"]

_COLUMNS = (
    ("MODEL", "model"), ("VER", "version"), ("INSTANCE", "instance"), ("DEVICE", "device"), ("PID", "pid"),
    ("STATE", "state"),
    ("UPTIME", "uptime_s"), ("HB_AGE", "heartbeat_age_s"), ("RESTARTS", "restarts"), ("INFLIGHT", "in_flight"),
    ("SERVED", "served"), ("FAILED", "failed"), ("RSS_MB", "rss_bytes"), ("CPU%", "cpu_percent"),
    ("ARENA", "arena"), ("QUEUE", "queue_depth"),
)
_MULTIPLEXED = ("SUB-MODELS", "multiplexed_models")  # shown when any stub holds sub-models
_GPU_MEMORY = ("GPU_MB", "gpu_memory_by_device")  # shown when the server has a GPU: "<device>:<MiB>" each
_MAX_IDS_CELL = 40
_CLOSED_PIPE_STATUS = 128 + signal.SIGPIPE


class _OutputClosedError(Exception):
    """Standard output's reader is gone; nothing more can be shown."""


def _show(text: str) -> None:
    """Print `text` and flush, so a closed pipe shows here (as `_OutputClosedError`), not as a
    BrokenPipeError of the HTTP connection's or at interpreter exit."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise _OutputClosedError from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, as CPython's "Note on SIGPIPE" recommends: the interpreter
    flushes stdout at exit, which would raise BrokenPipeError again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def fetch_stubs(url: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The backend's stub rows. Raises OSError (URLError) when it cannot be reached."""
    with urllib.request.urlopen(url.rstrip("/") + "/v2/pystub/stubs", timeout=timeout) as response:
        return json.loads(response.read())["stubs"]


def _cell(row: dict[str, Any], key: str) -> str:
    if key == "multiplexed_models":
        return _ids_cell(row.get(key) or [])
    if key == "gpu_memory_by_device":  # NVML's figure per GPU the stub holds memory on
        held = row.get(key) or {}
        return ",".join(f"{device}:{size / 2**20:.1f}" for device, size in held.items()) or "0"
    if key == "device":  # "GPU 1" for a GPU instance, else its kind (CPU, MODEL)
        kind = row.get("kind", "CPU")
        return f"{kind} {row.get('device_id', 0)}" if kind == "GPU" else kind
    if key == "arena":
        used = row["arena_used_bytes"] + row.get("s2p_used_bytes", 0)  # both directions' arenas
        total = row["arena_total_bytes"] + row.get("s2p_total_bytes", 0)
        return f"{used / 2**20:.1f}/{total / 2**20:.1f}M"
    value = row.get(key)
    if value is None:
        return "-"
    if key == "rss_bytes":
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _ids_cell(ids: list[str]) -> str:
    """Multiplexed sub-model ids, most recently used first, cut to fit (`--json` has them all)."""
    cell = ""
    for shown, model_id in enumerate(reversed(ids)):
        more = f"{',' if cell else ''}{model_id}"
        if len(cell) + len(more) > _MAX_IDS_CELL:
            return f"{cell}(+{len(ids) - shown})" if cell else f"{model_id[:_MAX_IDS_CELL]}…(+{len(ids) - 1})"
        cell += more
    return cell or "-"


def format_table(rows: list[dict[str, Any]]) -> str:
    columns = _COLUMNS + ((_GPU_MEMORY,) if any(row.get("gpu_memory_bytes") is not None for row in rows) else ()) \
        + ((_MULTIPLEXED,) if any(row.get("multiplexed_models") for row in rows) else ())
    table = [[title for title, _ in columns]] + [[_cell(row, key) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in table)


def _restart(url: str, model: str, instance: str | None) -> int:
    path = f"/v2/pystub/stubs/{model}/{instance + '/' if instance else ''}restart"
    request = urllib.request.Request(url.rstrip("/") + path, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            _show("restarted: " + ", ".join(json.loads(response.read())["restarted"]))
            return 0
    except urllib.error.HTTPError as error:
        print(f"stubctl: {json.loads(error.read() or b'{}').get('error', error.reason)}", file=sys.stderr)
        return 1


def _status(url: str, as_json: bool) -> int:
    rows = fetch_stubs(url)
    _show(json.dumps(rows, indent=2) if as_json else format_table(rows))
    return 0 if all(row["healthy"] for row in rows) else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="stubctl", description="Per-stub health of a pystub-backend.")
    parser.add_argument("command", nargs="?", default="status", choices=("status", "restart"))
    parser.add_argument("target", nargs="*", metavar="MODEL [INSTANCE]", help="for restart")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the backend's HTTP endpoint")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS",
                        help="print the table again every SECONDS (default 2) until interrupted")
    args = parser.parse_args(argv)
    url = args.url if "://" in args.url else "http://" + args.url
    try:
        if args.command == "restart":
            if not 1 <= len(args.target) <= 2:
                parser.error("restart takes MODEL [INSTANCE]")
            sys.exit(_restart(url, args.target[0], args.target[1] if len(args.target) > 1 else None))
        while True:
            code = _status(url, args.json)
            if args.watch is None:
                sys.exit(code)
            time.sleep(args.watch)
            _show("")
    except _OutputClosedError:
        _silence_stdout()
        sys.exit(_CLOSED_PIPE_STATUS)
    except (OSError, ValueError, KeyError) as exc:
        print(f"stubctl: cannot reach the backend at {url}: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(0)
