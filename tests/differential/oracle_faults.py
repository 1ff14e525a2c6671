"""When the oracle cannot answer: the case is the oracle's, not pystub's, and neither is it a pass.

Triton 2.51's Python backend aborts now and then on a machine loaded far past its cores
(`boost::interprocess::lock_exception`, a lock timeout compiled into it), whatever the request.
`calls.ask_triton` starts Triton again and asks once more at once; when that fails the same way (or
Triton cannot be started again), it raises `OracleUnavailable`. Then:

    1. the test's report becomes a skip whose reason starts ORACLE_SKIP and says what Triton did
       (pytest counts it in the summary line, and -ra lists it with the reason)
    2. its reports are held back, not logged: the case is retried once more at the end of the
       run (of the worker, under xdist), after waiting up to QUIET_WAIT_S seconds for the load
       average to fall below the number of cores (or to half of what it was when Triton failed)
    3. the retry's reports are the case's only ones: a pass, a failure, or, should the oracle
       fail again, the skip of step 1

A case in which Triton answered is never touched: its pass or failure stands as it is. Any other
death of the oracle still fails the test (conftest.py's `pair` fixture).

`OracleFaults` is the pytest plugin that does it (conftest.py registers one for this directory);
tests/differential/test_oracle_faults.py runs it in pytest runs of its own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

ORACLE_SKIP = "the oracle (Triton 2.51) did not answer"
QUIET_WAIT_S = float(os.environ.get("DIFFERENTIAL_QUIET_WAIT_S", "180"))
_POLL_S = 5.0
_PROPERTY = "oracle_unavailable"  # user_properties key: survives xdist's report serialisation


class OracleUnavailable(Exception):  # noqa: N818 - the oracle's state, not a pystub error
    """Triton could not answer (it aborted on its own lock timeout again, or would not start)."""


@dataclass
class _Deferred:
    item: pytest.Item
    reports: list[pytest.TestReport]  # the first try's
    load: float  # the 1-minute load average when the oracle failed


def oracle_reason(report: pytest.TestReport) -> str | None:
    """The skip reason of a report that is the oracle's, else None."""
    return next((value for key, value in report.user_properties if key == _PROPERTY), None)


class OracleFaults:
    """The pytest plugin of steps 1-3 for the tests in `directory` (conftest.py registers it)."""

    def __init__(self, directory: Path, wait: Callable[[float], str] | None = None) -> None:
        self._directory = directory
        self._wait = wait or wait_until_quieter
        self._deferred: list[_Deferred] = []
        self._retrying: set[str] = set()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A phase that raised OracleUnavailable reports a skip with the reason."""
        report = yield
        if call.excinfo is not None and call.excinfo.errisinstance(OracleUnavailable):
            reason = f"{ORACLE_SKIP}: {call.excinfo.value}"
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, reason)
            report.user_properties.append((_PROPERTY, reason))
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """Run a case; hold its reports back when the oracle failed it (the first time)."""
        if item.path.resolve().parent != self._directory or item.nodeid in self._retrying:
            return None  # not this tier's (config.hook reaches every test), or the retry: pytest's own protocol
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        if any(oracle_reason(report) for report in reports):
            self._deferred.append(_Deferred(item, reports, os.getloadavg()[0]))
        else:
            _log(item, reports)
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After the run's loop: retry each held-back case once, when the machine is quieter."""
        try:
            outcome = yield
        except BaseException:  # the run stopped (-x, Ctrl-C): no retry, say what the first try said
            self._report_first_tries()
            raise
        if session.shouldfail or session.shouldstop:
            self._report_first_tries()
        else:
            self._retry()
        return outcome

    def _report_first_tries(self) -> None:
        deferred, self._deferred = self._deferred, []
        for case in deferred:
            _log(case.item, case.reports)

    def _retry(self) -> None:
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        said = self._wait(max(case.load for case in deferred))
        print(f"\n{len(deferred)} differential case(s) the oracle did not answer: retrying once ({said})",
              file=sys.stderr)
        for case in deferred:
            self._retrying.add(case.item.nodeid)
            try:
                _as_current_xdist_item(case.item)
                case.item.ihook.pytest_runtest_protocol(item=case.item, nextitem=None)
            finally:
                self._retrying.discard(case.item.nodeid)


def wait_until_quieter(load_at_failure: float, limit_s: float = QUIET_WAIT_S) -> str:
    """Wait (at most `limit_s`) for the 1-minute load average to fall below the number of cores
    or to half of `load_at_failure`; returns what happened, for the log."""
    target = max(float(os.cpu_count() or 1), load_at_failure / 2)
    started = time.monotonic()
    while (load := os.getloadavg()[0]) > target and (left := limit_s - (time.monotonic() - started)) > 0:
        time.sleep(min(_POLL_S, left))
    waited = time.monotonic() - started
    quiet = "quieter" if load <= target else f"still loaded after the {limit_s:.0f} s limit"
    return f"load {load_at_failure:.1f} when it failed, {load:.1f} now ({quiet}, waited {waited:.0f} s)"


def _log(item: pytest.Item, reports: list[pytest.TestReport]) -> None:
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _as_current_xdist_item(item: pytest.Item) -> None:
    """Under xdist a worker sends each report as one of the item it ran last (WorkerInteractor's
    `item_index`, which it checks against the report): point it at the case retried."""
    for plugin in item.config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "item_index"):
            plugin.item_index = item.session.items.index(item)
