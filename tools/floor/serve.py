"""The floor's parent process: one model process, HTTP and gRPC on one asyncio loop (the standard
library's, as pystub's backend). Stops on SIGTERM or SIGINT: the listeners close, then the link,
and the model process, reading the end of its socket, returns.

    python tools/floor/serve.py HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

sys.path[1:1] = [str(Path(__file__).resolve().parents[1])]  # tools/: compare.bare_messages

import grpc_front  # noqa: E402 - after the path is set
import http_front  # noqa: E402
import model_link  # noqa: E402

_MODEL_EXIT_SECONDS = 10.0  # for the model process to return once its socket closed


async def serve(http_port: int, grpc_port: int) -> None:
    loop = asyncio.get_running_loop()
    link, model = model_link.start(loop)
    try:
        listeners = [await loop.create_server(lambda: http_front.HttpConnection(link), "127.0.0.1", http_port),
                     await loop.create_server(lambda: grpc_front.GrpcConnection(link), "127.0.0.1", grpc_port)]
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        for listener in listeners:
            listener.close()
    finally:
        link.close()
        try:
            model.wait(_MODEL_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            model.kill()
            model.wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
