"""Security checks, against real backends unless said otherwise.

- A default-started backend listens on loopback only; stubs listen nowhere.
- Shared-memory objects (control blocks, arenas of both sides) are mode 0600 and ours; a model
  override directory is 0700 with 0600 files.
- Admin calls that change state are refused from a non-loopback peer. The peer is real: the backend
  runs in a network namespace of its own where 10.123.0.1 is a local address, and the client,
  entering that namespace, connects from it (no packet leaves the namespace).
- EXECUTION_ENV_PATH archives with `..`, absolute paths, links that escape (directly, or chained
  through other links of the archive) or special files are refused before anything is written.
- Model names in load/unload requests are validated (HTTP and gRPC), and so are override paths.
- Oversized inputs are refused before anything is allocated for them: an HTTP body over
  `--http-max-input-size` (declared, streamed or compressed), and shapes whose byte size is not
  what arrived. The limit on shapes: a tensor's declared bytes must be exactly the bytes received
  (so they are bounded by the body limit over HTTP, and by the message the client sent over gRPC,
  whose size is unlimited as in Triton), and its dims, zero dims left out, must describe at most
  2**63-1 bytes (an empty [2**62, 0] tensor is refused: no model could even view it).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from fuzz_cases import IDENTITY_2D_CONFIG
from harness import EXAMPLES, Backend, make_repository, module_backend
from net import http_json
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pystub_backend.backend.supervision.execution_env import ExecutionEnvError, resolve_execution_env

MIB = 1 << 20


def request(backend: Backend, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return http_json(f"http://{backend.http_url}", method, path, body, headers)


def _loopback(ip: str) -> bool:
    address = ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # gRPC binds ::ffff:127.0.0.1


def _listening(process: psutil.Process) -> list[Any]:
    connections = getattr(process, "net_connections", None) or process.connections
    return [c for c in connections(kind="inet") if c.status == psutil.CONN_LISTEN]


# -- listeners and file modes -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    repository = make_repository(tmp_path_factory.mktemp("security"), "identity_fp32", "add_sub")
    shutil.copytree(repository / "identity_fp32", repository / "identity_2d")  # two variable dims
    (repository / "identity_2d" / "config.pbtxt").write_text(IDENTITY_2D_CONFIG)
    flags = ["--model-control-mode=explicit", "--load-model=*", f"--http-max-input-size={MIB}"]
    with module_backend(Backend(repository, *flags)) as server:
        yield server


def test_default_bind_is_loopback_and_stubs_listen_nowhere(backend: Backend) -> None:
    listening = _listening(psutil.Process(backend.pid))
    assert {c.laddr.port for c in listening} >= set(backend.ports.values())
    assert all(_loopback(c.laddr.ip) for c in listening), [c.laddr for c in listening]
    stubs = backend.stub_processes()
    assert stubs and all(not _listening(stub) for stub in stubs)


def test_shared_memory_objects_are_private(backend: Backend) -> None:
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:  # both arenas get segments: p2s created by the backend, s2p by the stub
        data = np.ones((1, 3 * MIB // 4), np.float32)
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        assert np.array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()
    # Anonymous: nothing in /dev/shm; each side maps what it writes read-write and
    # what it reads read-only, and the reader's descriptor could not be mapped otherwise.
    assert backend.shm_entries() == []
    served = 0
    for pid, writes, reads in [(backend.pid, "p2s", "s2p"),
                               *[(stub.pid, "s2p", "p2s") for stub in backend.stub_processes()]]:
        with open(f"/proc/{pid}/maps") as maps:
            modes = {line.split()[5].rsplit("_", 1)[1].rstrip("0123456789"): line.split()[1]
                     for line in maps if len(line.split()) > 5 and line.split()[5].startswith("/memfd:pystub_")}
        assert modes.get("ctl") == "rw-s", (pid, modes)
        if writes in modes or reads in modes:  # a stub of a model that has served (identity_fp32)
            assert modes.get(writes) == "rw-s" and modes.get(reads) == "r--s", (pid, modes)
            served += 1
    assert served >= 2, "the backend and identity_fp32's stub map both arenas"


def test_override_directories_are_private(backend: Backend) -> None:
    config = {"backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    code = (EXAMPLES / "identity_fp32" / "1" / "model.py").read_bytes()
    body = json.dumps({"parameters": {"config": json.dumps(config),
                                      "file:1/model.py": base64.b64encode(code).decode()}}).encode()
    status, reply = request(backend, "POST", "/v2/repository/models/private_copy/load", body)
    assert status == 200, reply
    try:
        process = psutil.Process(backend.pid)
        stub = next(p for p in backend.stub_processes() if "private_copy_0" in " ".join(p.cmdline()))
        roots = {Path(f.path).parents[2] for f in process.open_files() + stub.open_files()
                 if "pystub_override_" in f.path} or set(Path("/tmp").glob(f"pystub_override_{backend.pid}_*"))
        assert roots, "the override directory was not found"
        for root in roots:
            for path in [root, *root.rglob("*")]:
                mode = stat.S_IMODE(path.stat().st_mode)
                assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    finally:
        assert request(backend, "POST", "/v2/repository/models/private_copy/unload", b"{}")[0] == 200


# -- admin calls from a non-loopback peer -----------------------------------------------------------------
PEER = "10.123.0.1"
NETNS_WRAPPER = ["unshare", "--net", "sh", "-c",
                 f'ip link set lo up && ip addr add {PEER}/32 dev lo && exec "$@"', "sh"]
CLIENT = r'''
import http.client, json, sys
port, results = int(sys.argv[1]), {}
for source in sys.argv[2:]:
    for method, path in (("POST", "/v2/pystub/stubs/nope/restart"), ("POST", "/v2/pystub/stubs/identity_fp32/restart"),
                         ("GET", "/v2/pystub/stubs")):
        if source != "10.123.0.1" and path.endswith("identity_fp32/restart"):
            continue  # from loopback this would really restart it; the 404 call shows it is let through
        connection = http.client.HTTPConnection("10.123.0.1", port, timeout=30, source_address=(source, 0))
        connection.request(method, path, body=b"" if method == "POST" else None)
        response = connection.getresponse()
        results[f"{source} {method} {path}"] = [response.status, response.read().decode()]
        connection.close()
print(json.dumps(results))
'''


def _netns_unavailable() -> str | None:
    for tool in ("unshare", "ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(NETNS_WRAPPER + ["true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot make a network namespace (needs CAP_SYS_ADMIN): {probe.stderr.strip()}"
    return None


def test_admin_changes_are_refused_from_a_non_loopback_peer(tmp_path: Path) -> None:
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason + "; the unit-level check is in test_readiness_and_sandbox.py")
    repository = make_repository(tmp_path, "identity_fp32")
    with Backend(repository, "--http-address=0.0.0.0", wrapper=NETNS_WRAPPER) as backend:
        pid_before = backend.stub_processes()[0].pid
        client = subprocess.run(["nsenter", f"--net=/proc/{backend.pid}/ns/net", sys.executable, "-c", CLIENT,
                                 str(backend.ports["http"]), PEER, "127.0.0.1"],
                                capture_output=True, text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        results = json.loads(client.stdout)
        assert backend.stub_processes()[0].pid == pid_before, "a refused restart must not restart anything"
    for call in ("POST /v2/pystub/stubs/nope/restart", "POST /v2/pystub/stubs/identity_fp32/restart"):
        status, body = results[f"{PEER} {call}"]
        assert status == 403 and f"not from '{PEER}'" in json.loads(body)["error"], (call, status, body)
    assert results[f"{PEER} GET /v2/pystub/stubs"][0] == 200  # looking is allowed from anywhere
    assert results["127.0.0.1 POST /v2/pystub/stubs/nope/restart"][0] == 404  # let through, no such model
    assert results["127.0.0.1 GET /v2/pystub/stubs"][0] == 200


# -- execution environment archives (the real extraction code, in process) ------------------------------
def _archive(path: Path, entries: list[tuple[str, str, str]]) -> Path:
    """entries: (name, kind, content or link target); kind is file, dir, symlink, hardlink or fifo."""
    with tarfile.open(path, "w:gz") as archive:
        for name, kind, content in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content.encode()))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = content
            archive.addfile(info)
    return path


_ACTIVATE = ("bin/activate", "file", "export X=1\n")


@pytest.mark.parametrize("entries, text", [
    ([("../escaped.txt", "file", "pwned"), _ACTIVATE], "Path contains '..'"),
    ([("ok/../../escaped.txt", "file", "pwned"), _ACTIVATE], "Path contains '..'"),
    ([("/tmp/escaped.txt", "file", "pwned"), _ACTIVATE], "Path is absolute"),
    ([("etc", "symlink", "/etc"), _ACTIVATE], "Link escapes the archive"),
    ([("up", "symlink", "../../.."), _ACTIVATE], "Link escapes the archive"),
    ([("hard", "hardlink", "../escaped.txt"), _ACTIVATE], "Link escapes the archive"),
    # Each link looks harmless alone; extracted in order they would write outside: refused.
    ([("d1", "symlink", "."), ("d1/d2", "symlink", ".."), ("d2/escaped.txt", "file", "pwned"), _ACTIVATE],
     "Path goes through a link of the archive"),
    ([("pipe", "fifo", ""), _ACTIVATE], "Unsupported archive entry type"),
], ids=["dotdot", "nested-dotdot", "absolute", "absolute-link", "link-up", "hardlink", "chained-links", "fifo"])
def test_unsafe_execution_env_archives_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   entries: list[tuple[str, str, str]], text: str) -> None:
    cache = tmp_path / "deep" / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    archive = _archive(tmp_path / "env.tar.gz", entries)
    with pytest.raises(ExecutionEnvError, match=text):
        resolve_execution_env(str(archive), str(tmp_path))
    assert not list(tmp_path.rglob("escaped.txt")), "nothing may be written"
    assert not any((cache / "pystub-envs").iterdir()), "the staging directory is removed"


def test_a_safe_archive_with_internal_links_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    archive = _archive(tmp_path / "env.tar.gz", [("bin", "dir", ""), _ACTIVATE, ("bin/python3", "file", "#!/bin/sh\n"),
                                                 ("bin/python", "symlink", "python3"), ("lib", "symlink", "bin")])
    env = Path(resolve_execution_env(str(archive), str(tmp_path)))
    assert (env / "bin" / "activate").is_file() and os.readlink(env / "bin" / "python") == "python3"


# -- model names ---------------------------------------------------------------------------------------------
BAD_NAMES = ["..", ".", "a/b", "../identity_fp32", "x;rm -rf y", "x|y", "$(id)", "`id`", "a\"b", "x*", "~root", "x!"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_model_names_are_refused(backend: Backend, name: str) -> None:
    from urllib.parse import quote

    # A name no repository holds is, as in Triton 2.51, a failed poll (500 / INTERNAL with its text);
    # names that cannot even be kept or logged are refused before that (400 / INVALID_ARGUMENT).
    failed_poll = f"failed to load '{name}', failed to poll from model repository"
    status, reply = request(backend, "POST", f"/v2/repository/models/{quote(name, safe='')}/load", b"{}")
    assert status in (400, 404) or (status, reply["error"]) == (500, failed_poll), (status, reply)
    assert reply and reply["error"], reply
    client = grpcclient.InferenceServerClient(backend.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(name)
        refused = info.value.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND")
        failed = (info.value.status(), info.value.message()) == ("StatusCode.INTERNAL", failed_poll)
        assert refused or failed, info.value
    finally:
        client.close()
    assert all(row["healthy"] for row in request(backend, "GET", "/v2/pystub/stubs")[1]["stubs"])


@pytest.mark.parametrize("path", ["file:../x.py", "file:/../etc/x", "file:1/../../x.py", "file:", "file:1//x",
                                  "file:./1/x"])
def test_override_paths_that_leave_the_model_directory_are_refused(backend: Backend, path: str) -> None:
    body = json.dumps({"parameters": {"config": "{}", path: base64.b64encode(b"x").decode()}}).encode()
    status, reply = request(backend, "POST", "/v2/repository/models/override_probe/load", body)
    assert status == 400 and reply["error"], (status, reply)
    assert not list(Path("/tmp").glob(f"pystub_override_{backend.pid}_*/override_probe"))


# -- oversized inputs ---------------------------------------------------------------------------------------
def _raw_http(backend: Backend, head: bytes, body_chunks: list[bytes] = (), read_timeout: float = 10.0) -> bytes:
    host, port = backend.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed: it did not read the rest
        reply = b""
        try:
            while b"\r\n\r\n" not in reply or len(reply) < reply.index(b"\r\n\r\n") + 4 + 10:
                data = sock.recv(65536)
                if not data:
                    break
                reply += data
        except ConnectionResetError:
            pass
    return reply


def _rss(backend: Backend) -> int:
    return psutil.Process(backend.pid).memory_info().rss


def test_http_bodies_over_the_limit_are_refused_before_they_are_read(backend: Backend) -> None:
    path = b"/v2/models/identity_fp32/infer"
    rss_before = _rss(backend)
    # Declared too large: answered at once, the body never sent.
    started = time.monotonic()
    reply = _raw_http(backend, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(512 * MIB).encode() + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert b"exceeds the maximum input size" in reply and time.monotonic() - started < 5
    # Streamed without a length: refused once it passes the limit, the rest is not read.
    chunk = b"x" * (256 * 1024)
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(64)]  # 16 MiB offered
    reply = _raw_http(backend, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", chunks)
    assert reply.startswith(b"HTTP/1.1 400") and b"exceeds the maximum input size" in reply, reply[:200]
    # Compressed: 100 MiB of zeros in a ~100 KiB gzip body; inflating stops past the limit.
    bomb = gzip.compress(bytes(100 * MIB))
    status, body = request(backend, "POST", "/v2/models/identity_fp32/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and "exceeds the maximum input size" in body["error"], body
    assert _rss(backend) - rss_before < 32 * MIB, "nothing near the offered sizes was allocated"


def test_shapes_larger_than_their_data_are_refused_before_allocation(backend: Backend) -> None:
    rows = {row["instance"]: row for row in request(backend, "GET", "/v2/pystub/stubs")[1]["stubs"]}
    rss_before = _rss(backend)
    huge = [1, 2**40]  # 4 TiB of FP32 declared, 16 bytes sent
    document = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": huge, "data": [1, 2, 3, 4]}]}
    status, body = request(backend, "POST", "/v2/models/identity_fp32/infer", json.dumps(document).encode())
    assert status == 400 and "needs 1099511627776, got 4" in body["error"], body
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": huge,
                                     "parameters": {"binary_data_size": 2**42}}]}).encode()
    status, body = request(backend, "POST", "/v2/models/identity_fp32/infer", header + bytes(16),
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "unexpected size for input 'INPUT0'" in body["error"], body
    with grpc.insecure_channel(backend.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for model, shape, data, text in (("identity_fp32", huge, bytes(16), "byte size mismatch"),
                                         ("identity_2d", [2**62, 0], b"", "describes more than")):
            message = service_pb2.ModelInferRequest(model_name=model, raw_input_contents=[data])
            message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(message, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in info.value.details(), info.value
    after = {row["instance"]: row for row in request(backend, "GET", "/v2/pystub/stubs")[1]["stubs"]}
    assert after["identity_fp32_0_0"]["arena_total_bytes"] == rows["identity_fp32_0_0"]["arena_total_bytes"]
    assert after["identity_fp32_0_0"]["served"] == rows["identity_fp32_0_0"]["served"], "never reached the stub"
    assert _rss(backend) - rss_before < 16 * MIB
