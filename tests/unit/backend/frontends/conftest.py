"""Fixtures of the frontend tests: h2 gRPC servers that a test starts, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from h2_server import RunningH2Server


@pytest.fixture
def started() -> Iterator[list[RunningH2Server]]:
    """The servers a test appends here are closed when it ends."""
    servers: list[RunningH2Server] = []
    try:
        yield servers
    finally:
        for server in servers:
            server.close()
