"""Cloud model repositories (models/remote.py) against a real S3-compatible server on loopback.

The backend is started with `--model-repository s3://...`, credentials in its environment, and is
served by moto in server mode; the tests infer through tritonclient, add a model to the bucket
while the server runs (poll and explicit modes), remove one, and check the failures that a
deployment meets (no credentials, a missing bucket, a hostile key, a missing client package).
gs:// and as:// share the code path; here only their parsing and missing-extra errors are tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import EXAMPLES, LONG_LIVED_PIDS, Backend
from s3_server import CREDENTIALS, S3Server

from pystub_backend.backend.models.remote import RemoteRepositoryError, parse_location, sync_repository


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    LONG_LIVED_PIDS.add(server.process.pid)  # type: ignore[union-attr]
    try:
        yield server
    finally:
        LONG_LIVED_PIDS.discard(server.process.pid)  # type: ignore[union-attr]
        server.stop()


def _bucket(s3: S3Server, name: str, *models: str, prefix: str = "repo") -> str:
    s3.client().create_bucket(Bucket=name)
    for model in models:
        s3.upload_tree(name, f"{prefix}/{model}", EXAMPLES / model)
    return name


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Credentials as a deployment gives them; no shared AWS config files of the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDENTIALS, AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               PYSTUB_REPOSITORY_CACHE=str(tmp_path / "cache"))
    env.update(extra)
    return env


def _sync(url: str, env: dict[str, str]) -> str:
    """`sync_repository(url)` in a fresh interpreter, as the server runs it (fsspec's I/O thread
    and connection pool live as long as the process: not this test process's to keep)."""
    code = "import sys; from pystub_backend.backend.models.remote import sync_repository as s; print(s(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RemoteRepositoryError(done.stderr.strip().splitlines()[-1])
    return done.stdout.strip()


def _infer_identity(url: str, model: str = "identity_fp32") -> np.ndarray:
    data = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(result, data)
    return result


def _wait_ready(url: str, model: str, ready: bool = True, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with httpclient.InferenceServerClient(url) as client:
        while time.monotonic() < deadline:
            if client.is_model_ready(model) == ready:
                return
            time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout} s waiting for model '{model}' to be {'' if ready else 'not '}ready")


def test_poll_mode_serves_from_s3_and_picks_up_added_and_removed_models(s3: S3Server, tmp_path: Path) -> None:
    bucket = _bucket(s3, "poll-bucket", "identity_fp32")
    # Triton's spelling of a non-AWS endpoint: s3://host:port/bucket/path
    location = f"s3://127.0.0.1:{s3.port}/{bucket}/repo"
    with Backend(location, "--model-control-mode=poll", "--repository-poll-secs=0.5", env=_env(tmp_path)) as backend:
        _infer_identity(backend.http_url)
        s3.upload_tree(bucket, "repo/add_sub", EXAMPLES / "add_sub")
        _wait_ready(backend.http_url, "add_sub")
        with httpclient.InferenceServerClient(backend.http_url) as client:
            a, b = np.arange(4, dtype=np.float32), np.full(4, 2, dtype=np.float32)
            inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
        # many polls have listed the bucket by now: the unchanged model was never reloaded
        assert "reloading 'identity_fp32'" not in backend.log()
        s3.delete_prefix(bucket, "repo/identity_fp32/")
        _wait_ready(backend.http_url, "identity_fp32", ready=False)
        assert "'identity_fp32' was removed" in backend.log()


def test_explicit_mode_loads_a_model_added_while_serving_endpoint_from_env(s3: S3Server, tmp_path: Path) -> None:
    bucket = _bucket(s3, "explicit-bucket", "identity_fp32", prefix="models/v1")
    env = _env(tmp_path, AWS_ENDPOINT_URL=s3.endpoint)
    with Backend(f"s3://{bucket}/models/v1", "--model-control-mode=explicit", "--load-model=*", env=env) as backend:
        _infer_identity(backend.http_url)
        s3.upload_tree(bucket, "models/v1/string_identity", EXAMPLES / "string_identity")
        with httpclient.InferenceServerClient(backend.http_url) as client:
            assert "string_identity" in {m["name"] for m in client.get_model_repository_index()}
            assert not client.is_model_ready("string_identity")
            client.load_model("string_identity")
            assert client.is_model_ready("string_identity")


def test_a_changed_model_file_is_fetched_again_and_unchanged_files_are_not(s3: S3Server, tmp_path: Path) -> None:
    bucket = _bucket(s3, "change-bucket", "identity_fp32")
    env, url = _env(tmp_path), f"s3://127.0.0.1:{s3.port}/{bucket}/repo"
    local = _sync(url, env)
    config = Path(local, "identity_fp32", "config.pbtxt")
    model = Path(local, "identity_fp32", "1", "model.py")
    before = (config.stat().st_mtime_ns, model.stat().st_mtime_ns)
    s3.client().put_object(Bucket=bucket, Key="repo/identity_fp32/1/model.py", Body=model.read_bytes() + b"# changed\n")
    s3.client().put_object(Bucket=bucket, Key="repo/identity_fp32/2/model.py", Body=model.read_bytes())
    assert _sync(url, env) == local
    assert config.stat().st_mtime_ns == before[0]  # not downloaded again: its fingerprint holds
    assert model.stat().st_mtime_ns != before[1] and model.read_bytes().endswith(b"# changed\n")
    assert Path(local, "identity_fp32", "2", "model.py").is_file()
    s3.client().put_object(Bucket=bucket, Key="repo/identity_fp32/3/", Body=b"")  # an empty version directory
    _sync(url, env)
    assert Path(local, "identity_fp32", "3").is_dir()
    s3.delete_prefix(bucket, "repo/identity_fp32/2/")
    _sync(url, env)
    assert not Path(local, "identity_fp32", "2").exists()  # removed remotely: removed here


def test_without_credentials_the_server_refuses_to_start_and_says_why(s3: S3Server, tmp_path: Path) -> None:
    bucket = _bucket(s3, "nocreds-bucket", "identity_fp32")
    env = {k: v for k, v in _env(tmp_path).items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    # No instance-metadata lookups: this machine has no cloud metadata service to ask.
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    backend = Backend(f"s3://127.0.0.1:{s3.port}/{bucket}/repo", env=env, expect_exit=True).start()
    code = backend.wait_exit(60)
    backend.stop(check=False)
    assert code != 0
    assert "failed to list model repository s3://" in backend.log()
    assert "NoCredentialsError" in backend.log() or "credentials" in backend.log().lower()


def test_a_missing_bucket_is_a_clear_start_up_error(s3: S3Server, tmp_path: Path) -> None:
    backend = Backend(f"s3://127.0.0.1:{s3.port}/no-such-bucket/repo", env=_env(tmp_path), expect_exit=True).start()
    code = backend.wait_exit(60)
    backend.stop(check=False)
    assert code != 0
    assert "s3://127.0.0.1" in backend.log() and "no-such-bucket" in backend.log()


def test_keys_that_would_escape_the_cache_are_refused(s3: S3Server, tmp_path: Path) -> None:
    bucket = _bucket(s3, "hostile-bucket", "identity_fp32")
    s3.client().put_object(Bucket=bucket, Key="repo/identity_fp32/../../../escaped.py", Body=b"print('owned')\n")
    with pytest.raises(RemoteRepositoryError, match="not a relative path"):
        _sync(f"s3://127.0.0.1:{s3.port}/{bucket}/repo", _env(tmp_path))
    assert not list(tmp_path.rglob("escaped.py"))


@pytest.mark.parametrize(("url", "protocol", "root", "options"), [
    ("s3://bucket/a/b", "s3", "bucket/a/b", {}),
    ("s3://10.1.2.3:9000/bucket/a", "s3", "bucket/a", {"endpoint_url": "http://10.1.2.3:9000"}),
    ("s3://https://minio.local:9000/bucket/a/", "s3", "bucket/a", {"endpoint_url": "https://minio.local:9000"}),
    ("gs://bucket/models", "gcs", "bucket/models", {}),
    ("as://account/container/models", "abfs", "container/models", {"account_name": "account"}),
])
def test_locations_are_parsed_as_triton_spells_them(url: str, protocol: str, root: str, options: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    location = parse_location(url)
    assert (location.protocol, location.root) == (protocol, root)
    assert {k: v for k, v in location.options.items() if k != "config_kwargs"} == options


@pytest.mark.parametrize("url", ["s3://", "gs:///models", "as://account"])
def test_locations_without_a_bucket_are_refused(url: str) -> None:
    with pytest.raises(RemoteRepositoryError, match="names no bucket or container"):
        parse_location(url)


def test_a_scheme_whose_client_is_missing_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here, so the missing-extra error cannot be shown")
    except ImportError:
        pass
    monkeypatch.setenv("PYSTUB_REPOSITORY_CACHE", str(tmp_path))
    with pytest.raises(RemoteRepositoryError, match=r"pystub-backend\[gcs\]"):
        sync_repository("gs://bucket/models")


def test_azure_takes_the_account_key_from_tritons_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_KEY", "a-key")
    options = parse_location("as://account/container/models").options
    assert options == {"account_name": "account", "account_key": "a-key"}
