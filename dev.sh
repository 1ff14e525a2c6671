#!/usr/bin/env bash
# One entry point for newcomers and CI:
#   ./dev.sh serve [pystub-backend flags...]   set up .venv, start the backend on examples/models
#   ./dev.sh test  [pytest args...]            set up .venv, run ruff, mypy, the docs build and the
#                                              whole test suite
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
# setup NAME SPEC: install SPEC into .venv unless NAME's stamp is newer than setup.cfg. Serving needs
# the package alone; the test command adds the test, dev and docs extras (one stamp each, so a
# `serve` after a `test` installs nothing and a `test` after a `serve` adds what is missing).
setup() {
    local stamp=$VENV/.installed-$1
    if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --upgrade pip
        "$VENV/bin/pip" install --quiet -e "$2"
        touch "$stamp"
    fi
}
# build_compiled: the compiled hot path is off by default (docs/compiled.md: measured end to end it
# spends no less CPU per request than pure Python). PYSTUB_BUILD_COMPILED=1 opts in: compile it
# (tools/build_compiled.py, a no-op while its manifest of source hashes matches); a missing
# compiler or a failed build is said loudly, and the run goes on in pure Python.
build_compiled() {
    [ "${PYSTUB_BUILD_COMPILED:-0}" = 1 ] || return 0
    "$VENV/bin/pip" install --quiet -e '.[compiled]'
    if ! "$VENV/bin/python" tools/build_compiled.py; then
        echo "******************************************************************************" >&2
        echo "* the compiled hot path could not be built (above): running PURE PYTHON       *" >&2
        echo "******************************************************************************" >&2
        export PYSTUB_PURE_PYTHON=1
    fi
}
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    serve)
        setup serve .
        build_compiled
        exec "$VENV/bin/pystub-backend" --model-repository examples/models "$@"
        ;;
    test)
        setup test '.[test,dev,docs]'
        build_compiled
        # Real Triton 2.51 is the oracle of tests/differential: install it into .bench/venv (once).
        # Offline, the tier fails under CI=true and skips with the reason elsewhere.
        # The reason travels to the tier in DIFFERENTIAL_TRITON_ERROR, so test workers do not retry.
        if ! triton_error=$("$VENV/bin/python" tools/triton_env.py 2>&1 >/dev/null); then
            export DIFFERENTIAL_TRITON_ERROR="${triton_error:-tools/triton_env.py failed}"
            echo "$DIFFERENTIAL_TRITON_ERROR" >&2
        fi
        # The gRPC candidates from PyPI that tests/integration/test_bare_ceilings.py checks: their own
        # venv, .bench/candidates, wheels only (once, ~15 s). Offline, those cases fail under CI=true
        # and skip elsewhere.
        "$VENV/bin/python" -c 'import sys; sys.path.insert(0, "tools")
from compare.environment import ensure_candidates; ensure_candidates()' >/dev/null \
            || echo "the bench's gRPC candidates could not be installed into .bench/candidates" >&2
        set +e
        # The checkers first (their configs: ruff.toml, setup.cfg [mypy]); the tests run either way,
        # and a finding fails the run as a failing test would.
        "$VENV/bin/ruff" check .
        lint=$?
        "$VENV/bin/mypy" pystub_backend
        types=$?
        # The docs site (mkdocs.yml): --strict turns every broken link or anchor into a failure.
        site=$(mktemp -d)
        "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$site"
        docs=$?
        rm -rf "$site"
        # Three workers on two cores: most tests wait on real servers rather than compute
        # (22 min serially, under 5 min this way). Whole files per worker keep module-scoped
        # backends shared; pass -n0 to run serially.
        "$VENV/bin/python" -m pytest -n 3 --dist loadfile "$@"
        rc=$?
        # pytest exits 5 when it collected no tests: not a failure of the project
        [ $rc -eq 5 ] && { echo "pytest collected no tests"; rc=0; }
        [ $lint -ne 0 ] && { echo "ruff reported findings (above)"; [ $rc -eq 0 ] && rc=1; }
        [ $types -ne 0 ] && { echo "mypy reported errors (above)"; [ $rc -eq 0 ] && rc=1; }
        [ $docs -ne 0 ] && { echo "mkdocs build --strict failed (above)"; [ $rc -eq 0 ] && rc=1; }
        [ -n "${PYSTUB_PURE_PYTHON:-}" ] && echo "NOTE: this run was PURE PYTHON (PYSTUB_PURE_PYTHON=$PYSTUB_PURE_PYTHON)" >&2
        exit $rc
        ;;
    *)
        echo "usage: ./dev.sh serve [flags] | ./dev.sh test [pytest args]" >&2
        exit 2
        ;;
esac
