"""The parameters of a model load request, and the private directory that file overrides form
(docs/reference/protocol.md#model-repository-extension).

    {"config": "<ModelConfig JSON>", "file:1/model.py": b"...", ...}
        │
        ├─ config   → replaces config.pbtxt
        └─ file:*   → <tmp>/pystub_override_<pid>_XXXX/ (0700) / <model> / 1/model.py ...
                      the model directory for this load; removed when the model is unloaded,
                      or at the next start-up if the server that made it was killed

Paths come from the network, so they are checked before anything is written: relative to the
model directory (one leading `/` is allowed and means the same, as in Triton: `file:/1/model.py`
is `1/model.py`), no `..`, no empty or `.` components, and the resolved file must stay inside the
directory. Files are
created with O_EXCL | O_NOFOLLOW in a directory nobody else can write to.

Caps, checked before anything is written (a load is refused with 400 / INVALID_ARGUMENT above them):
at most MAX_OVERRIDE_FILES files holding MAX_OVERRIDE_BYTES in total, and paths of at most
MAX_OVERRIDE_PATH_LENGTH characters and MAX_OVERRIDE_PATH_DEPTH components. Why: the files are
written in a worker thread (`OverrideDir.create_off_loop`), but the request that carries them is
parsed and base64-decoded while holding the interpreter lock, so its size bounds how long health
probes can wait; a model directory of a Python model holds a handful of files. The path caps keep
a 3,000-level path from reaching `os.makedirs` (which recurses per level) and the kernel's PATH_MAX.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.ipc.names import pid_alive

__all__ = ["FILE_PREFIX", "MAX_OVERRIDE_BYTES", "MAX_OVERRIDE_FILES", "LoadRequest",
           "OverrideDir", "check_override_count", "parse_load_parameters", "override_file_path",
           "sweep_stale_override_dirs"]

FILE_PREFIX = "file:"
_DIR_PREFIX = "pystub_override_"
MAX_OVERRIDE_FILES = 1024
MAX_OVERRIDE_BYTES = 16 * 2**20
MAX_OVERRIDE_PATH_LENGTH = 1024
MAX_OVERRIDE_PATH_DEPTH = 32


@dataclass
class LoadRequest:
    """What a load request asks for: a config override (JSON text) and override files."""

    config: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


def parse_load_parameters(parameters: Mapping[str, Any]) -> LoadRequest:
    """Check a load request's parameters (values already decoded by the frontend: `config` a str,
    file contents bytes). Raises ServerError (INVALID_ARG)."""
    request = LoadRequest()
    check_override_count(parameters)
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise _invalid("Load parameter 'config' must be a string holding the model configuration JSON")
            request.config = value or None  # "" is pb_utils.load_model's "no override"
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, (bytes, bytearray)):
                raise _invalid(f"Load parameter '{key}' must carry the file content as bytes")
            override_file_path(key)
            request.files[key] = bytes(value)
        else:
            raise _invalid(f"Unrecognized load parameter '{key}'")
    _check_total_size(request.files)
    if request.files and request.config is None:
        raise _invalid("Load parameter 'config' must be specified for model file override")
    return request


def check_override_count(parameters: Mapping[str, object]) -> None:
    """Refuse more than MAX_OVERRIDE_FILES `file:` keys, before any per-file work. Raises ServerError."""
    count = sum(1 for key in parameters if key.startswith(FILE_PREFIX))
    if count > MAX_OVERRIDE_FILES:
        raise _invalid(f"a load may carry at most {MAX_OVERRIDE_FILES} override files, got {count}")


def _check_total_size(files: Mapping[str, bytes]) -> None:
    total = sum(len(content) for content in files.values())
    if total > MAX_OVERRIDE_BYTES:
        raise _invalid(f"the override files of a load may hold at most {MAX_OVERRIDE_BYTES} bytes, got {total}")


def override_file_path(key: str) -> str:
    """The path relative to the model directory that a `file:<path>` key names (Triton joins the
    key to the model directory, so one leading `/` changes nothing). Raises ServerError for a path
    that is empty, still absolute, or has `..`, `.` or empty components."""
    path = key[len(FILE_PREFIX):]
    if path.startswith("/"):
        path = path[1:]
    why = ""
    if len(path) > MAX_OVERRIDE_PATH_LENGTH or path.count("/") >= MAX_OVERRIDE_PATH_DEPTH:
        why = (f"the path is longer than {MAX_OVERRIDE_PATH_LENGTH} characters or "
               f"{MAX_OVERRIDE_PATH_DEPTH} components")
        key = key[:64] + "..."  # the message need not carry the whole of it
    elif not path or "\0" in path:
        why = "the path is empty or holds a NUL character"
    elif os.path.isabs(path):
        why = "the path is absolute"
    elif ".." in path.split("/"):
        why = "the path contains '..'"
    elif any(part in ("", ".") for part in path.split("/")):
        why = "the path has an empty or '.' component"
    if why:
        raise _invalid(f"Invalid file override '{key}': {why}; paths are relative to the model directory")
    return path


class OverrideDir:
    """A private directory holding one model's override files. `remove()` is idempotent."""

    def __init__(self, root: str, model_dir: str) -> None:
        self.root = root
        self.model_dir = model_dir

    @classmethod
    def create(cls, model_name: str, files: Mapping[str, bytes]) -> OverrideDir:
        """Write `files` below a new 0700 directory. Raises ServerError; leaves nothing behind."""
        root = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}_")  # mode 0700
        directory = cls(root, os.path.join(root, model_name))
        try:
            os.mkdir(directory.model_dir, 0o700)
            for key, content in files.items():
                directory._write(override_file_path(key), content, key)
        except BaseException:
            directory.remove()
            raise
        return directory

    @classmethod
    async def create_off_loop(cls, model_name: str, files: Mapping[str, bytes]) -> OverrideDir:
        """`create` in a worker thread, so that writing many files does not stall the event loop
        (health probes answer meanwhile). A caller cancelled meanwhile leaves nothing behind: the
        directory is removed once the thread is done. Raises ServerError."""
        future = asyncio.get_running_loop().run_in_executor(None, cls.create, model_name, files)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_remove_created)
            raise

    def _write(self, relative: str, content: bytes, key: str) -> None:
        target = os.path.join(self.model_dir, relative)
        base = os.path.realpath(self.model_dir)
        if not os.path.realpath(target).startswith(base + os.sep):
            raise _invalid(f"Invalid file override '{key}': the path leaves the model directory")
        try:
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _invalid(f"Invalid file override '{key}': {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _remove_created(future: asyncio.Future[OverrideDir]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().remove()


def sweep_stale_override_dirs() -> list[str]:
    """Remove the override directories of servers that died without cleaning up (ours only: same
    owner, dead pid). Returns the paths removed."""
    removed = []
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        if not name.startswith(_DIR_PREFIX):
            continue
        pid_text = name[len(_DIR_PREFIX):].split("_", 1)[0]
        path = os.path.join(base, name)
        try:
            owned = os.lstat(path).st_uid == os.getuid()
        except OSError:
            continue
        if owned and pid_text.isdigit() and not pid_alive(int(pid_text)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
