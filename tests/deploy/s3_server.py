"""A real S3-compatible server on loopback for the remote-repository tests: moto in server mode,
started as a subprocess in its own process group and killed with the group at the end.

Credentials are fake but present: the server accepts any key, the clients must still find one
(in the environment, as a deployment would provide them) or they refuse to sign requests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "pystub-test-key", "AWS_SECRET_ACCESS_KEY": "pystub-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class S3Server:
    """`moto.server` on 127.0.0.1; `client()` is a boto3 client of it."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> S3Server:
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if self.process.poll() is not None:
                    raise RuntimeError(f"moto server exited with {self.process.returncode} before listening") from None
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"timed out after {timeout} s waiting for the moto S3 server on {self.endpoint}")

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def client(self):  # -> botocore S3 client (untyped library)
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    def upload_tree(self, bucket: str, prefix: str, directory: Path) -> None:
        """Put every file below `directory` at `prefix/<relative path>`."""
        client = self.client()
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory).as_posix()}")

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        client = self.client()
        listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
        for item in listing.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
