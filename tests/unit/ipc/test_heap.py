"""glibc malloc thresholds (ipc/heap.py): set once per process unless the operator tuned malloc."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pystub_backend.ipc import heap

_GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("environ", [
    {"MALLOC_MMAP_THRESHOLD_": "131072"},
    {"MALLOC_TRIM_THRESHOLD_": "0"},
    {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
])
def test_an_operators_setting_leaves_malloc_alone(environ: dict[str, str]) -> None:
    assert heap.raise_malloc_thresholds(environ) is False


@pytest.mark.skipif(not _GLIBC, reason="mallopt's thresholds are glibc's")
def test_glibc_takes_the_thresholds() -> None:
    # In a child process: the thresholds stay set for the life of the process that sets them.
    code = ("from pystub_backend.ipc import heap; "
            "print(heap.raise_malloc_thresholds({'GLIBC_TUNABLES': 'glibc.rtld.optional_static_tls=1'}))")
    root = Path(heap.__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                            env=env)
    assert result.stdout.strip() == "True"
