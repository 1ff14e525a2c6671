"""The execution-environment cache is private and checked at every use.

The real extraction code runs in process on the real filesystem (as the archive checks in
test_security.py do). The planted directories are what another user of the machine could leave at
the predictable default path `<tmp>/pystub-envs-<uid>`: before the fix, an environment planted
there, at the key the archive's path and mtime give, was used as the model's environment.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest

from pystub_backend.backend.supervision.execution_env import ExecutionEnvError, resolve_execution_env


def _archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        content = b"export FROM_ARCHIVE=1\n"
        info = tarfile.TarInfo("bin/activate")
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    return path


def _key(archive: Path) -> str:
    """The cache key the server derives (anyone can: the archive's path and mtime are public)."""
    return hashlib.sha256(f"{archive.resolve()}:{archive.stat().st_mtime_ns}".encode()).hexdigest()[:24]


@pytest.fixture
def default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default cache path, under a temporary directory of the test's own."""
    temp = tmp_path / "tmp"
    temp.mkdir(mode=0o1777)
    os.chmod(temp, 0o1777)  # like /tmp: everyone may create entries
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp / f"pystub-envs-{os.geteuid()}"


def _plant(cache: Path, archive: Path, mode: int) -> Path:
    """A cache directory holding an attacker's environment at the archive's key."""
    cache.mkdir()
    planted = cache / _key(archive) / "bin"
    planted.mkdir(parents=True)
    (planted / "activate").write_text("echo planted\n")
    os.chmod(cache, mode)
    return planted.parent


def test_the_default_cache_is_created_private_and_reused(tmp_path: Path, default_cache: Path) -> None:
    archive = _archive(tmp_path / "env.tar.gz")
    env = resolve_execution_env(str(archive), str(tmp_path))
    assert Path(env).parent == default_cache
    assert stat.S_IMODE(default_cache.stat().st_mode) == 0o700 and default_cache.stat().st_uid == os.geteuid()
    assert resolve_execution_env(str(archive), str(tmp_path)) == env  # cached, checked again, used


def test_an_xdg_cache_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    env = resolve_execution_env(str(_archive(tmp_path / "env.tar.gz")), str(tmp_path))
    root = tmp_path / "xdg" / "pystub-envs"
    assert Path(env).parent == root and stat.S_IMODE(root.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o750])
def test_a_planted_cache_of_the_wrong_mode_is_refused(tmp_path: Path, default_cache: Path, mode: int) -> None:
    archive = _archive(tmp_path / "env.tar.gz")
    _plant(default_cache, archive, mode)
    with pytest.raises(ExecutionEnvError, match=f"its mode is {mode:04o}, not 0700") as info:
        resolve_execution_env(str(archive), str(tmp_path))
    assert str(default_cache) in str(info.value) and "XDG_CACHE_HOME" in str(info.value)


def test_a_planted_cache_owned_by_another_user_is_refused(tmp_path: Path, default_cache: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user; the mode and link cases run here")
    archive = _archive(tmp_path / "env.tar.gz")
    planted = _plant(default_cache, archive, 0o700)
    os.chown(default_cache, 65534, 65534)
    os.chown(planted, 65534, 65534)
    with pytest.raises(ExecutionEnvError, match="owned by uid 65534"):
        resolve_execution_env(str(archive), str(tmp_path))


def test_a_planted_symlink_is_refused(tmp_path: Path, default_cache: Path) -> None:
    archive = _archive(tmp_path / "env.tar.gz")
    elsewhere = tmp_path / "elsewhere"
    _plant(elsewhere, archive, 0o700)
    default_cache.symlink_to(elsewhere)
    with pytest.raises(ExecutionEnvError, match="symbolic link"):
        resolve_execution_env(str(archive), str(tmp_path))


def test_a_cached_environment_replaced_by_a_link_is_refused(tmp_path: Path, default_cache: Path) -> None:
    archive = _archive(tmp_path / "env.tar.gz")
    env = Path(resolve_execution_env(str(archive), str(tmp_path)))
    os.rename(env, tmp_path / "moved")
    env.symlink_to(tmp_path / "moved")
    with pytest.raises(ExecutionEnvError, match="cached execution environment .* symbolic link"):
        resolve_execution_env(str(archive), str(tmp_path))
