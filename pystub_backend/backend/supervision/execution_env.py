"""`EXECUTION_ENV_PATH`: run a model's stub in its own Python environment (API.md section 15).

The parameter names an unpacked environment (a directory with `bin/activate`) or a `.tar.gz`
(conda-pack) archive, with `$$TRITON_MODEL_DIRECTORY` standing for the model directory. An
archive is unpacked once into a private cache keyed by its path and mtime; entries with absolute
paths, `..`, or links that point outside the archive are refused before anything is written.

The stub then starts as `bash -c 'source <env>/bin/activate && exec python -m pystub...'`, so the
environment's interpreter runs with pystub on PYTHONPATH (that interpreter needs numpy, msgpack
and posix_ipc).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import tempfile

__all__ = ["ExecutionEnvError", "resolve_execution_env", "interpreter_command", "check_archive_members"]

log = logging.getLogger("pystub.env")
_PLACEHOLDER = "$$TRITON_MODEL_DIRECTORY"


class ExecutionEnvError(Exception):
    """The environment is missing or unsafe; the message says which and why."""


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(tempfile.gettempdir(), f"pystub-envs-{os.getuid()}")
    root = os.path.join(base, "pystub-envs") if os.environ.get("XDG_CACHE_HOME") else base
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def check_archive_members(members: list[tarfile.TarInfo], destination: str) -> None:
    """Refuse entries that would write outside `destination`. Raises ExecutionEnvError.

    Links are checked where they point from, lexically; an entry whose path goes through a link of
    the archive is refused too, since links that each look harmless can chain out of the
    destination once extracted (`d1 -> .`, then `d1/d2 -> ..`, then `d2/file`).
    """
    links: set[str] = set()
    for member in members:
        name = member.name
        if os.path.isabs(name):
            raise ExecutionEnvError(f"Path is absolute: '{name}'")
        parts = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
        if ".." in parts:
            raise ExecutionEnvError(f"Path contains '..': '{name}'")
        if any("/".join(parts[:depth]) in links for depth in range(1, len(parts))):
            raise ExecutionEnvError(f"Path goes through a link of the archive: '{name}'")
        if member.issym() or member.islnk():
            links.add("/".join(parts))
        target = os.path.join(destination, name)
        if member.issym():
            link = member.linkname
            resolved = link if os.path.isabs(link) else os.path.join(os.path.dirname(target), link)
            if not _inside(destination, resolved):
                raise ExecutionEnvError(f"Link escapes the archive: '{name}' -> '{link}'")
        elif member.islnk():
            if os.path.isabs(member.linkname) or ".." in member.linkname.split("/"):
                raise ExecutionEnvError(f"Link escapes the archive: '{name}' -> '{member.linkname}'")
        elif not (member.isfile() or member.isdir()):
            raise ExecutionEnvError(f"Unsupported archive entry type: '{name}'")


def _extract_members(bundle: tarfile.TarFile, destination: str, members: list[tarfile.TarInfo]) -> None:
    # Members are already checked; the "data" filter checks again as it extracts, against the links
    # really on disk (the filter argument exists from Python 3.10.12 / 3.11.4).
    try:
        bundle.extractall(destination, members=members, filter="data")
    except TypeError:
        bundle.extractall(destination, members=members)


def _extract(archive: str) -> str:
    stat = os.stat(archive)
    key = hashlib.sha256(f"{os.path.abspath(archive)}:{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    destination = os.path.join(_cache_root(), key)
    if os.path.isdir(destination):
        return destination
    log.info("Extracting Python execution env %s", archive)
    staging = tempfile.mkdtemp(prefix=key + ".", dir=_cache_root())
    try:
        with tarfile.open(archive, "r:*") as bundle:
            members = bundle.getmembers()
            check_archive_members(members, staging)
            _extract_members(bundle, staging, members)
        os.rename(staging, destination)  # atomic: a half-extracted env is never used
    except (OSError, tarfile.TarError, ExecutionEnvError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, ExecutionEnvError):
            raise
        raise ExecutionEnvError(f"failed to extract execution environment '{archive}': {exc}") from exc
    return destination


def resolve_execution_env(value: str, model_dir: str) -> str:
    """The directory holding `bin/activate` for an `EXECUTION_ENV_PATH` value. Raises ExecutionEnvError."""
    path = value.replace(_PLACEHOLDER, model_dir)
    if not os.path.exists(path):
        raise ExecutionEnvError(f"execution environment '{path}' does not exist")
    env_dir = _extract(path) if os.path.isfile(path) else path
    if not os.path.isfile(os.path.join(env_dir, "bin", "activate")):
        raise ExecutionEnvError(f"execution environment '{path}' has no bin/activate")
    return env_dir


def interpreter_command(env_dir: str) -> list[str]:
    """The command prefix that runs `python <args>` inside the activated environment."""
    activate = os.path.join(env_dir, "bin", "activate")
    return ["/bin/bash", "-c", 'source "$1" && shift && exec python "$@"', "pystub-env", activate]
