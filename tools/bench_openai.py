#!/usr/bin/env python3
"""Token streaming through the OpenAI port, beside gRPC streaming and a bare aiohttp SSE server.

Paths (all measured in the same run, from clients in this process):

    ceiling   a bare aiohttp server (its own process) streaming the same completion chunks as
              server-sent events, with no model behind it: what SSE over aiohttp costs at most
    openai    pystub's --openai-port, POST /v1/completions with "stream": true, against the mock
              LLM tests/models/openai_echo (decoupled; one response per word, no delay)
    grpc      pystub's gRPC ModelStreamInfer (tritonclient.grpc.aio), the same model and prompt

Each stream generates --tokens words. For 1 and 32 concurrent streams the table shows tokens per
second over all streams and the median time to first token, and each path's ratio to the
ceiling's tokens per second.

    .venv/bin/python tools/bench_openai.py --tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import tritonclient.grpc.aio as grpcclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness import Backend, make_repository  # noqa: E402
from tests.net import free_ports  # noqa: E402

# The ceiling server: the prompt's words as completion chunks, then [DONE] (run with -c).
_CEILING = r'''
import json, re, sys
from aiohttp import web

async def completions(request):
    body = await request.json()
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await reply.prepare(request)
    for word in re.findall(r"\S+\s*", body["prompt"]):
        chunk = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "text": word, "finish_reason": None, "logprobs": None}]}
        await reply.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    await reply.write(b"data: [DONE]\n\n")
    await reply.write_eof()
    return reply

app = web.Application()
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("ready", flush=True))
'''

Stream = Callable[[str], Awaitable[tuple[float, int]]]  # prompt -> (seconds to first token, tokens)


def _sse_stream(session: aiohttp.ClientSession, url: str) -> Stream:
    async def stream(prompt: str) -> tuple[float, int]:
        started, first, tokens = time.perf_counter(), 0.0, 0
        async with session.post(url, json={"model": "openai_echo", "prompt": prompt, "stream": True}) as response:
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if json.loads(line[6:])["choices"][0]["text"]:
                    tokens += 1
                    first = first or time.perf_counter() - started
        return first, tokens
    return stream


def _grpc_stream(client: grpcclient.InferenceServerClient) -> Stream:
    async def stream(prompt: str) -> tuple[float, int]:
        inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL"),
                  grpcclient.InferInput("exclude_input_in_output", [1], "BOOL")]
        inputs[0].set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        inputs[1].set_data_from_numpy(np.array([True]))
        inputs[2].set_data_from_numpy(np.array([True]))

        async def requests():  # type: ignore[no-untyped-def]
            yield {"model_name": "openai_echo", "inputs": inputs, "enable_empty_final_response": True}

        started, first, tokens = time.perf_counter(), 0.0, 0
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            tokens += 1
            first = first or time.perf_counter() - started
        return first, tokens
    return stream


async def _measure(stream: Stream, concurrency: int, rounds: int, words: int) -> tuple[float, float]:
    """(tokens per second over all streams, median seconds to first token)."""
    prompt = " ".join(f"w{k}" for k in range(words))
    await stream(prompt)  # warm up the connection(s)
    firsts: list[float] = []
    total_tokens, total_seconds = 0, 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        results = await asyncio.gather(*(stream(prompt) for _ in range(concurrency)))
        total_seconds += time.perf_counter() - started
        for first, tokens in results:
            if tokens != words:
                raise AssertionError(f"a stream delivered {tokens} of {words} tokens")
            firsts.append(first)
            total_tokens += tokens
    return total_tokens / total_seconds, statistics.median(firsts)


async def _run_all(openai_url: str, ceiling_url: str, grpc_url: str, args: argparse.Namespace
                   ) -> dict[tuple[str, int], tuple[float, float]]:
    results: dict[tuple[str, int], tuple[float, float]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        grpc_client = grpcclient.InferenceServerClient(grpc_url)
        try:
            paths = {"ceiling": _sse_stream(session, ceiling_url), "openai": _sse_stream(session, openai_url),
                     "grpc": _grpc_stream(grpc_client)}
            for concurrency in (1, 32):
                for name, stream in paths.items():
                    results[name, concurrency] = await _measure(stream, concurrency, args.rounds, args.tokens)
        finally:
            await grpc_client.close()
    return results


def _table(results: dict[tuple[str, int], tuple[float, float]], tokens: int) -> str:
    lines = [f"{tokens} tokens a stream; tokens/s over all streams, median time to first token (ms)",
             f"{'path':<9} {'streams':>7} {'tokens/s':>10} {'TTFT ms':>9} {'vs ceiling':>11}"]
    for (name, concurrency), (rate, first) in results.items():
        ceiling = results["ceiling", concurrency][0]
        lines.append(f"{name:<9} {concurrency:>7} {rate:>10.0f} {first * 1000:>9.2f} {rate / ceiling:>10.2f}x")
    return "\n".join(lines)


def _start_ceiling(port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", _CEILING, str(port)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":  # blocks until the server prints, or exits
        raise RuntimeError("the ceiling server did not start")
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="words generated per stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each concurrency level")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        repository = make_repository(Path(work), "openai_echo")
        port = free_ports(1)[0]
        ceiling = _start_ceiling(port)
        try:
            with Backend(repository, "--openai-port", "0") as backend:
                ceiling_url = f"http://127.0.0.1:{port}/v1/completions"
                results = asyncio.run(_run_all(f"{backend.openai_url}/completions", ceiling_url, backend.grpc_url,
                                               args))
        finally:
            ceiling.terminate()
            ceiling.wait(10)
    print(_table(results, args.tokens))


if __name__ == "__main__":
    main()
