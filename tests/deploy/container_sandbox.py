"""Running the image's entrypoint as the container would, without a container engine.

`ContainerBackend` reads ENTRYPOINT, CMD and HEALTHCHECK from deploy/Dockerfile and runs that
command inside a private mount namespace (`unshare --mount`) that reproduces what the container
gives the server: a 64 MiB tmpfs on /dev/shm (Docker's default `--shm-size`), the model repository
mounted read-only, and uid/gid 1000 with no capabilities (the image's USER). Listeners bind to
127.0.0.1 (the image's 0.0.0.0 is overridden: tests stay on loopback). Directories that uid 1000
cannot enter on the way to the interpreter (a root-owned pyenv, say) are shimmed in the same
namespace by bind-mounting only the entries needed into a world-readable layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ROOT, Backend, make_repository

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
UID = 1000
SHM_BYTES = 64 * 2**20


def dockerfile_instruction(name: str) -> list[str]:
    """The exec-form (JSON) arguments of the last `name` instruction in deploy/Dockerfile, with
    backslash continuations joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found = [line for line in text.splitlines() if line.startswith(name + " ")]
    if not found:
        raise AssertionError(f"deploy/Dockerfile has no {name} instruction")
    body = found[-1][len(name) + 1:]
    body = body[body.index("CMD ") + 4:] if name == "HEALTHCHECK" else body
    return list(json.loads(body))


def _closed_directories(paths: list[Path]) -> dict[Path, set[str]]:
    closed: dict[Path, set[str]] = {}
    for path in paths:
        for depth in range(1, len(path.parts)):
            directory = Path(*path.parts[:depth])
            if not directory.stat().st_mode & stat.S_IXOTH:
                closed.setdefault(directory, set()).add(path.parts[depth])
    return closed


def unavailable() -> str | None:
    """Why the sandbox cannot be made on this machine, or None."""
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"{tool}(1) is not installed"
    if os.geteuid() != 0:
        return "making a mount namespace with a tmpfs /dev/shm and switching to uid 1000 needs root"
    return None


def sandbox_wrapper(scratch: Path, repository: Path) -> list[str]:
    """The command prefix: private mounts, then exec as uid 1000 (the backend keeps the pid)."""
    script = [f"mount -t tmpfs -o size={SHM_BYTES},mode=1777 tmpfs /dev/shm",
              f"mount --bind '{repository}' '{repository}'",
              f"mount -o remount,bind,ro '{repository}'"]
    needed = [Path(os.path.realpath(sys.executable)), Path(sys.base_prefix), Path(sys.prefix), ROOT, repository]
    for number, (directory, entries) in enumerate(sorted(_closed_directories(needed).items())):
        layer = scratch / f"shim{number}"
        layer.mkdir(mode=0o755)
        for entry in sorted(entries):
            (layer / entry).mkdir(mode=0o755)
            script.append(f"mount --bind '{directory / entry}' '{layer / entry}'")
        script.append(f"mount --rbind '{layer}' '{directory}'")
    script.append('exec "$@"')
    drop = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(script), "sh", *drop]


def probe(wrapper: list[str], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*wrapper, *command], capture_output=True, text=True, timeout=60, cwd="/")


@contextlib.contextmanager
def sandboxed_repository(prefix: str, *models: str) -> Iterator[tuple[Path, list[str]]]:
    """(repository of `models`, command prefix) in a scratch directory uid 1000 can read; skips the
    test when this machine cannot make the sandbox; removes the scratch directory afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    scratch.chmod(0o755)
    try:
        repository = make_repository(scratch, *models)
        for path in [repository, *repository.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        wrapper = sandbox_wrapper(scratch, repository)
        check = probe(wrapper, "true")
        if check.returncode != 0:
            pytest.skip(f"cannot make the container sandbox here (unshare --mount, tmpfs, setpriv): "
                        f"{check.stderr[-400:]}")
        yield repository, wrapper
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], timeout=60, check=False)


class ContainerBackend(Backend):
    """The Dockerfile's ENTRYPOINT + CMD, run by the project's interpreter inside the sandbox."""

    def __init__(self, repository: Path, wrapper: list[str], *args: str) -> None:
        super().__init__(repository, *args, wrapper=wrapper)

    def command(self) -> list[str]:
        entrypoint, cmd = dockerfile_instruction("ENTRYPOINT"), dockerfile_instruction("CMD")
        assert entrypoint[0] == "pystub-backend", entrypoint
        cmd = [f"--model-repository={self.repository}" if a == "--model-repository=/models" else a for a in cmd]
        loopback = [f"--{name}-address=127.0.0.1" for name in ("http", "grpc", "metrics")]
        ports = ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
        return [*self.wrapper, sys.executable, "-m", "pystub_backend.backend", *entrypoint[1:], *cmd, *loopback,
                *ports, *self.args]
