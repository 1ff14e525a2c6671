#!/usr/bin/env python3
"""Token streaming through the OpenAI port, side by side with LitServe's OpenAI spec and a bare
aiohttp SSE server, all in the same run, and what tool-call parsing costs a streamed token.

Paths (each POST /v1/chat/completions with "stream": true, from clients in this process):

    ceiling        a bare aiohttp server (its own process) streaming chat chunks of the message's
                   words, with no model behind it: what SSE over aiohttp costs at most
    litserve       LitServe (.bench/litserve, tools/compare/environment.py) with ls.OpenAISpec and
                   a LitAPI whose predict yields the message's words
    pystub         pystub's --openai-port against the mock LLM tests/models/openai_echo
                   (decoupled, one response per word, no delay); the chat template passes the
                   message through, so every path streams the same words
    pystub+tools   the same with `tools` in the request and --tool-call-parser hermes, the message
                   a Hermes tool call of as many words: every word goes through the parser, the
                   client gets `delta.tool_calls` fragments

Each stream generates --tokens words. For 1 and 16 concurrent streams the paths take turns, round
by round; the table shows tokens per second over all streams, the median time to first token, the
server's CPU per 1000 tokens (its processes' user + system time while the path ran) and each
path's tokens per second against LitServe's. After it, each parser's own cost per streamed token,
measured in this process. The load average is printed before and after: the figures are only
comparable within one run.

    .venv/bin/python tools/bench_openai.py --tokens 64 --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from compare.environment import ensure_litserve  # noqa: E402

from pystub_backend.backend.frontends.openai.tool_calls import PARSERS  # noqa: E402
from tests.harness import Backend, make_repository  # noqa: E402
from tests.net import free_ports  # noqa: E402

_CHUNK = ('{{"id":"chatcmpl-x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{{"index":0,'
          '"delta":{{"content":{}}},"finish_reason":null,"logprobs":null}}],"system_fingerprint":null}}')
# The ceiling server: the last message's words as chat chunks, then [DONE] (run with -c).
_CEILING = r'''
import json, re, sys
from aiohttp import web

async def chat(request):
    body = await request.json()
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await reply.prepare(request)
    for word in re.findall(r"\S+\s*", body["messages"][-1]["content"]):
        await reply.write(b"data: " + (CHUNK.format(json.dumps(word))).encode() + b"\n\n")
    await reply.write(b"data: [DONE]\n\n")
    await reply.write_eof()
    return reply

CHUNK = sys.argv[2]
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("ready", flush=True))
'''
# LitServe: a LitAPI streaming the last message's words through ls.OpenAISpec (a file: its worker
# processes are spawned, and import it).
_LITSERVE = r'''
import re, sys
import litserve as ls

class Words(ls.LitAPI):
    def setup(self, device):
        pass

    def predict(self, request):  # the ChatCompletionRequest (its messages, in older releases)
        messages = getattr(request, "messages", request)
        for word in re.findall(r"\S+\s*", messages[-1].content):
            yield word

if __name__ == "__main__":
    server = ls.LitServer(Words(spec=ls.OpenAISpec()), accelerator="cpu", timeout=120)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), num_api_servers=1, generate_client_file=False,
               log_level="warning")
'''
_PASS_THROUGH = "{{ messages[-1]['content'] }}"  # the chat template of the pystub paths
_TOOLS = [{"type": "function", "function": {"name": "record", "parameters": {"type": "object"}}}]

Stream = Callable[[str], Awaitable[tuple[float, int]]]  # message -> (seconds to first token, chunks)


def _arguments(words: int) -> str:
    return "{" + ", ".join(f'"a{k}": {k}' for k in range((words - 5) // 2)) + "}"


def _message(words: int, tools: bool) -> str:
    """`words` words: plain, or a Hermes tool call whose arguments make up the count."""
    if not tools:
        return " ".join(f"w{k}" for k in range(words))
    return '<tool_call> {"name": "record", "arguments": ' + _arguments(words) + " } </tool_call>"


def _sse_stream(session: aiohttp.ClientSession, url: str, tools: bool) -> Stream:
    async def stream(message: str) -> tuple[float, int]:
        body = {"model": "openai_echo", "messages": [{"role": "user", "content": message}], "stream": True,
                **({"tools": _TOOLS} if tools else {})}
        started, first, chunks, arguments = time.perf_counter(), 0.0, 0, ""
        async with session.post(url, json=body) as response:
            if response.status != 200:
                raise AssertionError(f"{url}: {response.status} {await response.text()}")
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content") or delta.get("tool_calls"):
                    chunks += 1
                    first = first or time.perf_counter() - started
                    calls = delta.get("tool_calls") or []  # LitServe sends null
                    arguments += "".join(call["function"].get("arguments", "") for call in calls)
        if tools:
            json.loads(arguments)  # every fragment arrived
        return first, chunks
    return stream


@dataclass
class Measured:
    tokens_per_second: float
    first_token_s: float
    cpu_ms_per_1000: float


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for one in [process, *process.children(recursive=True)]:
                times = one.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass
class _Path:
    """One path's tally over the rounds it ran."""

    stream: Stream
    pids: list[int]
    tools: bool
    seconds: float = 0.0
    cpu: float = 0.0
    tokens: int = 0
    firsts: list[float] = field(default_factory=list)

    async def round(self, concurrency: int, words: int) -> None:
        message = _message(words, self.tools)
        cpu, started = _cpu_seconds(self.pids), time.perf_counter()
        results = await asyncio.gather(*(self.stream(message) for _ in range(concurrency)))
        self.seconds += time.perf_counter() - started
        self.cpu += _cpu_seconds(self.pids) - cpu
        for first, chunks in results:
            if chunks < (words // 2 if self.tools else words):  # the parser holds some text back: fewer chunks
                raise AssertionError(f"a stream delivered {chunks} chunks of {words} words")
            self.firsts.append(first)
        self.tokens += words * concurrency

    def measured(self) -> Measured:
        return Measured(self.tokens / self.seconds, statistics.median(self.firsts), self.cpu * 1e6 / self.tokens)


async def _run_all(urls: dict[str, tuple[str, list[int]]], args: argparse.Namespace) -> dict[tuple[str, int], Measured]:
    """Each concurrency level's rounds, the paths taking turns round by round: a load that drifts
    during the run (the machine is shared) falls on all of them alike."""
    results: dict[tuple[str, int], Measured] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for concurrency in (1, 16):
            paths = {name: _Path(_sse_stream(session, url, name.endswith("tools")), pids, name.endswith("tools"))
                     for name, (url, pids) in urls.items()}
            for path in paths.values():
                await path.stream(_message(args.tokens, path.tools))  # warm up a connection
            for _ in range(args.rounds):
                for path in paths.values():
                    await path.round(concurrency, args.tokens)
            results.update({(name, concurrency): path.measured() for name, path in paths.items()})
    return results


def _table(results: dict[tuple[str, int], Measured], tokens: int) -> str:
    lines = [f"{tokens} tokens a stream; tokens/s over all streams, median time to first token, server CPU",
             f"{'path':<13} {'streams':>7} {'tokens/s':>10} {'TTFT ms':>9} {'CPU ms/1k tok':>14} {'vs litserve':>12}"]
    for (name, concurrency), measured in results.items():
        base = results["litserve", concurrency].tokens_per_second
        lines.append(f"{name:<13} {concurrency:>7} {measured.tokens_per_second:>10.0f} "
                     f"{measured.first_token_s * 1000:>9.2f} {measured.cpu_ms_per_1000:>14.1f} "
                     f"{measured.tokens_per_second / base:>11.2f}x")
    return "\n".join(lines)


def _parser_costs(tokens: int, repeats: int = 200) -> str:
    """Each parser fed a call of `tokens` word-sized pieces: microseconds per piece, in this process."""
    texts = {"hermes": _message(tokens, tools=True),
             "llama3": '{"name": "record", "parameters": ' + _arguments(tokens) + " }",
             "mistral": '[TOOL_CALLS] [{"name": "record", "arguments": ' + _arguments(tokens) + " }]"}
    lines = ["tool-call parsing, per streamed token (this process, one core):",
             f"{'parser':<9} {'pieces':>7} {'us/token':>9}"]
    for name, text in texts.items():
        pieces = [piece + " " for piece in text.split(" ")]
        started = time.perf_counter()
        for _ in range(repeats):
            parser = PARSERS[name]()
            for piece in pieces:
                parser.feed(piece)
            parser.finish()
        per_token = (time.perf_counter() - started) / (repeats * len(pieces))
        lines.append(f"{name:<9} {len(pieces):>7} {per_token * 1e6:>9.2f}")
    return "\n".join(lines)


def _start(command: list[str], ready: Callable[[], bool], what: str, timeout: float = 120) -> subprocess.Popen[str]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            raise RuntimeError(f"{what} did not start within {timeout:.0f} s (exit {process.poll()})")
        time.sleep(0.2)
    return process


def _answers(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            import urllib.request
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError as exc:
            return getattr(exc, "code", 0) in (404, 405)  # the port answers, not this path
    return ready


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop the server and every process of its session (LitServe forks its workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what the server left of its own
    process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="words generated per stream")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each concurrency level")
    args = parser.parse_args()
    litserve_python = ensure_litserve()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    ceiling_port, litserve_port = free_ports(2)
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "litserve_words.py").write_text(_LITSERVE)
        ceiling = _start([sys.executable, "-c", _CEILING, str(ceiling_port), _CHUNK],
                         _answers(f"http://127.0.0.1:{ceiling_port}/"), "the ceiling server")
        try:
            litserve = _start([str(litserve_python), str(Path(work) / "litserve_words.py"), str(litserve_port)],
                              _answers(f"http://127.0.0.1:{litserve_port}/health"), "LitServe")
        except BaseException:
            _stop(ceiling)
            raise
        try:
            repository = make_repository(Path(work), "openai_echo")
            with Backend(repository, "--openai-port", "0", "--chat-template", _PASS_THROUGH,
                         "--tool-call-parser", "hermes") as backend:
                chat = f"{backend.openai_url}/chat/completions"
                urls = {"ceiling": (f"http://127.0.0.1:{ceiling_port}/v1/chat/completions", [ceiling.pid]),
                        "litserve": (f"http://127.0.0.1:{litserve_port}/v1/chat/completions", [litserve.pid]),
                        "pystub": (chat, [backend.pid]), "pystub+tools": (chat, [backend.pid])}
                results = asyncio.run(_run_all(urls, args))
        finally:
            _stop(ceiling)
            _stop(litserve)
    print(_table(results, args.tokens))
    print(_parser_costs(args.tokens))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
