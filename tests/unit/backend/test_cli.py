"""The command line: tritonserver-compatible flags, and clear errors for the rest."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import ROOT

from pystub_backend.backend.arguments import parse_args


def test_defaults_bind_loopback():
    options = parse_args(["--model-repository", "/m"])
    assert options.repositories == ["/m"]
    assert (options.http_address, options.grpc_address, options.metrics_address) == ("127.0.0.1",) * 3
    assert (options.http_port, options.grpc_port, options.metrics_port) == (8000, 8001, 8002)
    assert options.exit_on_error and options.strict_readiness and options.auto_complete
    assert options.http_max_input_size == 64 * 2**20
    assert options.grpc.stack == "h2"  # pystub's own gRPC server; --grpc-server=aio is grpc.aio's


def test_both_flag_forms_and_booleans():
    options = parse_args(["--model-repository=/a", "--model-repository", "/b", "--http-port=9000",
                          "--grpc-port", "9001", "--exit-on-error=false", "--strict-readiness", "0",
                          "--allow-metrics=no", "--log-verbose=2", "--exit-timeout-secs=5"])
    assert options.repositories == ["/a", "/b"]
    assert (options.http_port, options.grpc_port) == (9000, 9001)
    assert not options.exit_on_error and not options.strict_readiness and not options.allow_metrics
    assert options.log.log_verbose_level == 2
    assert options.settings.exit_timeout_seconds == 5


def test_auto_complete_switches():
    assert not parse_args(["--model-repository=/m", "--disable-auto-complete-config"]).auto_complete
    assert not parse_args(["--model-repository=/m", "--strict-model-config=true"]).auto_complete
    assert parse_args(["--model-repository=/m", "--strict-model-config=false"]).auto_complete


def test_backend_config():
    options = parse_args(["--model-repository=/m", "--backend-config=python,shm-default-byte-size=4194304",
                          "--backend-config", "python,shm-growth-byte-size=2097152",
                          "--backend-config=onnxruntime,whatever=1"])
    assert options.settings.shm_default_byte_size == 4194304
    assert options.settings.shm_growth_byte_size == 2097152


@pytest.mark.parametrize("entry, text", [
    ("python,shm-default-byte-size=1000", "shm-default-byte-size can't be smaller than 4 MiBs"),
    ("python,shm-growth-byte-size=0", "must be positive"),
    ("python,no-such-key=1", "unknown python backend config 'no-such-key'"),
    ("python-no-equals", "--backend-config option format"),
])
def test_bad_backend_config_is_a_usage_error(entry, text, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", f"--backend-config={entry}"])
    assert info.value.code == 2
    assert text in capsys.readouterr().err


def test_gpu_only_and_noop_flags_are_accepted_and_recorded():
    options = parse_args(["--model-repository=/m", "--cuda-memory-pool-byte-size=0:1024",
                          "--pinned-memory-pool-byte-size", "0", "--http-thread-count=4"])
    assert set(options.ignored) == {"--cuda-memory-pool-byte-size", "--pinned-memory-pool-byte-size",
                                    "--http-thread-count"}


def test_backend_directory_is_stored():
    options = parse_args(["--model-repository=/m", "--backend-directory=/b"])
    assert options.backend_directory == "/b"
    assert options.ignored == []


def test_allow_client_shm_is_off_by_default_as_in_triton():
    assert parse_args(["--model-repository=/m"]).allow_client_shm is False
    assert parse_args(["--model-repository=/m", "--allow-client-shm=true"]).allow_client_shm is True
    assert parse_args(["--model-repository=/m", "--allow-client-shm", "false"]).allow_client_shm is False


def test_model_control_flags():
    options = parse_args(["--model-repository=/m"])
    assert (options.model_control_mode, options.load_models, options.repository_poll_secs) == ("none", [], 15.0)
    options = parse_args(["--model-repository=/m", "--model-control-mode=explicit", "--load-model=a",
                          "--load-model", "b", "--repository-poll-secs", "0.5"])
    assert (options.model_control_mode, options.load_models, options.repository_poll_secs) == (
        "explicit", ["a", "b"], 0.5)


@pytest.mark.parametrize("flag, text", [
    ("--model-control-mode=auto", "invalid choice: 'auto'"),
    ("--repository-poll-secs=0", "expected a number of seconds > 0"),
    ("--repository-poll-secs=soon", "expected a number of seconds > 0"),
])
def test_bad_model_control_flags_are_usage_errors(flag, text, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", flag])
    assert info.value.code == 2
    assert text in capsys.readouterr().err


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pystub_backend.backend", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_unknown_flag_is_a_usage_error_naming_it():
    result = _run_cli("--model-repository=/m", "--no-such-flag=1")
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr


def test_no_op_flags_are_logged_with_their_reason(tmp_path):
    result = _run_cli(f"--model-repository={tmp_path / 'absent'}", "--model-namespacing=false",
                      "--cache-directory=/opt/caches",
                      "--http-port=0", "--grpc-port=0", "--metrics-port=0")
    assert result.returncode == 1  # the repository does not exist; the flags were accepted
    assert ("--model-namespacing is accepted and has no effect: model names are unique across repositories "
            "in pystub") in result.stderr
    assert "--cache-directory is accepted and has no effect: pystub loads no cache shared libraries" in result.stderr


def test_missing_repository_exits_nonzero(tmp_path):
    result = _run_cli(f"--model-repository={tmp_path / 'absent'}", "--http-port=0", "--grpc-port=0",
                      "--metrics-port=0")
    assert result.returncode == 1
    assert "does not exist" in result.stderr
