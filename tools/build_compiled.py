#!/usr/bin/env python3
"""Build the compiled hot path: the modules a request crosses, compiled with Cython (pure-Python mode).

Off by default: measured end to end, no compiled set spends less CPU per request than pure Python
(docs/compiled.md); this is the opt-in. The sources stay plain typed Python; each module of the
chosen set (`--modules`: by default the modules of `HOT_MODULES` with no coroutine) becomes one
extension module, written beside its siblings in a separate tree,
`pystub_backend/_native/pystub_backend/...`, with a manifest naming the compiler and each source's
SHA-256. `pystub_backend/_native_loader.py` loads an extension only when its source still has that
hash (a stale one is reported and its `.py` runs) and never when PYSTUB_PURE_PYTHON=1. The `.py`
files are never shadowed in place.

    .venv/bin/python tools/build_compiled.py            # build when a source or the compiler changed
    .venv/bin/python tools/build_compiled.py --check    # exit 1 when a build is due, build nothing
    .venv/bin/python tools/build_compiled.py --clean    # remove the compiled tree (pure Python)
    .venv/bin/python tools/build_compiled.py --modules all   # every hot module, coroutines included

Exits 0 when the tree is up to date or was built; 1 when the compiler is missing or the build
failed, saying why on stderr (the package then runs pure Python, as it says at start-up).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.machinery
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pystub_backend"
NATIVE = PACKAGE / "_native"
MANIFEST = NATIVE / "manifest.json"
_BACKEND = "pystub_backend.backend."
# What a unary request and a streamed response cross, in both processes (docs/compiled.md says why
# each group is here and what is left out). Left out on purpose: modules whose functions tests
# replace or inspect by frame (pb_utils._logger walks its callers' frames), the gRPC listener, and
# anything the request path does not touch.
HOT_MODULES = (
    # backend: HTTP request parsing and response encoding
    *(f"{_BACKEND}frontends.http.{m}" for m in ("server", "codec", "raw", "json_body",
                                               "json_tensors")),
    # backend: gRPC servicer and codec (the transport, frontends/grpc/listener.py, stays Python)
    *(f"{_BACKEND}frontends.grpc.{m}" for m in ("servicer", "codec", "protobuf_wire", "stream")),
    # backend: the request's vocabulary, dispatch, validation and scheduling
    *(f"{_BACKEND}{m}" for m in ("inference", "response_stream", "errors", "core.serving", "core.table",
                                 "models.version", "models.validation", "scheduling.base",
                                 "scheduling.default", "scheduling.request_queue", "scheduling.choice",
                                 "scheduling.dynamic", "telemetry.statistics", "telemetry.latency")),
    # backend: the exchange with a stub and the response's assembly
    *(f"{_BACKEND}supervision.{m}" for m in ("exchange", "frames", "outbox", "output", "instance",
                                            "handlers")),
    # both processes: ipc framing, wire records, messages, tensors in arenas
    *(f"pystub_backend.ipc.{m}" for m in ("wire", "channel", "records", "tensors", "arena", "allocator",
                                          "segment", "bytes_codec", "dtypes", "messages.core",
                                          "messages.catalogue", "messages.to_backend")),
    # stub: the request loop and pb_utils' request, tensor and response objects
    *(f"pystub_backend.stub.{m}" for m in ("stub", "reader", "senders", "translate", "executor", "handlers",
                                           "event_loop", "execute_batch", "output_buffers", "batched",
                                           "pb_utils._tensor", "pb_utils._request", "pb_utils._response",
                                           "pb_utils._sender", "pb_utils._binding", "pb_utils._types")),
)
# Cython directives: semantics of the Python source unchanged. annotation_typing off: annotations
# stay documentation (on, `x: float` becomes a C double and `x: list` refuses subclasses, which
# typed Python does not promise); binding on: functions keep their Python signatures and pickle.
# After Python's own flags (-O3 -g), so these win: -O1 compiles in about half the time of -O3 and the
# generated code (mostly calls into the C API) runs at the same speed; no debug info.
CFLAGS = ("-O1", "-g0")
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True, "embedsignature": False,
              "always_allow_keywords": True}


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def is_synchronous(module: str) -> bool:
    """True when the module has no coroutine (`async def`, `await`, `async for/with`): CPython 3.11
    resumes its own coroutines inline, a compiled coroutine goes through the generic send path."""
    tree = ast.parse(source_path(module).read_text())
    coroutine = (ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith, ast.Await)
    return not any(isinstance(node, coroutine) for node in ast.walk(tree))


# Which of HOT_MODULES a build compiles: `sync` (the modules with no coroutine: the default, the set
# that cost least CPU per request end to end, at parity with pure Python; docs/compiled.md), or `all`.
MODULE_SETS = ("sync", "all")


def selected_modules(module_set: str) -> tuple[str, ...]:
    if module_set == "sync":
        return tuple(m for m in HOT_MODULES if is_synchronous(m))
    return HOT_MODULES


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compiler_version() -> str | None:
    """`cython <version>`, or None when Cython is not importable here."""
    try:
        import Cython
    except ImportError:
        return None
    return f"cython {Cython.__version__}"


def wanted_manifest(compiler: str, modules: tuple[str, ...]) -> dict[str, object]:
    """The manifest a fresh build of this checkout would write (what the stamp compares)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return {"compiler": compiler, "directives": DIRECTIVES, "cflags": list(CFLAGS), "suffix": suffix,
            "modules": {m: source_hash(source_path(m)) for m in modules}}


def build_due(compiler: str, hot: tuple[str, ...]) -> str | None:
    """Why a build is due (None: the compiled tree matches every source and the compiler)."""
    try:
        current = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return "no compiled tree yet"
    wanted = wanted_manifest(compiler, hot)
    for key in ("compiler", "directives", "cflags", "suffix"):
        if current.get(key) != wanted[key]:
            return f"{key} changed: {current.get(key)} -> {wanted[key]}"
    modules = current.get("modules", {})
    changed = [m for m, digest in wanted["modules"].items() if modules.get(m) != digest]  # type: ignore[union-attr]
    if changed or set(modules) != set(wanted["modules"]):  # type: ignore[arg-type]
        return f"sources changed: {', '.join(changed) or 'the module list'}"
    return None


def _compile(staging: Path, jobs: int, hot: tuple[str, ...]) -> None:
    """Cythonize and compile every hot module into `staging` (raises what failed)."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    extensions = [Extension(m, [str(source_path(m).relative_to(ROOT))], extra_compile_args=list(CFLAGS))
                  for m in hot]
    cwd = os.getcwd()
    os.chdir(ROOT)  # relative sources: tracebacks name `pystub_backend/...py`, wherever it is built
    try:
        modules = cythonize(extensions, compiler_directives=DIRECTIVES, build_dir=str(staging / "c"),
                            nthreads=jobs, quiet=True, force=True)
        dist = Distribution({"ext_modules": modules, "script_name": "build_compiled.py"})
        build = dist.get_command_obj("build_ext")
        build.build_lib = str(staging / "lib")  # type: ignore[attr-defined]
        build.build_temp = str(staging / "obj")  # type: ignore[attr-defined]
        build.parallel = jobs  # type: ignore[attr-defined]
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)


def build(compiler: str, jobs: int, modules: tuple[str, ...]) -> None:
    """Compile into a staging directory, then swap it in whole: an interrupted build leaves the
    previous tree (or none), never a mix; the manifest is written last."""
    wanted = wanted_manifest(compiler, modules)
    with tempfile.TemporaryDirectory(prefix="pystub-native-", dir=PACKAGE) as tmp:
        staging = Path(tmp)
        _compile(staging, jobs, modules)
        tree = staging / "lib"
        (tree / "manifest.json").write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
        clean()
        tree.rename(NATIVE)


def clean() -> None:
    shutil.rmtree(NATIVE, ignore_errors=True)


def _cpu_seconds() -> float:
    """CPU time of this process and its children (the compilers): what the build costs a quiet machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a build is due; build nothing")
    parser.add_argument("--clean", action="store_true", help="remove the compiled tree")
    parser.add_argument("--modules", choices=MODULE_SETS, default=MODULE_SETS[0],
                        help="the hot modules with no coroutine (default), or all of them")
    parser.add_argument("--force", action="store_true", help="build even when up to date")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler jobs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clean:
        clean()
        return 0
    compiler = compiler_version()
    if compiler is None:
        print("build_compiled: Cython is not installed (pip install -e '.[compiled]'): "
              "pystub runs pure Python", file=sys.stderr)
        return 1
    modules = selected_modules(args.modules)
    due = "--force" if args.force else build_due(compiler, modules)
    if due is None or args.check:
        print(f"build_compiled: {'build due: ' + due if due else 'up to date'} ({len(modules)} modules)")
        return 1 if due and args.check else 0
    started = time.monotonic()
    print(f"build_compiled: building {len(modules)} {args.modules} modules with {compiler} ({due})", flush=True)
    try:
        build(compiler, args.jobs, modules)
    except Exception as error:  # noqa: BLE001 - any compiler failure: say it, run pure Python
        clean()
        print(f"build_compiled: BUILD FAILED ({type(error).__name__}: {error}): pystub runs pure Python",
              file=sys.stderr)
        return 1
    cpu = _cpu_seconds()
    print(f"build_compiled: built in {time.monotonic() - started:.0f} s ({cpu:.0f} s of CPU, about "
          f"{cpu / max(args.jobs, 1):.0f} s on {args.jobs} idle cores) into {NATIVE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
