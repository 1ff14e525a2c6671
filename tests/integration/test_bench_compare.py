"""tools/bench_compare.py, pystub and the floor only: it starts a server, measures, prints the table, cleans up.

The full comparison (Triton, MLServer, perf_analyzer) installs peers into .bench/ and runs for
most of an hour: a documented manual command (docs/comparing.md#comparing-with-triton-and-mlserver), not
a CI test. This one downloads nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from harness import ROOT


def test_bench_compare_pystub_only() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--quick", "--servers", "pystub",
                          "--loadgen", "asyncio", "--models", "identity_fp32", "--sizes", "16", "--concurrency", "2",
                          "--seconds", "0.5", "--warmup", "0.2", "--protocols", "grpc,http", "--ceilings", "none"],
                         capture_output=True, text=True, timeout=90, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("identity_fp32")]
    plain = [line for line in rows if " yes " not in line]
    assert len(plain) == 2, run.stdout  # 16 B x concurrency 2 x grpc, http
    for line in plain:
        throughput = float(line.split("|")[1].split()[0])
        assert throughput > 0, line
    assert "Targets" in run.stdout and "health/metadata p99" in run.stdout, run.stdout
    # the server it started is gone, whatever the bench printed
    pids = [int(pid) for pid in re.findall(r"started pystub pid (\d+)", run.stderr)]
    assert pids, run.stderr[-2000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_bench_compare_json_rows_and_bare_ceilings() -> None:
    """JSON-tensor rows and two bare-frontend ceilings beside pystub; every process gone after."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--quick", "--servers", "pystub",
                          "--loadgen", "asyncio", "--models", "identity_fp32", "--sizes", "16", "--concurrency", "2",
                          "--seconds", "0.5", "--warmup", "0.2", "--no-shm", "--no-probe",
                          "--ceilings", "bare-http,bare-grpc-sync"],
                         capture_output=True, text=True, timeout=90, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split("|")[0].split()[-1]: line.split("|") for line in run.stdout.splitlines()
            if line.startswith("identity_fp32")}
    assert set(rows) == {"grpc", "http", "json"}, run.stdout
    # columns: pystub, bare-http, bare-grpc-sync; a bare server serves only its own protocol
    for proto, cells in rows.items():
        assert float(cells[1].split()[0]) > 0, cells
        bare_http, bare_grpc = cells[2].split()[0], cells[3].split()[0]
        served, idle = (bare_grpc, bare_http) if proto == "grpc" else (bare_http, bare_grpc)
        assert idle == "-" and float(served) > 0, cells
    pids = [int(pid) for pid in re.findall(r"started \S+ pid (\d+)", run.stderr)]
    assert len(pids) == 3, run.stderr[-2000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


@pytest.mark.skipif(shutil.which("wrk") is None or shutil.which("h2load") is None,
                    reason="wrk and h2load are not installed (the bench installs them with apt-get; the tests do not)")
def test_bench_compare_floor_with_wrk_and_h2load() -> None:
    """The floor measured by wrk (HTTP) and h2load (gRPC): the request path's markdown table has a
    row per protocol with CPU per request and throughput; both floor processes are gone after."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compare.py"), "--request-path", "--quick",
                          "--servers", "floor", "--loadgen", "wrk-h2load", "--models", "identity_fp32",
                          "--concurrency", "2", "--seconds", "1", "--warmup", "0.3", "--no-install"],
                         capture_output=True, text=True, timeout=110, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines()
            if line.startswith("| ") and "the floor (tools/floor)" in line]
    assert sorted(cells[0].strip() for cells in rows) == ["HTTP", "gRPC"], run.stdout
    for cells in rows:
        cpu_text, throughput = cells[4].strip(), float(cells[5].replace(",", ""))
        assert throughput > 0 and float(cpu_text.split()[0]) > 0, cells
    assert "failed" not in run.stdout, run.stdout
    pids = [int(pid) for pid in re.findall(r"started floor pid (\d+)", run.stderr)]
    assert len(pids) == 1, run.stderr[-2000:]
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE


def test_pystub_rev_exports_that_revision_and_refuses_a_bad_one() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from compare import revision

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD~1"], capture_output=True, text=True,
                            check=True).stdout.strip()
    tree, exported = revision.export(ROOT, "HEAD~1")
    try:
        assert exported == commit and tree.parent == Path("/tmp")
        assert (tree / "pystub_backend" / "backend" / "__init__.py").is_file()
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", commit, "pystub_backend"],
                                capture_output=True, text=True, check=True).stdout.split()
        assert sorted(str(p.relative_to(tree)) for p in (tree / "pystub_backend").rglob("*") if p.is_file()) \
            == sorted(listed)
    finally:
        shutil.rmtree(tree)
    with pytest.raises(SystemExit, match="not a commit"):
        revision.export(ROOT, "no-such-revision-anywhere")
