"""Stub-name checks and the directory fingerprints that repository polling compares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pystub_backend.backend.models.repository import (
    INVALID_STUB_NAME,
    RepositoryError,
    check_stub_name,
    model_fingerprint,
)


@pytest.mark.parametrize("char", list(";|&$`<>()[]{}\\\"'*?~#!"))
def test_shell_metacharacters_are_refused(char):
    with pytest.raises(RepositoryError) as info:
        check_stub_name(f"model{char}name")
    assert str(info.value) == INVALID_STUB_NAME == "Invalid stub name: contains invalid characters"


@pytest.mark.parametrize("name", ["add_sub", "model-1.v2", "Model_0_0", "with space", "ünïcode"])
def test_ordinary_names_pass(name):
    check_stub_name(name)


def test_empty_name_is_refused():
    with pytest.raises(RepositoryError):
        check_stub_name("")


def _touch(path: Path, text: str, mtime_ns: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_fingerprint_sees_config_and_version_changes(tmp_path: Path):
    model = tmp_path / "m"
    _touch(model / "config.pbtxt", "a", 10**18)
    _touch(model / "1" / "model.py", "x", 10**18)
    first = model_fingerprint(str(model))
    assert model_fingerprint(str(model)) == first

    _touch(model / "1" / "__pycache__" / "model.cpython-311.pyc", "bytecode", 2 * 10**18)
    _touch(model / ".hidden", "editor swap file", 2 * 10**18)
    assert model_fingerprint(str(model)) == first  # written by imports and editors: no reload

    _touch(model / "config.pbtxt", "a", 10**18 + 1)
    second = model_fingerprint(str(model))
    assert second != first
    (model / "2").mkdir()
    third = model_fingerprint(str(model))
    assert third != second
    _touch(model / "1" / "model.py", "xy", 10**18)  # same mtime, new size
    assert model_fingerprint(str(model)) != third


def test_fingerprint_of_a_missing_directory_is_empty(tmp_path: Path):
    assert model_fingerprint(str(tmp_path / "absent")) == frozenset()
