"""The differential tier: one Triton 2.51 and one pystub per test file, shared by its tests.

Every test runs twice: against pystub as one process, and against pystub with
`--frontend-workers 2` (protocol work in worker processes, inference over the core link), which
must answer as the single process does. A file whose cases never reach the frontends' code (a
model's own pb_utils calls) names the variants it needs in `PYSTUB_VARIANTS_RUN`; the others are
deselected.

Both servers load the models of oracle.STARTUP_MODELS at start-up, or those a file names in
`PAIR_MODELS` (the others stay in the repository, unloaded, for the repository API); a file's
`PAIR_FLAGS` and `PAIR_ENV` (environment variables) are given to both servers: what the file
compares is how each reads them.

Known differences live in known.py, keyed by test id (without the pystub variant); this conftest
marks those tests `xfail(strict=True)` with the difference as the reason, so a fix shows up as an
XPASS failure and the entry must then be removed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from calls import ORACLE_LOAD_FAULT, restart_oracle
from known import KNOWN
from oracle import PYSTUB_VARIANTS, STARTUP_MODELS, Pair, running_pair, without_variant
from oracle_faults import OracleFaults, OracleUnavailable

_HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=list(PYSTUB_VARIANTS))
def _module_pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    # One pair per file and variant, not per process: each file then sees servers in the same
    # state whatever ran before it (pytest-xdist --dist loadfile starts one pair per file anyway).
    # Not one Triton for both variants: its state (custom metrics, a BLS callee's) carries over.
    # A file that needs few of the models names them in PAIR_MODELS: each server then boots only
    # those stubs (every one of the tier's pairs boots about 40 of them otherwise).
    models = getattr(request.module, "PAIR_MODELS", STARTUP_MODELS)
    flags = getattr(request.module, "PAIR_FLAGS", ())
    environment = getattr(request.module, "PAIR_ENV", {})
    with running_pair(models, *PYSTUB_VARIANTS[request.param], both_flags=flags, environment=environment) as started:
        yield started


@pytest.fixture()
def pair(_module_pair: Pair) -> Iterator[Pair]:
    """Triton and pystub on copies of tests/differential/models (started once per test file).

    A test after which Triton is no longer running fails with Triton's last log lines, and Triton
    is started again, so that one crash of the oracle is blamed on the request that caused it and
    does not fail every later test. Triton's abort on its own lock timeout under load is not
    blamed on the request: calls.ask_triton restarts it and asks again, and here it is only started
    again; a Triton that would not start again makes the next case the oracle's (oracle_faults.py)."""
    if _module_pair.triton_server.died() is not None:  # an earlier restart failed: one more try
        restart_oracle(_module_pair, "after an earlier failed start")
    yield _module_pair
    death = _module_pair.triton_server.died()
    if death is None:
        return
    if ORACLE_LOAD_FAULT in death:
        print(f"the oracle aborted on its own lock timeout after this test's answers (restarted):\n{death}")
        with contextlib.suppress(OracleUnavailable):  # the next case's setup tries once more
            restart_oracle(_module_pair, death)
        return
    _module_pair.triton_server.restart()
    pytest.fail(f"the oracle died during this test: {death}", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """When the oracle cannot answer, the case is the oracle's: a skip with the reason, retried once
    at the end of the run when the machine is quieter (oracle_faults.py)."""
    config.pluginmanager.register(OracleFaults(_HERE), "differential-oracle-faults")


def _variant_not_needed(item: pytest.Item) -> bool:
    wanted = getattr(item.module, "PYSTUB_VARIANTS_RUN", None) if isinstance(item, pytest.Function) else None
    callspec = getattr(item, "callspec", None)
    return wanted is not None and callspec is not None and callspec.params.get("_module_pair") not in wanted


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unneeded = [item for item in items if Path(str(item.fspath)).parent == _HERE and _variant_not_needed(item)]
    if unneeded:
        config.hook.pytest_deselected(items=unneeded)
        items[:] = [item for item in items if item not in set(unneeded)]
    for item in items:
        if Path(str(item.fspath)).parent != _HERE:
            continue
        key = f"{Path(str(item.fspath)).name}::{without_variant(item.name)}"
        if key in KNOWN:
            item.add_marker(pytest.mark.xfail(strict=True, reason=KNOWN[key]))
