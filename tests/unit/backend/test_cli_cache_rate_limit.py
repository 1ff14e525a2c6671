"""The response cache and rate limiter flags: `--cache-config`, `--response-cache-byte-size`,
`--rate-limit`, `--rate-limit-resource` (Triton's forms and error texts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT

from pystub_backend.backend.arguments import parse_args
from pystub_backend.backend.scheduling.rate_limiter import ResourceLimit


def test_defaults_are_no_cache_and_no_rate_limiting() -> None:
    options = parse_args(["--model-repository=/m"])
    assert options.cache_config == {}
    assert (options.rate_limit, options.rate_limit_resources) == ("off", [])


def test_cache_config_forms() -> None:
    assert parse_args(["--model-repository=/m", "--cache-config=local,size=1048576"]).cache_config == {
        "local": {"size": "1048576"}}
    assert parse_args(["--model-repository=/m", "--cache-config", "local,size=10",
                       "--cache-config=local,size=20"]).cache_config == {"local": {"size": "20"}}
    assert parse_args(["--model-repository=/m", "--response-cache-byte-size=4096"]).cache_config == {
        "local": {"size": "4096"}}


def test_rate_limit_flags() -> None:
    options = parse_args(["--model-repository=/m", "--rate-limit=execution_count", "--rate-limit-resource=R:2",
                          "--rate-limit-resource", "S:1:0"])
    assert options.rate_limit == "execution_count"
    assert options.rate_limit_resources == [ResourceLimit("R", 2), ResourceLimit("S", 1, 0)]


@pytest.mark.parametrize(("flags", "text"), [
    (["--cache-config=local"], "--cache-config expects <cache>,<setting>=<value>, got 'local'"),
    (["--cache-config=local,size=10", "--response-cache-byte-size=20"],
     "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one or the "
     "other."),
    (["--response-cache-byte-size=abc"], "expected a whole number >= 0, got 'abc'"),
    (["--rate-limit=sometimes"], "invalid choice: 'sometimes'"),
    (["--rate-limit-resource=R"], "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                                  "'<resource_name>:<count>'. Got R"),
])
def test_bad_flags_are_usage_errors(flags: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository=/m", *flags])
    assert info.value.code == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "text"), [
    ("--cache-config=redis,host=h", "unable to find cache 'redis'"),
    ("--cache-config=local,bogus=1", "config didn't contain a valid 'size' field"),
])
def test_a_cache_pystub_cannot_make_fails_at_start_up(tmp_path: Path, flag: str, text: str) -> None:
    """Parsed like any --cache-config; the server refuses it when it starts (exit status 1), as Triton does."""
    result = subprocess.run([sys.executable, "-m", "pystub_backend.backend", f"--model-repository={tmp_path}", flag,
                             "--http-port=0", "--grpc-port=0", "--metrics-port=0"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert text in result.stderr
