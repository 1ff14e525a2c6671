"""The flag table (`flags.FLAGS`): every tritonserver 2.51 flag parses, and the table matches the
parser and, when it is installed, the real binary's `--help`."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from harness import ROOT

from pystub_backend.backend.arguments import build_parser, parse_args
from pystub_backend.backend.flags import FLAGS, PYSTUB_FLAGS, Effect
from pystub_backend.backend.options import Restriction


def _argv(flag) -> list[str]:
    argv = ["--model-repository=/m", flag.name if flag.example is None else f"{flag.name}={flag.example}"]
    if flag.name.startswith("--grpc-use-ssl"):  # TLS needs its files named
        argv += ["--grpc-server-cert=/c", "--grpc-server-key=/k", "--grpc-root-cert=/r"]
    return argv


@pytest.mark.parametrize("flag", FLAGS + PYSTUB_FLAGS, ids=lambda flag: flag.name)
def test_every_flag_parses(flag):
    options = parse_args(_argv(flag))
    assert (flag.name in options.ignored) == (flag.effect is Effect.NO_OP)


def test_table_and_parser_agree():
    parser = build_parser()
    # --help and --print-completion print and exit: they are not server flags.
    parser_flags = {option for action in parser._actions for option in action.option_strings} - {
        "-h", "--help", "--print-completion"}
    assert parser_flags == {flag.name for flag in FLAGS + PYSTUB_FLAGS}


def _tritonserver_help() -> str | None:
    """`tritonserver --help` of the 2.51 binary in .bench/venv, or None when it is not installed."""
    site = next((ROOT / ".bench" / "venv" / "lib").glob("python3*/site-packages"), None) \
        if (ROOT / ".bench" / "venv" / "lib").is_dir() else None
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver" if site else None
    if binary is None or not binary.exists():
        return None
    from tools.triton_env import TritonInstallError, ensure_triton
    try:
        env = ensure_triton(install=False).triton_env()  # what ./dev.sh test installs for the oracle tier
    except TritonInstallError:
        return None
    libs = [str(site / "nvidia_pytriton.libs"), str(binary.parent.parent / "lib"), env["LD_LIBRARY_PATH"]]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True, env=env, timeout=60)
    return result.stdout + result.stderr


def test_table_is_tritonservers_list():
    text = _tritonserver_help()
    if text is None:
        pytest.skip("tritonserver 2.51 is not installed in .bench/venv (tools/bench_compare.py installs it)")
    names = set(re.findall(r"^\s+(--[a-z0-9-]+)", text, re.MULTILINE)) - {"--help"}
    assert len(names) > 80, text[:2000]
    assert names == {flag.name for flag in FLAGS}


def test_unknown_flag_is_rejected(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", "--grpc-use-tls=true"])
    assert info.value.code == 2
    assert "unrecognized arguments: --grpc-use-tls=true" in capsys.readouterr().err


def test_grpc_channel_arguments():
    options = parse_args(["--model-repository=/m", "--grpc-keepalive-time=1000", "--grpc-keepalive-timeout", "500",
                          "--grpc-keepalive-permit-without-calls=true", "--grpc-http2-max-pings-without-data=0",
                          "--grpc-http2-min-recv-ping-interval-without-data=10", "--grpc-http2-max-ping-strikes=0",
                          "--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=100",
                          "--grpc-infer-response-compression-level=high", "--reuse-grpc-port=true"])
    assert options.grpc.channel_args == {
        "grpc.keepalive_time_ms": 1000, "grpc.keepalive_timeout_ms": 500, "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0, "grpc.http2.min_ping_interval_without_data_ms": 10,
        "grpc.http2.max_ping_strikes": 0, "grpc.max_connection_age_ms": 60000,
        "grpc.max_connection_age_grace_ms": 100, "grpc.default_compression_level": 3}
    assert options.grpc.reuse_port
    assert parse_args(["--model-repository=/m"]).grpc.channel_args == {}


def test_restrictions():
    options = parse_args(["--model-repository=/m", "--http-restricted-api=model-repository,statistics:Admin-Key=s3",
                          "--http-restricted-api", "inference:k=v", "--grpc-restricted-protocol=health:h=1"])
    assert options.http_restrictions == {"model-repository": Restriction("admin-key", "s3"),
                                         "statistics": Restriction("admin-key", "s3"),
                                         "inference": Restriction("k", "v")}
    assert options.grpc.restrictions == {"health": Restriction("h", "1")}


@pytest.mark.parametrize("argv, text", [
    (["--http-restricted-api=inference"], "option format is '<api>[,<api>...]:<key>=<value>'"),
    (["--http-restricted-api=inference,k=v"], "option format is '<api>[,<api>...]:<key>=<value>'"),
    (["--grpc-restricted-protocol=admin:k=v"], "unknown API group 'admin'"),
    (["--http-restricted-api=health:a=1", "--http-restricted-api=health:b=2"], "'health' is given more than once"),
    (["--metrics-config=summary_latencies"], "--metrics-config expects <setting>=<value>"),
    (["--cache-config=size=10"], "--cache-config expects <cache>,<setting>=<value>"),
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl-mutual=1", "--grpc-server-cert=c", "--grpc-server-key=k"], "needs --grpc-root-cert"),
    (["--grpc-infer-response-compression-level=max"], "expected one of none, low, medium, high"),
    (["--model-load-thread-count=0"], "expected a whole number > 0"),
    (["--grpc-keepalive-time=-5"], "expected a whole number >= 0"),
])
def test_bad_values_are_usage_errors(argv, text, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", *argv])
    assert info.value.code == 2
    assert text in capsys.readouterr().err


def test_cache_and_metrics_config():
    options = parse_args(["--model-repository=/m", "--cache-config=local,size=1048576", "--cache-config",
                          "redis,host=localhost", "--metrics-config=summary_latencies=true",
                          "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01"])
    assert options.cache_config == {"local": {"size": "1048576"}, "redis": {"host": "localhost"}}
    assert options.metrics_config == {"summary_latencies": "true", "summary_quantiles": "0.5:0.05,0.9:0.01"}
    deprecated = parse_args(["--model-repository=/m", "--response-cache-byte-size=4096"])
    assert deprecated.cache_config == {"local": {"size": "4096"}}


def test_model_loading_flags():
    options = parse_args(["--model-repository=/m", "--model-load-thread-count=2", "--model-load-retry-count=3",
                          "--model-config-name=h100"])
    assert (options.model_load_thread_count, options.model_load_retry_count, options.model_config_name) == (
        2, 3, "h100")




def test_docs_list_every_flag_with_its_effect():
    text = (ROOT / "docs" / "command-line.md").read_text()
    for flag in FLAGS + PYSTUB_FLAGS:
        assert f"| `{flag.name}` |" in text, flag.name
        row = next(line for line in text.splitlines() if line.startswith(f"| `{flag.name}` |"))
        assert f"| {flag.effect.value} |" in row, row
    counts = {effect: sum(1 for flag in FLAGS if flag.effect is effect) for effect in Effect}
    assert f"**{counts[Effect.IMPLEMENTED]} implemented**" in text and f"**{counts[Effect.NO_OP]} no-op**" in text
    assert f"pystub adds {len(PYSTUB_FLAGS)} of its own" in text
