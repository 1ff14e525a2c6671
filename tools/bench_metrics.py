#!/usr/bin/env python3
"""Custom metrics benchmark: what `Metric.increment` / `observe` cost a model, against baselines
measured in the same run.

    local     pb_utils with no reporter: the model-side bookkeeping alone (the floor)
    pystub    pb_utils with pystub's reporter over a real SEQPACKET channel to a "backend" thread
              that applies the frames to a real registry (pystub_backend.backend.features.custom_metrics): changes are
              buffered and aggregated, and flushed as one frame (here: every BATCH calls, as
              a response frame would)
    sync      a frame per call that waits for the backend's answer: what a model pays when every
              metric call is a synchronous round trip (Triton's stub → parent message per call)

Also checks that the backend ends with exactly the value the model computed. Prints µs per call
and the ratios; exits 0.

    tools/bench_metrics.py              # 20000 calls per mode
    tools/bench_metrics.py --calls 2000
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pystub_backend.backend.features.custom_metrics import CustomMetricError, CustomMetrics  # noqa: E402
from pystub_backend.ipc.channel import BlockingChannel, ChannelClosedError  # noqa: E402
from pystub_backend.ipc.messages import core as msg  # noqa: E402
from pystub_backend.ipc.messages.metrics import MetricFamilyCreate, MetricOps, MetricReply, MetricValueQuery  # noqa: E402
from pystub_backend.stub.features.metrics import MetricsReporter  # noqa: E402
from pystub_backend.stub.pb_utils import MetricFamily, _runtime  # noqa: E402

BATCH = 100  # calls between two flushes in the pystub mode (a model answering every 100 calls)


class FakeBackend:
    """A thread that reads frames like StubProcess does and answers waiting calls."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = BlockingChannel(sock)
        self.registry = CustomMetrics()
        self.holder = type("Holder", (), {"alive": True})()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                frame = self.channel.recv(0.1)
            except ChannelClosedError:
                return
            if frame is None:
                continue
            message = msg.decode(frame)
            if isinstance(message, MetricOps):
                self.registry.apply(self.holder, message.entries)
                continue
            if not isinstance(message, (MetricFamilyCreate, MetricValueQuery)):
                continue  # the "response" frames
            try:
                if isinstance(message, MetricFamilyCreate):
                    self.registry.create_family(message.name, message.description, message.kind)
                    value = 0.0
                else:
                    value = self.registry.value(message.family, message.labels)
                reply = MetricReply(message.token, None, value)
            except CustomMetricError as exc:
                reply = MetricReply(message.token, str(exc), 0.0)
            self.channel.send(msg.encode(reply), 5.0, "MetricReply")

    def stop(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.channel.close()


class StubEnd:
    """The stub's end: sends with the before-send flush, routes replies to the reporter."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = BlockingChannel(sock)
        self.reporter = MetricsReporter(self.send, 5.0)
        self._stop = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def send(self, message: Any) -> None:
        if not isinstance(message, MetricOps) and self.reporter.pending:
            self.reporter.flush()
        self.channel.send(msg.encode(message), 5.0, type(message).__name__)

    def _receive(self) -> None:
        while not self._stop:
            try:
                frame = self.channel.recv(0.1)
            except ChannelClosedError:
                return
            if frame is not None:
                self.reporter.on_reply(msg.decode(frame))

    def stop(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.channel.close()


def timed(calls: int, body: Callable[[int], None]) -> float:
    """Microseconds per call, best of three."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for i in range(calls):
            body(i)
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    calls = parser.parse_args().calls

    family = MetricFamily("bench_local", "local only", MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "bench"})
    local = timed(calls, lambda i: metric.increment(1))

    backend_sock, stub_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    backend, stub = FakeBackend(backend_sock), StubEnd(stub_sock)
    _runtime.set_metric_reporter(stub.reporter)
    try:
        counter_family = MetricFamily("bench_counter", "buffered", MetricFamily.COUNTER)
        counter = counter_family.Metric(labels={"model": "bench"})
        histogram_family = MetricFamily("bench_histogram", "buffered", MetricFamily.HISTOGRAM)
        histogram = histogram_family.Metric(labels={"model": "bench"}, buckets=[0.5, 1.0, 2.5])

        def buffered_increment(i: int) -> None:
            counter.increment(1)
            if i % BATCH == BATCH - 1:
                stub.send(msg.Log(0, "a response frame", "bench", 0))  # flushes first

        def buffered_observe(i: int) -> None:
            histogram.observe(i % 4 * 0.5)
            if i % BATCH == BATCH - 1:
                stub.send(msg.Log(0, "a response frame", "bench", 0))

        pystub = timed(calls, buffered_increment)
        pystub_observe = timed(calls, buffered_observe)
        exact = counter.value() == 3 * calls  # value() flushes, then asks the backend

        def synchronous(i: int) -> None:
            counter.increment(1)  # bookkeeping as above...
            stub.reporter.flush()  # ...then its own frame, and a wait for the backend
            stub.reporter.metric_value("bench_counter", {"model": "bench"})

        sync_calls = max(100, calls // 10)
        sync = timed(sync_calls, synchronous)
    finally:
        _runtime.set_metric_reporter(None)
        backend.stop()
        stub.stop()

    print(f"custom metric calls ({calls} per mode, best of 3; sync: {sync_calls})")
    print(f"  local (no server)        {local:8.2f} us/call   1.00x")
    print(f"  pystub increment         {pystub:8.2f} us/call   {pystub / local:5.2f}x local")
    print(f"  pystub observe           {pystub_observe:8.2f} us/call   {pystub_observe / local:5.2f}x local")
    print(f"  synchronous round trip   {sync:8.2f} us/call   {sync / local:5.2f}x local, "
          f"{sync / pystub:5.1f}x pystub")
    print(f"  backend value exact: {exact}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
