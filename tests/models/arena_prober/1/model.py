"""A hostile model: tries every way to another instance's (or the backend's) shared memory.

Reports, as JSON: what it opened in /dev/shm; which /proc/<pid>/fd/N, /proc/<pid>/map_files/*
and /proc/<pid>/mem of the backend and of the other stubs it could open; and, as a control that
the probing works at all, how many memfd descriptors and mappings its own /proc/self shows.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _try_open(path, opened):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    os.close(fd)
    opened.append(path)


def _stub_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if b"triton_python_backend_stub" in handle.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _probe_process(pid, opened):
    _try_open(f"/proc/{pid}/mem", opened)
    for kind in ("fd", "map_files"):
        try:
            entries = os.listdir(f"/proc/{pid}/{kind}")
        except OSError:
            continue
        for entry in entries:
            path = f"/proc/{pid}/{kind}/{entry}"
            try:
                target = os.readlink(path)
            except OSError:
                target = ""
            if kind == "map_files" or target.startswith("/memfd:"):
                _try_open(path, opened)


def _report():
    opened_shm, opened_proc = [], []
    for name in os.listdir("/dev/shm"):
        _try_open(os.path.join("/dev/shm", name), opened_shm)
    others = _stub_pids()
    for pid in [os.getppid(), *others]:
        _probe_process(pid, opened_proc)
    with open("/proc/self/maps") as maps:
        own_maps = sum("/memfd:" in line for line in maps)
    return {"dev_shm": sorted(os.listdir("/dev/shm")), "opened_shm": opened_shm, "opened_proc": opened_proc,
            "other_stubs": len(others), "own_memfd_mappings": own_maps,
            "own_memfd_fds": sum(os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
                                 for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            report = json.dumps(_report())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("REPORT", np.array([report.encode()], dtype=np.object_))]))
        return responses
