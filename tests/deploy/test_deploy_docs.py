"""The commands in docs/deploying.md: every file they name exists, every chart install renders
with exactly the values it gives and every object it or `kubectl apply` would create validates."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from harness import ROOT
from manifests import load_documents, render, validate, values_file

DOC = ROOT / "docs" / "deploying.md"


def _commands() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def _option_values(words: list[str], *names: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in names]


def _set(values: dict[str, Any], assignment: str) -> None:
    key, _, value = assignment.partition("=")
    *parents, last = key.split(".")
    for parent in parents:
        values = values.setdefault(parent, {})
    values[last] = value


def _check_helm(words: list[str]) -> None:
    for path in _option_values(words, "-f", "--values"):
        assert (ROOT / path).is_file(), f"docs name a missing values file: {path}"
    chart = words[3]
    if not chart.startswith("deploy/"):
        return  # a chart from elsewhere (the Prometheus adapter): only its values file is ours
    values: dict[str, Any] = {}
    for path in _option_values(words, "-f", "--values"):
        values.update(values_file(ROOT / path))
    for assignment in _option_values(words, "--set"):
        _set(values, assignment)
    documents = render(values, name=words[2])
    assert documents
    for document in documents:
        validate(document)


def test_the_documented_commands_name_real_files_and_render_valid_objects() -> None:
    checked: list[str] = []
    for words in _commands():
        if words[:2] in (["helm", "install"], ["helm", "template"]):
            _check_helm(words)
        elif words[:2] == ["kubectl", "apply"]:
            for path in _option_values(words, "-f"):
                documents = load_documents((ROOT / path).read_text())
                assert documents, path
                for document in documents:
                    validate(document)
        elif words[:2] in (["docker", "build"], ["buildah", "bud"]):
            for path in _option_values(words, "-f", "--ignorefile"):
                assert (ROOT / path).is_file(), f"docs name a missing file: {path}"
        else:
            continue
        checked.append(" ".join(words[:2]))
    assert checked.count("helm install") >= 3 and checked.count("kubectl apply") >= 2, checked
    assert {"docker build", "buildah bud"} <= set(checked), checked


def test_every_deploy_file_is_mentioned_in_the_docs() -> None:
    text = DOC.read_text()
    for path in sorted((ROOT / "deploy").rglob("*")):
        if path.is_file() and path.parent.name in ("examples", "kserve"):
            assert str(path.relative_to(ROOT)) in text or path.name in text, f"{path} is not documented"


def test_docs_only_link_files_that_exist() -> None:
    for match in re.findall(r"`(deploy/[\w./-]+|tests/[\w./-]+)`", DOC.read_text()):
        assert (ROOT / match.rstrip("/")).exists() or Path(ROOT, match).exists(), match
