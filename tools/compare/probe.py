"""Health and metadata latency while inference saturates the server; run as its own process.

    python probe.py HOST:PORT MODEL SECONDS

Alternates GET /v2/health/ready and GET /v2/models/MODEL over one keep-alive HTTP connection,
one call every 10 ms, and prints one JSON line: {"health_p99_ms", "metadata_p99_ms", ...}. A
separate process so the load generator's busy event loop does not delay the probe's own timing.
"""

from __future__ import annotations

import http.client
import json
import sys
import time


def _p(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def probe(address: str, model: str, seconds: float) -> dict[str, float]:
    """Timings in ms; a failed call counts in `errors` and reopens the connection."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    timings: dict[str, list[float]] = {"health": [], "metadata": []}
    errors = 0
    deadline = time.monotonic() + seconds
    paths = (("health", "/v2/health/ready"), ("metadata", f"/v2/models/{model}"))
    turn = 0
    while time.monotonic() < deadline:
        kind, path = paths[turn % 2]
        turn += 1
        began = time.perf_counter()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                errors += 1
            else:
                timings[kind].append(1000 * (time.perf_counter() - began))
        except (OSError, http.client.HTTPException):
            errors += 1
            connection.close()
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
        time.sleep(0.01)
    connection.close()
    result: dict[str, float] = {"errors": errors}
    for kind, values in timings.items():
        values.sort()
        result[f"{kind}_p50_ms"] = _p(values, 0.5)
        result[f"{kind}_p99_ms"] = _p(values, 0.99)
        result[f"{kind}_count"] = len(values)
    return result


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2], float(sys.argv[3]))))
