"""What tests/differential/test_instance_updates*.py share: a copy of the `instance_events` model
per test in both servers' repositories, the configs they load, and each server's record of what
happened to the copy's instances (models/instance_events/1/model.py writes it).

Each instance process is shown as `<its Triton name>#<n>`: the n-th process of that name to
initialize on that server. Two servers that create and remove the same instances in the same
order show the same labels, however the initializations of one update interleave.

Triton 2.51 counts the `__pycache__` its stub writes into the version directory as a change of
the model's files (its next reload is then a full one); each copy's version directory holds a
plain file of that name, so that neither server can write one and both see the files unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calls import agree, raw
from google.protobuf import json_format, text_format
from oracle import MODELS, Endpoint, Pair
from tritonclient.grpc import model_config_pb2

TEMPLATE = MODELS / "instance_events"
EVENT_DEADLINE = 60.0  # seconds both servers get to show the same events
LIFECYCLE = ("init", "fini", "slow")

SEQUENCE_BATCHING = {"max_sequence_idle_microseconds": 60_000_000, "direct": {}}


def group(count: int = 1, name: str = "", **settings: Any) -> dict[str, Any]:
    return {**({"name": name} if name else {}), "kind": "KIND_CPU", "count": count, **settings}


class ModelCopy:
    """`instance_events` under the name `name`, in both servers' repositories."""

    def __init__(self, pair: Pair, name: str, sequence: bool = False) -> None:
        self.pair, self.name, self.sequence = pair, name, sequence
        self.repositories = {"triton": Path(pair.triton_server.repository),
                             "pystub": Path(pair.pystub_backend.repository)}
        for repository in self.repositories.values():  # made aside, then moved in: a poll sees it whole
            staging = repository.parent / f".{name}"
            shutil.copytree(TEMPLATE, staging)
            (staging / "1" / "__pycache__").write_text("")
            self._write_config(staging, [group()])
            staging.rename(repository / name)
        self.events = {server: Events(repository / f"{name}.events")
                       for server, repository in self.repositories.items()}

    def endpoints(self) -> dict[str, Endpoint]:
        return {"triton": self.pair.triton, "pystub": self.pair.pystub}

    def config(self, groups: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """The model's config (JSON, as a load request's override) with these instance groups."""
        config: dict[str, Any] = {
            "name": self.name, "backend": "python", "max_batch_size": 1 if self.sequence else 0,
            "input": [{"name": "DELAY", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "INSTANCE", "data_type": "TYPE_STRING", "dims": [1]}],
            "instance_group": groups, **fields}
        if self.sequence:
            config["sequence_batching"] = SEQUENCE_BATCHING
        return config

    def _write_config(self, directory: Path, groups: list[dict[str, Any]], **fields: Any) -> None:
        written = directory.parent / f".{directory.name}.config.pbtxt"  # then renamed: never seen half-written
        written.write_text(json_to_pbtxt(self.config(groups, **fields)))
        written.rename(directory / "config.pbtxt")

    def write_config(self, groups: list[dict[str, Any]], **fields: Any) -> None:
        """Rewrite config.pbtxt in both repositories (what a load without an override, or a poll, reads)."""
        for repository in self.repositories.values():
            self._write_config(repository / self.name, groups, **fields)

    def touch(self, relative: str) -> None:
        """Make a file of the model newer in both repositories (by a second: any clock resolution)."""
        for repository in self.repositories.values():
            path = repository / self.name / relative
            stat = path.stat()
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))

    def marker(self, kind: str, text: str = "") -> None:
        """Create (or, with kind prefixed by '-', remove) a marker beside the model in both repositories."""
        for repository in self.repositories.values():
            path = repository / f"{self.name}.{kind.lstrip('-')}"
            if kind.startswith("-"):
                path.unlink(missing_ok=True)
            else:
                path.write_text(text)

    # -- requests -------------------------------------------------------------------------------------
    def load(self, endpoint: Endpoint, groups: list[dict[str, Any]] | None = None, **fields: Any) -> list:
        """Load through the repository API: with a config override when `groups` is given."""
        body = {"parameters": {"config": json.dumps(self.config(groups, **fields))}} if groups is not None else {}
        return post(endpoint, f"/v2/repository/models/{self.name}/load", body)

    def unload(self, endpoint: Endpoint) -> list:
        return post(endpoint, f"/v2/repository/models/{self.name}/unload", {})

    def infer(self, endpoint: Endpoint, delay: float = 0.0, sequence: dict[str, Any] | None = None) -> list:
        """One request: [status, the serving instance's "<name> <pid>" or the error]."""
        shape = [1, 1] if self.sequence else [1]
        body = {"inputs": [{"name": "DELAY", "datatype": "FP32", "shape": shape, "data": [delay]}],
                **({"parameters": sequence} if sequence else {})}
        status, answer = post(endpoint, f"/v2/models/{self.name}/infer", body)
        return [status, answer["outputs"][0]["data"][0] if status == 200 else answer]

    def groups_shown(self, endpoint: Endpoint) -> list:
        """The instance groups the config endpoint shows (name, count and settings)."""
        reply = raw(endpoint, "GET", f"/v2/models/{self.name}/config")
        return [reply.status, reply.json().get("instance_group") if reply.status == 200 else reply.json()]

    def state(self, endpoint: Endpoint) -> list:
        """Readiness, the index row and the statistics' counts."""
        ready = raw(endpoint, "GET", f"/v2/models/{self.name}/ready").status
        rows = [row for row in raw(endpoint, "POST", "/v2/repository/index", {}).json() if row["name"] == self.name]
        stats = raw(endpoint, "GET", f"/v2/models/{self.name}/stats").json()
        counts = [[s["inference_count"], s["execution_count"], s["inference_stats"]["success"]["count"]]
                  for s in stats.get("model_stats", [])] if isinstance(stats, dict) else stats
        return [ready, rows, counts]

    # -- what the instances did -----------------------------------------------------------------------
    def agree_on_events(self, what: str = "", at_least: int = 0) -> list[tuple[str, ...]]:
        """Wait until both servers show the same lifecycle events since the copy was made (each
        sorted: the order of one update's initializations is Triton's chance), `at_least` of them
        (what a poll still to come will cause); returns them."""
        deadline = time.monotonic() + EVENT_DEADLINE
        while True:
            seen = {server: events.lifecycle() for server, events in self.events.items()}
            if (seen["triton"] == seen["pystub"] and len(seen["triton"]) >= at_least) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        try:
            agree(seen["triton"], seen["pystub"])
        except AssertionError as error:
            raise AssertionError(f"the instances' events differ {what} (after {EVENT_DEADLINE:g} s):\n{error}") \
                from None
        return seen["triton"]


class Events:
    """One server's event file of a model copy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._labels: dict[str, str] = {}  # pid -> label
        self._named: dict[str, int] = {}  # instance name -> processes of that name so far

    def lines(self) -> list[list[str]]:
        """Every event in order: [what, label, details...]; a process is labelled at its first line."""
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_text().split("\n")[:-1]:  # the last part: a line still being written
            what, name, pid, *details = line.split()
            if pid not in self._labels:
                self._named[name] = self._named.get(name, 0) + 1
                self._labels[pid] = f"{name}#{self._named[name]}"
            events.append([what, self._labels[pid], *details])
        return events

    def wait_for(self, condition: Callable[[list[list[str]]], bool], what: str) -> list[list[str]]:
        """The events once `condition(events)` holds; AssertionError naming `what` after EVENT_DEADLINE."""
        deadline = time.monotonic() + EVENT_DEADLINE
        while not condition(lines := self.lines()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {EVENT_DEADLINE:g} s waiting for {what} ({self.path.name}: "
                                     f"{lines})")
            time.sleep(0.05)
        return lines

    def lifecycle(self) -> list[tuple[str, ...]]:
        return sorted(tuple(event) for event in self.lines() if event[0] in LIFECYCLE)

    def label(self, answer: str) -> str:
        """The label of the process that answered `<name> <pid>`."""
        self.lines()
        return self._labels.get(answer.split()[-1], f"unknown process {answer}")

    def order(self, *events: tuple[str, str]) -> list[int]:
        """Where each (what, label) event is in this server's log (-1: absent)."""
        lines = [(event[0], event[1]) for event in self.lines()]
        return [lines.index(event) if event in lines else -1 for event in events]


def post(endpoint: Endpoint, path: str, body: object) -> list:
    reply = raw(endpoint, "POST", path, body)  # type: ignore[arg-type]
    try:
        return [reply.status, reply.json()]
    except ValueError:
        return [reply.status, reply.body.decode(errors="replace")]


def json_to_pbtxt(config: dict[str, Any]) -> str:
    """A config dict (as the JSON override would carry it) as config.pbtxt text."""
    return text_format.MessageToString(json_format.ParseDict(config, model_config_pb2.ModelConfig()))

