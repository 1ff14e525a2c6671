#!/usr/bin/env python3
"""Two versions of pystub's IPC in one run: this tree and a baseline git ref (default `main`),
by running tools/bench_ipc.py of each tree in alternation, so both see the same machine load.

Made to compare anonymous memfd arenas against the named /dev/shm ones they replaced: the baseline is checked out
into a temporary detached worktree, measured with this tree's interpreter, and removed at the end.

    tools/bench_arena_variants.py                          # 16 B, 16 MiB, 64 MiB; 3 runs each
    tools/bench_arena_variants.py --baseline <ref> --runs 5 --sizes 16,64M
    tools/bench_arena_variants.py --baseline-tree <dir>    # an existing checkout instead of a ref

Prints, per size, the median round trip and bandwidth of each variant and their ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A row of bench_ipc.py's table: size, rounds, pystub round trip (value unit), ..., pystub BW.
_ROW = re.compile(r"^\s*(\d+ (?:B|KiB|MiB|GiB))\s+\d+\s+([\d.]+) (us|ms|s)\s+\S+\s+([\d.]+) GB/s")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def measure(tree: Path, sizes: str) -> dict[str, tuple[float, float]]:
    """One bench_ipc.py run of `tree`: size -> (round trip seconds, GB/s)."""
    done = subprocess.run([sys.executable, str(tree / "tools" / "bench_ipc.py"), "--sizes", sizes],
                          capture_output=True, text=True, timeout=1800, cwd=str(tree))
    if done.returncode != 0:
        raise SystemExit(f"bench_ipc.py of {tree} failed:\n{done.stderr[-2000:]}")
    rows = {}
    for line in done.stdout.splitlines():
        match = _ROW.match(line)
        if match:
            size, value, unit, bandwidth = match.groups()
            rows[size] = (float(value) * _SCALE[unit], float(bandwidth))
    return rows


def compare(baseline: Path, sizes: str, runs: int) -> None:
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {"this tree": {}, "baseline": {}}
    for run in range(runs):
        for name, tree in (("baseline", baseline), ("this tree", ROOT)):
            for size, value in measure(tree, sizes).items():
                samples[name].setdefault(size, []).append(value)
            print(f"run {run + 1}/{runs}: {name} measured", file=sys.stderr)
    print(f"{'size':>8} {'variant':>10} {'median rt':>12} {'median BW':>11}   per-run round trips")
    for size in samples["baseline"]:
        medians = {}
        for name in ("baseline", "this tree"):
            values = samples[name].get(size, [])
            rt = statistics.median(v[0] for v in values)
            bw = statistics.median(v[1] for v in values)
            medians[name] = (rt, bw)
            runs_text = ", ".join(f"{v[0] * 1e6:.1f} us" for v in values)
            print(f"{size:>8} {name:>10} {rt * 1e6:>9.1f} us {bw:>7.2f} GB/s   {runs_text}")
        (base_rt, base_bw), (rt, bw) = medians["baseline"], medians["this tree"]
        print(f"{size:>8} {'ratio':>10} {rt / base_rt:>11.3f}x {bw / base_bw if base_bw else 0:>10.3f}x"
              f"   (this tree / baseline; round trip lower is better, BW higher)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline (default: main)")
    parser.add_argument("--baseline-tree", type=Path, help="an existing checkout to use as the baseline")
    parser.add_argument("--sizes", default="16,16M,64M", help="passed to bench_ipc.py (default 16,16M,64M)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per variant (default 3)")
    args = parser.parse_args(argv)
    if args.baseline_tree is not None:
        compare(args.baseline_tree.resolve(), args.sizes, args.runs)
        return 0
    with tempfile.TemporaryDirectory(prefix="pystub-baseline-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline],
                       check=True, capture_output=True, timeout=120)
        try:
            compare(tree, args.sizes, args.runs)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True, timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
