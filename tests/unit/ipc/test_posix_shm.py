"""pystub_backend.ipc.posix_shm: clients' objects opened with shm_open through posix_ipc, on real
POSIX shared memory: what it opens, what it refuses (a planted symbolic link included), and that it
never creates an object."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator

import posix_ipc
import pytest

from pystub_backend.ipc.posix_shm import open_client_object, shm_name

SHM_DIR = "/dev/shm"


@pytest.fixture
def client_object() -> Iterator[str]:
    """A 4 KiB object created as a client does (shm_open + ftruncate), unlinked afterwards."""
    name = f"/posixshm_unit_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=4096)
    memory.close_fd()
    try:
        yield name
    finally:
        posix_ipc.unlink_shared_memory(name)


@pytest.mark.parametrize("key", ["x", "/x", "//x"])
def test_a_key_is_a_posix_name_with_or_without_its_slash(key: str) -> None:
    assert shm_name(key) == "/x"


@pytest.mark.parametrize("key", ["", "/", ".", "/..", "a/b", "/a/b", "a\0b"])
def test_a_key_that_names_no_object_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="not a POSIX shared memory name"):
        shm_name(key)
    with pytest.raises(ValueError):
        open_client_object(key, writable=False)


def test_the_descriptor_is_the_clients_object_and_ours_to_close(client_object: str) -> None:
    fd = open_client_object(client_object.lstrip("/"), writable=True)
    try:
        assert os.fstat(fd).st_ino == os.stat(os.path.join(SHM_DIR, client_object[1:])).st_ino
        assert os.fstat(fd).st_size == 4096
        assert not os.get_inheritable(fd)
        os.pwrite(fd, b"pystub", 0)
    finally:
        os.close(fd)
    with open(os.path.join(SHM_DIR, client_object[1:]), "rb") as written:
        assert written.read(6) == b"pystub"


def test_a_read_only_descriptor_cannot_write(client_object: str) -> None:
    fd = open_client_object(client_object, writable=False)
    try:
        with pytest.raises(OSError) as error:
            os.pwrite(fd, b"x", 0)
        assert error.value.errno == errno.EBADF
    finally:
        os.close(fd)


def test_a_missing_object_is_enoent_and_is_not_created() -> None:
    name = f"/posixshm_missing_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with pytest.raises(OSError) as error:
        open_client_object(name, writable=True)
    assert error.value.errno == errno.ENOENT
    assert error.value.strerror == os.strerror(errno.ENOENT)
    assert not os.path.exists(os.path.join(SHM_DIR, name[1:]))


def test_a_symbolic_link_planted_under_a_name_is_not_followed(client_object: str) -> None:
    link = f"posixshm_link_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    os.symlink(os.path.join(SHM_DIR, client_object[1:]), os.path.join(SHM_DIR, link))
    try:
        with pytest.raises(OSError) as error:
            open_client_object(link, writable=False)
        assert error.value.errno == errno.ELOOP
    finally:
        os.unlink(os.path.join(SHM_DIR, link))
