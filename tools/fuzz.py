#!/usr/bin/env python3
"""Long fuzzing runs: the CI fuzz tests with many more cases.

    tools/fuzz.py                         about 100 000 cases (15x what CI runs)
    tools/fuzz.py --examples 1000000      a million
    tools/fuzz.py --only codecs           one part: codecs (in process), frontends (a real
                                          server over HTTP and gRPC), ipc (corrupt frames between
                                          a real backend and stub), access (state-changing calls
                                          from a non-loopback peer, model names of any content)
    tools/fuzz.py --seed 1234             hypothesis' seed, to reproduce a run

It runs tests/unit/test_fuzz_codecs.py, tests/integration/test_fuzz_frontends.py,
tests/integration/test_fuzz_ipc.py and tests/integration/test_fuzz_access.py under pytest with
PYSTUB_FUZZ_SCALE set so that their cases add up to --examples (each test keeps its share), with
pytest's per-test timeouts off. A failing case is printed by hypothesis as the smallest example it
could find. Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = {
    "codecs": "tests/unit/test_fuzz_codecs.py",
    "frontends": "tests/integration/test_fuzz_frontends.py",
    "ipc": "tests/integration/test_fuzz_ipc.py",
    "access": "tests/integration/test_fuzz_access.py",
}
CI_CASES = {"codecs": 3400, "frontends": 2550, "ipc": 1000, "access": 700}  # the CI counts (scale 1), per part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000, help="total cases (default 100000)")
    parser.add_argument("--only", choices=sorted(PARTS), action="append", help="run only this part (repeatable)")
    parser.add_argument("--seed", help="hypothesis seed")
    args, extra = parser.parse_known_args(argv)
    parts = args.only or list(PARTS)
    scale = args.examples / sum(CI_CASES[part] for part in parts)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "timeout=0",
               "-o", "faulthandler_timeout=0", "--hypothesis-show-statistics", *[PARTS[p] for p in parts], *extra]
    if args.seed:
        command.append(f"--hypothesis-seed={args.seed}")
    print(f"fuzzing {', '.join(parts)} with about {args.examples} cases (scale {scale:.2f} of CI)", flush=True)
    env = dict(os.environ, PYSTUB_FUZZ_SCALE=f"{scale:.4f}")
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
