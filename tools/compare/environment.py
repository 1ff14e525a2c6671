"""The peers' own virtual environment, `.bench/venv`: never the project's `.venv`.

What goes in, and why each pin:

    mlserver==1.7.1, uvloop<0.22    uvloop 0.22+ breaks MLServer's worker processes
    numpy<2                         Triton 2.51's Python-backend stub is built against numpy 1.x; it
                                    imports numpy from the `python3` first on its PATH, so the stub
                                    gets this venv's bin/ first on PATH
    nvidia-pytriton==0.5.13         the wheel that bundles tritonserver 2.51.0 with its Python
                                    backend (installed --no-deps: only its files are used):
                                      pytriton/tritonserver/bin/tritonserver
                                      pytriton/tritonserver/backends/python/libtriton_python.so
                                      pytriton/tritonserver/python_backend_stubs/3.X/triton_python_backend_stub
                                      nvidia_pytriton.libs/libb64-*.so.0d
    tritonclient==2.50.0            only for its bin/perf_analyzer (the newest one that runs on this
                                    glibc), installed --no-deps into .bench/tritonclient-2.50.0
    nvidia-cuda-runtime-cu12        libcudart.so.12, which perf_analyzer links even without a GPU

The bare gRPC candidates that are not grpcio (compare/bare.py, bare_h2.py) get a venv of their own,
`.bench/candidates` (`ensure_candidates`), so trying one never changes what the peers run on:

    pygrpc-native==0.5.0            grpcio-compatible servers with HTTP/2 and gRPC in Rust (tokio)
    grpclib==0.4.9, h2              gRPC on asyncio and the pure-Python h2
    hypercorn==0.18.0, h2corn==2.0.0  ASGI servers that send HTTP/2 trailers (pure Python; Rust)
    ngh2==0.3.0                     libnghttp2 as a sans-I/O Python library
    uvloop==0.23.0                  the loop each of them recommends
    grpcio, tritonclient[grpc], orjson, aiohttp   what bare.py itself imports

The C load generators of the "wrk-h2load" cells (compare/wrk_h2load.py) are Debian's packages,
installed with apt-get when missing (`ensure_load_tools`): wrk (HTTP/1.1, scripted in Lua) and
h2load from nghttp2-client (HTTP/2).

LitServe, the OpenAI-compatible server tools/bench_openai.py runs beside pystub, gets a venv of its
own too, `.bench/litserve` (`ensure_litserve`):

    litserve==0.2.19                Lightning's serving framework, with its OpenAISpec (FastAPI, uvicorn)

Triton wants a backend directory laid out as backends/python/{libtriton_python.so,
triton_python_backend_stub, triton_python_backend_utils.py}; it is assembled from symlinks in
.bench/triton/backends. perf_analyzer looks for libb64.so.0d: a symlink in .bench/lib names the
copy pytriton bundles. The stub embeds libpython, found through LD_LIBRARY_PATH.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# PYSTUB_BENCH_DIR: another place for the peers, e.g. when .bench is shared with runs that must
# not see packages change under them while the benchmark installs its extras.
BENCH = Path(os.environ.get("PYSTUB_BENCH_DIR") or ROOT / ".bench")
PYTRITON = "nvidia-pytriton==0.5.13"       # bundles tritonserver 2.51.0
PERF_ANALYZER_CLIENT = "tritonclient==2.50.0"
PEER_PACKAGES = ("mlserver==1.7.1", "uvloop<0.22", "numpy<2", "nvidia-cuda-runtime-cu12")
CANDIDATE_PACKAGES = ("pygrpc-native==0.5.0", "grpclib==0.4.9", "h2>=4,<5", "hypercorn==0.18.0", "h2corn==2.0.0",
                      "ngh2==0.3.0", "uvloop==0.23.0", "grpcio==1.85.3", "tritonclient[grpc]==2.73.0", "orjson",
                      "aiohttp")
LITSERVE_PACKAGES = ("litserve==0.2.19",)
_INSTALL_TIMEOUT = 1800
LOAD_TOOLS = {"wrk": "wrk", "h2load": "nghttp2-client"}  # program -> the Debian package that has it


@dataclass
class BenchEnv:
    """Where everything the peers need was put."""

    venv: Path
    python: Path
    site_packages: Path
    libpython_dir: str
    tritonserver: Path
    triton_backends: Path
    perf_analyzer: Path
    library_path: list[str] = field(default_factory=list)   # for perf_analyzer

    @property
    def mlserver(self) -> Path:
        return self.venv / "bin" / "mlserver"

    def perf_analyzer_env(self) -> dict[str, str]:
        """Environment in which perf_analyzer finds libb64 and libcudart."""
        paths = self.library_path + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        return dict(os.environ, LD_LIBRARY_PATH=":".join(paths))

    def triton_env(self) -> dict[str, str]:
        """Environment for tritonserver: the stub's python3 is this venv's (numpy<2), libpython on the path."""
        paths = [self.libpython_dir] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        env = dict(os.environ, PATH=f"{self.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                   LD_LIBRARY_PATH=":".join(paths))
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        return env


def _log(text: str) -> None:
    print(f"[bench env] {text}", file=sys.stderr, flush=True)


def _run(command: list[str]) -> None:
    """Run an install step; raises SystemExit with its output when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"install step failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def _stamp() -> str:
    text = "|".join((PYTRITON, PERF_ANALYZER_CLIENT, *PEER_PACKAGES, sys.version))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _query(python: Path, expression: str) -> str:
    return subprocess.run([str(python), "-c", f"print({expression})"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def ensure(install: bool = True) -> BenchEnv:
    """Create and fill .bench/venv once (a stamp file records what was installed), then locate things.

    Raises SystemExit when an install step fails or the interpreter cannot host Triton's stub.
    """
    venv = BENCH / "venv"

    def fill(pip: list[str]) -> None:
        _run([*pip, *PEER_PACKAGES])
        _run([*pip, "--no-deps", PYTRITON])
        _run([*pip, "--no-deps", "--upgrade", "--target", str(BENCH / "tritonclient-2.50.0"), PERF_ANALYZER_CLIENT])

    python = _filled_once(venv, venv / f".installed-{_stamp()}", install, fill,
                          f"installing MLServer, Triton 2.51 ({PYTRITON}) and perf_analyzer into {venv} "
                          "(once; a few minutes)")
    return _locate(venv, python)


def ensure_candidates(install: bool = True) -> Path:
    """The python of .bench/candidates, created and filled once (wheels only: nothing is built).

    Raises SystemExit when it is missing and `install` is false, or an install step fails.
    """
    return _wheels_venv("candidates", CANDIDATE_PACKAGES, install, "the bare gRPC candidates")


def ensure_litserve(install: bool = True) -> Path:
    """The python of .bench/litserve, created and filled once (wheels only).

    Raises SystemExit when it is missing and `install` is false, or an install step fails.
    """
    return _wheels_venv("litserve", LITSERVE_PACKAGES, install, "LitServe")


def _wheels_venv(name: str, packages: tuple[str, ...], install: bool, what: str) -> Path:
    venv = BENCH / name
    stamp = venv / f".installed-{hashlib.sha256('|'.join(packages).encode()).hexdigest()[:16]}"
    return _filled_once(venv, stamp, install, lambda pip: _run([*pip, "--only-binary", ":all:", *packages]),
                        f"installing {what} into {venv} (once)")


def _filled_once(venv: Path, stamp: Path, install: bool, fill: Callable[[list[str]], None], announce: str) -> Path:
    """The python of `venv`, created and filled by `fill(pip command)` once (`stamp` records it).

    Raises SystemExit when it is not filled and `install` is false, or an install step fails.
    """
    python = venv / "bin" / "python"
    if not stamp.exists():
        if not install:
            raise SystemExit(f"{venv} is not set up; run without --no-install once")
        _log(announce)
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)])
        fill([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        stamp.touch()
    return python


def _locate(venv: Path, python: Path) -> BenchEnv:
    site = Path(_query(python, "__import__('sysconfig').get_paths()['purelib']"))
    if _query(python, "__import__('sysconfig').get_config_var('Py_ENABLE_SHARED')") != "1":
        raise SystemExit(f"{python} has no shared libpython: Triton's Python-backend stub cannot embed it")
    libpython_dir = _query(python, "__import__('sysconfig').get_config_var('LIBDIR')")
    version = _query(python, "'%d.%d' % __import__('sys').version_info[:2]")
    dist = site / "pytriton" / "tritonserver"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"{PYTRITON} has no Python-backend stub for Python {version}")
    backends = BENCH / "triton" / "backends"
    _link(backends / "python" / "libtriton_python.so", dist / "backends" / "python" / "libtriton_python.so")
    _link(backends / "python" / "triton_python_backend_utils.py",
          dist / "backends" / "python" / "triton_python_backend_utils.py")
    _link(backends / "python" / "triton_python_backend_stub", stub)
    libb64 = sorted((site / "nvidia_pytriton.libs").glob("libb64*.so*"))
    if libb64:
        _link(BENCH / "lib" / "libb64.so.0d", libb64[0])
    perf_analyzer = BENCH / "tritonclient-2.50.0" / "bin" / "perf_analyzer"
    for binary in (dist / "bin" / "tritonserver", stub, perf_analyzer):
        if binary.exists():
            binary.chmod(binary.stat().st_mode | 0o111)
    return BenchEnv(venv=venv, python=python, site_packages=site, libpython_dir=libpython_dir,
                    tritonserver=dist / "bin" / "tritonserver", triton_backends=backends,
                    perf_analyzer=perf_analyzer,
                    library_path=[str(BENCH / "lib"), str(site / "nvidia" / "cuda_runtime" / "lib")])


def _link(link: Path, target: Path) -> None:
    """`link` -> `target`, made so that concurrent callers cannot fail each other: test workers
    and other checkouts sharing one .bench (through a symlinked path that differs per checkout)
    all call this. A link that already reaches the same file is left alone; a new one is made
    under a private name and renamed over the old (rename is atomic; unlink-then-create is not)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and os.path.realpath(link) == os.path.realpath(target):
        return
    fresh = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()
    fresh.symlink_to(target)
    os.replace(fresh, link)


def ensure_load_tools(install: bool = True) -> str | None:
    """None when wrk and h2load are on PATH (installed now with apt-get if missing and `install`),
    else why not, in words for the report's notes."""
    missing = [program for program in LOAD_TOOLS if shutil.which(program) is None]
    if not missing:
        return None
    packages = sorted({LOAD_TOOLS[program] for program in missing})
    command = f"apt-get update && apt-get install -y {' '.join(packages)}"
    if not install:
        return f"{', '.join(missing)} missing (--no-install): install them with `{command}`"
    _log(f"installing {', '.join(missing)}: {command}")
    try:
        _run(["apt-get", "update"])
        _run(["apt-get", "install", "-y", *packages])
    except (SystemExit, OSError, subprocess.TimeoutExpired) as error:
        return f"{', '.join(missing)} missing and `{command}` failed ({str(error).strip()[-300:]})"
    still = [program for program in missing if shutil.which(program) is None]
    return f"{', '.join(still)} still missing after `{command}`" if still else None


def perf_analyzer_works(env: BenchEnv) -> str | None:
    """None when perf_analyzer starts here, else why not (its loader's complaint)."""
    if not env.perf_analyzer.exists():
        return f"{env.perf_analyzer} missing"
    try:
        result = subprocess.run([str(env.perf_analyzer), "--version"], capture_output=True, text=True, timeout=60,
                                env=env.perf_analyzer_env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if "Perf Analyzer" not in result.stdout + result.stderr:
        return (result.stderr or result.stdout).strip()[-300:] or f"exit {result.returncode}"
    return None
