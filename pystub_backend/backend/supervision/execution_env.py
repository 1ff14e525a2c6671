"""`EXECUTION_ENV_PATH`: run a model's stub in its own Python environment
(docs/reference/model-api.md#config-fields-the-backend-reads).

The parameter names an unpacked environment (a directory with `bin/activate`) or a `.tar.gz`
(conda-pack) archive, with `$$TRITON_MODEL_DIRECTORY` standing for the model directory. An
archive is unpacked once into a private cache keyed by its path and mtime; entries with absolute
paths, `..`, or links that point outside the archive are refused before anything is written.

The cache is `$XDG_CACHE_HOME/pystub-envs`, else `<tmp>/pystub-envs-<uid>`. The second is a
predictable name in a directory everyone can write, so another user could plant it (with an
environment inside) before the server first runs: at every use the cache directory must be a real
directory (not a symlink) owned by the server's user with no group or other permissions, and a
cached environment a directory of ours; anything else is refused with a message saying what to do.

The stub then starts as `bash -c 'source <env>/bin/activate && exec python -m pystub...'`, so the
environment's interpreter runs with pystub on PYTHONPATH (that interpreter needs numpy, msgpack
and posix_ipc).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tarfile
import tempfile

__all__ = ["ExecutionEnvError", "resolve_execution_env", "interpreter_command", "check_archive_members",
           "check_private_directory"]

log = logging.getLogger("pystub.env")
_PLACEHOLDER = "$$TRITON_MODEL_DIRECTORY"


class ExecutionEnvError(Exception):
    """The environment is missing or unsafe; the message says which and why."""


def check_private_directory(path: str, what: str, check_mode: bool = True) -> None:
    """Refuse `path` unless it is a directory (not a symlink) owned by this process's user with no
    group or other permissions (`check_mode`; an environment inside the private cache keeps the
    modes its archive gave it). Raises ExecutionEnvError."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ExecutionEnvError(f"{what} '{path}' cannot be used: {exc.strerror or exc}") from exc
    why = ""
    if stat.S_ISLNK(info.st_mode):
        why = "it is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        why = "it is not a directory"
    elif info.st_uid != os.geteuid():
        why = f"it is owned by uid {info.st_uid}, not by the server's user (uid {os.geteuid()})"
    elif check_mode and stat.S_IMODE(info.st_mode) & 0o077:
        why = f"its mode is {stat.S_IMODE(info.st_mode):04o}, not 0700"
    if why:
        raise ExecutionEnvError(f"{what} '{path}' is refused: {why}; remove it, or set XDG_CACHE_HOME to a "
                                f"directory of the server's user")


def _cache_root() -> str:
    """The private cache directory, created 0700 if missing and checked at every use."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        os.makedirs(xdg, mode=0o700, exist_ok=True)
        root = os.path.join(xdg, "pystub-envs")
    else:
        root = os.path.join(tempfile.gettempdir(), f"pystub-envs-{os.geteuid()}")
    try:
        os.mkdir(root, 0o700)  # the leaf only: never makedirs through a path someone else prepared
    except FileExistsError:
        pass
    check_private_directory(root, "execution environment cache")
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
    root = _cache_root()
    destination = os.path.join(root, key)
    if os.path.lexists(destination):
        check_private_directory(destination, "cached execution environment", check_mode=False)
        return destination
    log.info("Extracting Python execution env %s", archive)
    staging = tempfile.mkdtemp(prefix=key + ".", dir=root)
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
