"""C load generators whose own cost is small: `wrk` for HTTP, `h2load` for gRPC (loadgen "wrk-h2load").

Both send one pre-built request over and over, so the client does no per-request work a server
could be blamed for:

    HTTP   wrk -t 1 -c C: C connections, one request in flight each, posting a KServe v2 binary
           inference (Inference-Header-Content-Length: the JSON header, then the tensor's bytes);
           a Lua `done()` prints the exact counts and percentiles as one `wrk-summary` line
    gRPC   h2load -c 1 -m C: one connection with C streams in flight (as a gRPC channel carries
           them), each posting the same length-prefixed ModelInferRequest with the headers a gRPC
           client sends (content-type: application/grpc, te: trailers)

h2load does not read gRPC trailers, so an answer with grpc-status other than 0 would count as a
success there. Every window is therefore checked twice: before it, the very request the generator
sends is answered correctly (a real gRPC or HTTP client reads it and compares the output bytes);
over it, the server's own statistics (`/v2/models/MODEL/stats`: success and failure counts) must
agree with the generator (`_judge`). The gRPC window is a count of requests (sized from the
warm-up's rate), so that none is in flight when it ends and the server's counts must match it
exactly. A window with errors raises: a load that gets errors is not a measurement.

CPU per request: the server's process and its descendants (the model processes) from /proc, and
the generator's (getrusage of waited children), over the generator's run, divided by the
requests it completed. The warm-up is a separate, shorter run of the same generator.
"""

from __future__ import annotations

import http.client
import json
import re
import resource
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2

from compare import cpu
from compare.loadgen import Point, Sample, model_inputs
from compare.perf_analyzer import run_child
from compare.servers import Server

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")
_CHECK_TIMEOUT = 30.0  # s; for one answer to the checked request
_COUNT_SECONDS = 5.0  # s; for the server's statistics to count the requests the generator completed
_SETTLE_SECONDS = 0.1  # s; between two readings of the statistics that must agree
_GENERATOR_TIMEOUT = 300.0  # s; a window is seconds long: this is a server that stopped answering
_WRK_SCRIPT = '''-- posts one KServe v2 binary inference, read from a file (bytes Lua strings cannot spell)
local file = assert(io.open("{body}", "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "{header_length}"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("wrk-summary duration_us=%d requests=%d connect=%d read=%d write=%d status=%d "
                         .. "timeout=%d p50_us=%d p99_us=%d\\n", summary.duration, summary.requests, e.connect,
                         e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
'''


@dataclass(frozen=True)
class Outcome:
    """What one generator run reports."""

    requests: int           # completed
    seconds: float
    errors: int             # > 0 when a request failed in the generator's eyes (socket errors, status >= 400)
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


# ---- requests --------------------------------------------------------------------------------------

def http_body(nbytes: int) -> tuple[bytes, int]:
    """identity_fp32's binary-tensor request body for an input of `nbytes`, and its JSON header's length."""
    tensor = model_inputs("identity_fp32", nbytes)["INPUT0"]
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(tensor.shape),
                                     "parameters": {"binary_data_size": tensor.nbytes}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return header + tensor.tobytes(), len(header)


def grpc_message(nbytes: int) -> bytes:
    """identity_fp32's ModelInferRequest for an input of `nbytes`, serialised (not yet framed)."""
    tensor = model_inputs("identity_fp32", nbytes)["INPUT0"]
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(tensor.shape))
    request.raw_input_contents.append(tensor.tobytes())
    return request.SerializeToString()


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def check_http(url: str, body: bytes, header_length: int, expected: bytes) -> None:
    """Post `body` once; raises RuntimeError unless OUTPUT0's bytes are `expected`."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=_CHECK_TIMEOUT)
    try:
        connection.request("POST", "/v2/models/identity_fp32/infer", body,
                           {"Content-Type": "application/octet-stream",
                            "Inference-Header-Content-Length": str(header_length)})
        response = connection.getresponse()
        answer = response.read()
        length = response.getheader("Inference-Header-Content-Length")
    finally:
        connection.close()
    if response.status != 200 or length is None:
        raise RuntimeError(f"the wrk request was answered {response.status}: {answer[:200]!r}")
    outputs = json.loads(answer[:int(length)])["outputs"]
    data = answer[int(length):]
    if [o["name"] for o in outputs] != ["OUTPUT0"] or data != expected:
        raise RuntimeError(f"the wrk request was answered a wrong OUTPUT0: {outputs}")


def check_grpc(url: str, message: bytes, expected: bytes) -> None:
    """Call ModelInfer with `message` once; raises RuntimeError unless the call ends with status 0
    and OUTPUT0's bytes are `expected`."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None)
        try:
            answer = call(message, timeout=_CHECK_TIMEOUT)
        except grpc.RpcError as error:
            raise RuntimeError(f"the h2load request was answered {error.code()}: {error.details()}") from None
    response = service_pb2.ModelInferResponse.FromString(answer)
    if [o.name for o in response.outputs] != ["OUTPUT0"] or list(response.raw_output_contents) != [expected]:
        raise RuntimeError("the h2load request was answered a wrong OUTPUT0")


# ---- the generators' command lines and output -----------------------------------------------------

def wrk_command(url: str, concurrency: int, seconds: float, script: Path) -> list[str]:
    # one thread: the machine has two cores, and one wrk thread serves tens of thousands of
    # requests per second; whole seconds: wrk reads its duration as an integer
    return ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(script), f"http://{url}/v2/models/identity_fp32/infer"]


def h2load_command(url: str, concurrency: int, data: Path, *, seconds: float | None = None,
                   count: int | None = None) -> list[str]:
    """h2load posting `data` for `seconds`, or until `count` requests are answered."""
    headers = [arg for header in GRPC_HEADERS for arg in ("-H", header)]
    length = ["-n", str(count)] if count is not None else ["-D", f"{max(1, round((seconds or 1) * 1000))}ms"]
    return ["h2load", "-t", "1", "-c", "1", "-m", str(concurrency), *length, "-d", str(data), *headers,
            f"http://{url}{INFER_METHOD}"]


_WRK_SUMMARY = re.compile(r"^wrk-summary (.*)$", re.MULTILINE)


def parse_wrk(text: str) -> Outcome:
    """The `wrk-summary` line the script's done() prints. Raises ValueError when there is none."""
    match = _WRK_SUMMARY.search(text)
    if match is None:
        raise ValueError(f"no wrk-summary line in wrk's output: {text.strip()[-300:]!r}")
    fields = {key: int(value) for key, value in (item.split("=") for item in match.group(1).split())}
    errors = sum(fields[key] for key in ("connect", "read", "write", "status", "timeout"))
    return Outcome(requests=fields["requests"], seconds=fields["duration_us"] / 1e6, errors=errors,
                   p50_ms=fields["p50_us"] / 1000, p99_ms=fields["p99_us"] / 1000)


_H2_FINISHED = re.compile(r"^finished in ([\d.]+)(us|ms|s|min), ([\d.]+) req/s", re.MULTILINE)
_H2_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_H2_REQUESTS = re.compile(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                          r"(\d+) errored, (\d+) timeout", re.MULTILINE)
_H2_STATUS = re.compile(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", re.MULTILINE)


def parse_h2load(text: str) -> Outcome:
    """h2load's summary (it gives no latency percentiles). Raises ValueError when it has none."""
    finished, requests, status = _H2_FINISHED.search(text), _H2_REQUESTS.search(text), _H2_STATUS.search(text)
    if finished is None or requests is None or status is None:
        raise ValueError(f"no summary in h2load's output: {text.strip()[-300:]!r}")
    succeeded, failed, errored, timeout = (int(requests.group(i)) for i in range(4, 8))
    non_2xx = sum(int(status.group(i)) for i in range(2, 5))
    seconds = float(finished.group(1)) * _H2_UNITS[finished.group(2)]
    # h2load's failed, errored and timeout counts may overlap: their sum is only ever compared with 0
    return Outcome(requests=succeeded, seconds=seconds, errors=failed + errored + timeout + non_2xx)


# ---- one window ------------------------------------------------------------------------------------

def _served(server: Server, model: str) -> tuple[int, int]:
    """(successes, failures) the server's statistics extension has counted for `model` so far."""
    with urllib.request.urlopen(f"http://{server.url('http')}/v2/models/{model}/stats",
                                timeout=_CHECK_TIMEOUT) as response:
        stats = json.load(response)["model_stats"]
    return (sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
            sum(int(s["inference_stats"]["fail"]["count"]) for s in stats))


def _counted(server: Server, model: str, successes: int) -> tuple[int, int]:
    """The statistics once they count `successes` (or after _COUNT_SECONDS): a server may count a
    request when its bookkeeping ends, just after its answer left."""
    deadline = time.monotonic() + _COUNT_SECONDS
    while (counts := _served(server, model))[0] < successes and time.monotonic() < deadline:
        time.sleep(0.05)
    return counts


def _settled(server: Server, model: str) -> tuple[int, int]:
    """The statistics once two readings _SETTLE_SECONDS apart agree (or after _COUNT_SECONDS)."""
    deadline = time.monotonic() + _COUNT_SECONDS
    counts = _served(server, model)
    while time.monotonic() < deadline:
        time.sleep(_SETTLE_SECONDS)
        previous, counts = counts, _served(server, model)
        if counts == previous:
            break
    return counts


def _run(command: list[str], tmp: Path) -> str:
    """Run a generator to its end (its own time or count, with a deadline well past it); its output."""
    output = tmp / "output.txt"
    returncode = run_child(command, output, _GENERATOR_TIMEOUT, what=command[0])
    text = output.read_text(errors="replace")
    if returncode != 0:
        raise RuntimeError(f"{command[0]} exit {returncode}: {text.strip()[-400:]}")
    return text


def measure(server: Server, point: Point, warmup: float, seconds: float) -> Sample:
    """One window of `point` (identity_fp32, binary HTTP or gRPC) against `server`. Raises
    RuntimeError when the server answers wrongly or any request of the window failed."""
    url = server.url(point.protocol)
    expected = model_inputs("identity_fp32", point.nbytes)["INPUT0"].tobytes()
    with tempfile.TemporaryDirectory(prefix="pystub-bench-wrk-") as name:
        tmp = Path(name)
        if point.protocol == "grpc":
            message, data = grpc_message(point.nbytes), tmp / "request.bin"
            data.write_bytes(grpc_frame(message))
            check_grpc(url, message, expected)
            # the warm-up's rate sizes the window's count: the window then ends when its last
            # request is answered, and none is left in flight for the server to count as failed
            warm = parse_h2load(_run(h2load_command(url, point.concurrency, data, seconds=max(warmup, 0.5)), tmp))
            command = h2load_command(url, point.concurrency, data, count=max(100, round(warm.throughput * seconds)))
        else:
            body, header_length = http_body(point.nbytes)
            (tmp / "body.bin").write_bytes(body)
            (tmp / "post.lua").write_text(_WRK_SCRIPT.format(body=tmp / "body.bin", header_length=header_length))
            check_http(url, body, header_length, expected)
            if warmup > 0:
                _run(wrk_command(url, point.concurrency, warmup, tmp / "post.lua"), tmp)
            command = wrk_command(url, point.concurrency, seconds, tmp / "post.lua")
        served0 = _settled(server, point.model)  # the warm-up's last requests counted
        cpu0 = cpu.now(server.process.pid, resource.RUSAGE_CHILDREN)
        text = _run(command, tmp)
        cpu1 = cpu.now(server.process.pid, resource.RUSAGE_CHILDREN)
    outcome = parse_h2load(text) if point.protocol == "grpc" else parse_wrk(text)
    counted = _counted(server, point.model, served0[0] + outcome.requests)
    _judge(outcome, counted[0] - served0[0], counted[1] - served0[1], point)
    per = cpu.per_request_us(cpu0, cpu1, outcome.requests)
    return Sample(throughput=outcome.throughput, p50_ms=outcome.p50_ms, p99_ms=outcome.p99_ms,
                  count=outcome.requests, cpu_server_us=per[0], cpu_children_us=per[1], cpu_client_us=per[2])


def _judge(outcome: Outcome, successes: int, failures: int, point: Point) -> None:
    """Raises RuntimeError unless every request of the window succeeded.

    gRPC (h2load, a count of requests): the server counted each as a success, none as a failure:
    an answer with grpc-status other than 0, which h2load counts as succeeded, is a failure there.
    HTTP (wrk, a duration): an error answer has an error status, which wrk counts; when its time
    is up wrk drops the requests in flight (at most one per connection), which a server may count
    as failed (pystub counts a request whose client left), so up to that many failures are
    theirs, and the successes must cover what wrk completed."""
    allowed = 0 if point.protocol == "grpc" else point.concurrency
    if outcome.errors or successes < outcome.requests or failures > allowed or not outcome.requests:
        raise RuntimeError(f"{outcome.errors} generator errors; the server counted {successes} successes and "
                           f"{failures} failures for {outcome.requests} completed requests: not a measurement")
