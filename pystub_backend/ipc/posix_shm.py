"""Clients' POSIX shared-memory objects, opened by name with `shm_open` (through `posix_ipc`).

Only the system shared-memory regions that clients register are opened this way; pystub's own
arenas and control blocks are anonymous memfds with no name at all (segment.py). A client
creates its object with `shm_open` (tritonclient's `shared_memory` module does) and registers its
name as the region's key; the backend and the stubs open the same name the same way.

    open_client_object(key, writable) -> fd     the caller owns the descriptor and closes it

glibc's `shm_open` opens `/dev/shm/<name>` with `O_NOFOLLOW | O_CLOEXEC` added to the flags, so a
symbolic link planted under a client's name is refused (ELOOP) rather than followed, and no child
process inherits the descriptor. Nothing here creates, resizes or unlinks an object: the client
owns it. Errors are `OSError`s with the errno and text the kernel gave, whatever exception class
`posix_ipc` chose for them.
"""

from __future__ import annotations

import errno
import os

import posix_ipc

__all__ = ["shm_name", "open_client_object"]

# posix_ipc turns these errnos into its own exception classes; everything else is an OSError.
_POSIX_IPC_ERRNO = ((posix_ipc.ExistentialError, errno.ENOENT), (posix_ipc.PermissionsError, errno.EACCES))


def shm_name(key: str) -> str:
    """The POSIX name (`/<name>`) of a client's key, with or without its leading slash.

    Raises ValueError for a key that names no object: empty, `.`, `..`, with a `/` or a NUL inside.
    """
    base = key.lstrip("/")
    if not base or "/" in base or base in (".", "..") or "\0" in base:
        raise ValueError(f"'{key}' is not a POSIX shared memory name")
    return "/" + base


def open_client_object(key: str, writable: bool) -> int:
    """A new descriptor of the client's object `key`, read-write or read-only; never creates one.

    Raises ValueError for an invalid key and OSError (errno set) when the object cannot be opened.
    """
    name = shm_name(key)
    try:
        memory = posix_ipc.SharedMemory(name, flags=0, read_only=not writable)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError) as exc:
        code = next(number for kind, number in _POSIX_IPC_ERRNO if isinstance(exc, kind))
        raise OSError(code, os.strerror(code), name) from None
    try:
        # Our own descriptor (non-inheritable, as os.dup makes it), whatever posix_ipc does with
        # its own when the object is collected.
        return os.dup(memory.fd)
    finally:
        memory.close_fd()
