#!/usr/bin/env python3
"""mypyc against Cython (pure-Python mode) on the same modules: CPU per IPC frame, same run.

Both processes frame every request and response through `ipc.wire`, `ipc.records` and
`ipc.messages.core` (an EXECUTE frame out, an EXECUTE_DONE frame back). This copies the package
three times into a scratch directory, compiles those three modules in place in one copy with
mypyc and in another with Cython (tools/build_compiled.py's directives and flags), leaves the
third pure, then times encoding and decoding an EXECUTE and an EXECUTE_DONE frame of one 16 B
request in a subprocess per variant: process CPU time per frame pair, rounds alternating the
variants, medians. Prints each compiler's ratio pure ÷ compiled (> 1: faster than pure) and its
build time.

    .venv/bin/python tools/compare_compilers.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from build_compiled import CFLAGS, DIRECTIVES

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("pystub_backend/ipc/wire.py", "pystub_backend/ipc/records.py", "pystub_backend/ipc/messages/core.py")
_WORKLOAD = """
import sys, time
from pystub_backend.ipc import wire
from pystub_backend.ipc.messages.core import Execute, ExecuteDone
from pystub_backend.ipc.records import WireRequest, WireResponse, WireTensor
assert (wire.__file__.endswith('.so')) == (sys.argv[2] != 'pure'), wire.__file__
tensor = WireTensor('INPUT0', 'FP32', [1, 4], [0, 64, 16])
execute = Execute(7, [WireRequest(1, '', [tensor], ['OUTPUT0'], '{}', 0, 0, 0)], [])
done = ExecuteDone(7, None, [WireResponse(1, 0, None, [tensor._replace(name='OUTPUT0')], None)])
count = int(sys.argv[1])
start = time.process_time()
for _ in range(count):
    wire.decode(wire.encode(execute))
    wire.decode(wire.encode(done))
print((time.process_time() - start) / count * 1e6)
"""
_SETUP = """
import sys
from setuptools import setup
if sys.argv.pop(1) == 'mypyc':
    from mypyc.build import mypycify
    modules = mypycify({modules!r}, opt_level='1', group_name='compare_mypyc')
else:
    from Cython.Build import cythonize
    from setuptools import Extension
    modules = cythonize([Extension(p[:-3].replace('/', '.'), [p], extra_compile_args={cflags!r}) for p in {modules!r}],
                        compiler_directives={directives!r}, quiet=True)
setup(name='compare', ext_modules=modules, script_name='setup.py', script_args=['build_ext', '--inplace'])
"""


def variant(scratch: Path, name: str) -> Path:
    """A copy of the package under `scratch/name`, compiled in place by `name` unless "pure";
    returns the copy and prints the build time."""
    copy = scratch / name
    shutil.copytree(ROOT / "pystub_backend", copy / "pystub_backend",
                    ignore=shutil.ignore_patterns("_native", "__pycache__", "pystub-native-*"))
    shutil.copy(ROOT / "setup.cfg", copy / "setup.cfg")  # mypyc reads the project's [mypy] settings
    if name != "pure":
        (copy / "setup.py").write_text(_SETUP.format(modules=list(MODULES), cflags=list(CFLAGS), directives=DIRECTIVES))
        started = time.monotonic()
        built = subprocess.run([sys.executable, "setup.py", name], cwd=copy, capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"{name} build failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}")
        print(f"{name}: built {len(MODULES)} modules in {time.monotonic() - started:.0f} s", flush=True)
    return copy


def run(copy: Path, name: str, frames: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(copy), PYSTUB_PURE_PYTHON="1")  # in-place .so, no finder
    result = subprocess.run([sys.executable, "-c", _WORKLOAD, str(frames), name], env=env, cwd=copy,
                            check=True, capture_output=True, text=True)
    return float(result.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=20000, help="frame pairs per measurement")
    args = parser.parse_args(argv)
    names = ["pure", "cython", "mypyc"]
    with tempfile.TemporaryDirectory(prefix="pystub-compare-compilers-") as tmp:
        copies = {name: variant(Path(tmp), name) for name in names}
        results: dict[str, list[float]] = {name: [] for name in names}
        for index in range(args.rounds):
            for name in names[index % 3:] + names[:index % 3]:
                results[name].append(run(copies[name], name, args.frames))
    pure = statistics.median(results["pure"])
    print(f"CPU µs per EXECUTE + EXECUTE_DONE encode and decode, medians of {args.rounds} rounds:")
    for name in names:
        value = statistics.median(results[name])
        print(f"  {name:7} {value:7.2f} µs  ratio pure ÷ {name} {pure / value:5.2f}   "
              f"({', '.join(f'{v:.2f}' for v in results[name])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
