"""`pystub-backend --help` documents every flag with its default, and `--print-completion` writes
bash and zsh completion generated from the same parser (issue 21 item 6)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT

from pystub_backend.backend.arguments import build_parser
from pystub_backend.backend.flags import FLAGS, PYSTUB_FLAGS

ALL_FLAGS = [flag.name for flag in FLAGS + PYSTUB_FLAGS]


def _run(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "pystub_backend.backend", *args], capture_output=True, text=True,
                            cwd=ROOT, timeout=60, check=True)
    return result.stdout


def test_the_table_has_every_tritonserver_flag() -> None:
    assert len(FLAGS) == 86  # tritonserver 2.51's --help (test_cli_flags compares with the binary)


def test_every_flag_has_a_line_of_help_and_its_default() -> None:
    documented = {}
    for action in build_parser()._actions:
        for name in action.option_strings:
            if name.startswith("--") and name not in ("--help", "--print-completion"):
                documented[name] = action.help or ""
    assert sorted(documented) == sorted(ALL_FLAGS)
    for name, text in documented.items():
        what, _, default = text.rpartition(" (default: ")
        assert len(what) > 5 and default.endswith(")") and len(default) > 1, (name, text)
    assert documented["--log-format"].endswith("(default: default)")
    assert documented["--http-address"].endswith("(default: 127.0.0.1)")
    assert documented["--exit-timeout-secs"].endswith("(default: 30)")
    assert documented["--trace-rate"].startswith("no effect: ") or "trace" in documented["--trace-rate"]


def test_help_output_lists_every_flag() -> None:
    text = _run("--help")
    for name in ALL_FLAGS:
        assert f"  {name} " in text or f"  {name}\n" in text or f", {name} " in text, name
    assert text.count("(default:") >= len(ALL_FLAGS) - 1  # --model-store shares --model-repository's line


def _bash_complete(script: Path, *words: str) -> list[str]:
    """Run the generated completion function in a real bash for the command line `words` (the
    last word is the one being completed) and return COMPREPLY."""
    quoted = " ".join(f"'{word}'" for word in ("pystub-backend", *words))
    program = f'source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _pystub_backend; ' \
              'printf "%s\\n" "${COMPREPLY[@]}"'
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                            timeout=30, check=True)
    return [line for line in result.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_completes_flags_and_values(tmp_path: Path) -> None:
    script = tmp_path / "pystub-backend.bash"
    script.write_text(_run("--print-completion", "bash"))
    assert _bash_complete(script, "--log-f") == ["--log-file", "--log-format"]
    assert _bash_complete(script, "--log-format", "") == ["default", "ISO8601", "json"]
    assert _bash_complete(script, "--log-format", "=") == ["default", "ISO8601", "json"]  # --log-format=<TAB>
    assert _bash_complete(script, "--log-format", "=", "j") == ["json"]  # --log-format=j<TAB>
    assert _bash_complete(script, "--exit-on-error", "f") == ["false"]
    assert _bash_complete(script, "--http-port", "") == []  # a free value: no guesses
    (tmp_path / "models_a").mkdir()
    (tmp_path / "models_file").write_text("")
    assert _bash_complete(script, "--model-repository", str(tmp_path / "models_")) == [str(tmp_path / "models_a")]
    every = set(_bash_complete(script, "--"))
    assert every == set(ALL_FLAGS) | {"--help", "--print-completion"}


def test_zsh_completion_names_every_flag_with_its_values() -> None:
    script = _run("--print-completion", "zsh")
    assert script.startswith("#compdef pystub-backend\n")
    for name in ALL_FLAGS:
        assert f"'*{name}=[" in script or f"'*{name}[" in script, name
    assert "'*--log-format=[" in script and ":value:(default ISO8601 json)'" in script
    assert "'*--model-repository=[model repository (repeatable)]:directory:_files -/'" in script
    assert "'*--disable-auto-complete-config[" in script  # a flag without value has no '='
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n", "-c", script], check=True, timeout=30)  # it parses


def test_an_unknown_shell_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "pystub_backend.backend", "--print-completion", "fish"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and "invalid choice: 'fish'" in result.stderr
