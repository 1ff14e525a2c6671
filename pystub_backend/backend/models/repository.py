"""The model repository: finding model directories, reading and completing their configs,
choosing versions (PROTOCOL.md section 5, API.md sections 1 and 15).

    <repo>/<model>/config.pbtxt            optional when auto-complete can fill it in
    <repo>/<model>/<version>/model.py      or `default_model_filename`

Model and instance names become stub names, which Triton refuses when they contain shell
metacharacters (`check_stub_name`). `model_fingerprint` is what repository polling compares.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from pystub_backend.backend.models.config import (
    ConfigError,
    ModelConfig,
    config_from_json,
    config_to_json,
    instance_names,
    load_config_file,
    normalize,
)
from pystub_backend.backend.models.remote import RemoteRepositoryError, is_remote, sync_repository
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess, StubStartError

__all__ = ["ModelSource", "RepositoryError", "find_models", "prepare_model", "select_versions", "model_file",
           "check_stub_name", "model_fingerprint", "INVALID_STUB_NAME"]

log = logging.getLogger("pystub.repository")


class RepositoryError(Exception):
    """A model directory that cannot be turned into a loadable model; the text says why."""


@dataclass
class ModelSource:
    name: str
    model_dir: str
    config: ModelConfig
    versions: list[int]

    def model_path(self, version: int) -> str:
        return os.path.join(self.model_dir, str(version), model_file(self.config))


# Triton's python backend (stub_launcher.cc) refuses stub names holding any of these.
_INVALID_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")
INVALID_STUB_NAME = "Invalid stub name: contains invalid characters"


def check_stub_name(name: str) -> None:
    """Raise RepositoryError with Triton's text when `name` cannot name a stub."""
    if not name or not _INVALID_CHARS.isdisjoint(name):
        raise RepositoryError(INVALID_STUB_NAME)


def model_file(config: ModelConfig) -> str:
    return config.default_model_filename or "model.py"


def find_models(repositories: list[str]) -> dict[str, str]:
    """Model name -> model dir over every repository. Raises RepositoryError for a missing
    repository or a model name found in two of them."""
    found: dict[str, str] = {}
    for repository in repositories:
        if is_remote(repository):  # s3://, gs://, as://: read from the local mirror (models/remote.py)
            try:
                repository = sync_repository(repository)
            except RemoteRepositoryError as exc:
                raise RepositoryError(str(exc)) from exc
        if not os.path.isdir(repository):
            raise RepositoryError(f"failed to stat file {repository}: the model repository does not exist")
        for entry in sorted(os.listdir(repository)):
            path = os.path.join(repository, entry)
            if entry.startswith(".") or not os.path.isdir(path):
                continue
            if entry in found:
                raise RepositoryError(f"model '{entry}' exists in multiple model repositories")
            found[entry] = os.path.abspath(path)
    return found


def _numeric_subdirs(model_dir: str) -> list[int]:
    versions = []
    for entry in os.listdir(model_dir):
        if entry.isdigit() and os.path.isdir(os.path.join(model_dir, entry)):
            versions.append(int(entry))
    return sorted(versions)


def select_versions(config: ModelConfig, model_dir: str) -> list[int]:
    """The versions the policy selects among the version directories. Raises RepositoryError."""
    available = _numeric_subdirs(model_dir)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = available
    elif which == "specific":
        chosen = sorted(v for v in set(policy.specific.versions) if v in available)
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-max(1, count):]
    if not chosen:
        raise RepositoryError(f"at least one version must be available under the version policy of model "
                              f"'{config.name}'")
    return chosen


async def _auto_complete(config: ModelConfig, model_path: str, settings: StubSettings) -> ModelConfig:
    """Run the model's `auto_complete_config` in a throw-away stub (API.md section 1)."""
    if not os.path.isfile(model_path):
        return config
    stub = StubProcess(f"{config.name}_auto_complete", settings, config.name)
    try:
        stub.spawn()
        completed = await stub.auto_complete(model_path, json.dumps(config_to_json(config)))
    finally:
        await stub.stop(finalize_timeout=0)
    return config_from_json(completed)


async def prepare_model(name: str, model_dir: str, settings: StubSettings, auto_complete: bool = True,
                        config_override: ModelConfig | None = None) -> ModelSource:
    """Read, complete and normalize a model's config. Raises RepositoryError."""
    check_stub_name(name)
    try:
        if config_override is not None:
            config = config_override
        elif os.path.isfile(os.path.join(model_dir, "config.pbtxt")):
            config = load_config_file(os.path.join(model_dir, "config.pbtxt"))
        else:
            config = ModelConfig()
        if not config.name:
            config.name = name
        versions = _numeric_subdirs(model_dir)
        if auto_complete and versions and not config.platform:
            latest_path = os.path.join(model_dir, str(versions[-1]), model_file(config))
            config = await _auto_complete(config, latest_path, settings)
        config = normalize(config, name)
    except (ConfigError, StubStartError, OSError) as exc:
        raise RepositoryError(str(exc)) from exc
    for _, instance_name, _ in instance_names(config):
        check_stub_name(instance_name)
    return ModelSource(name, model_dir, config, select_versions(config, model_dir))


def model_fingerprint(model_dir: str) -> frozenset[tuple[str, int, int]]:
    """What a change to a model directory changes: `(relative path, mtime_ns, size)` of every file
    and `(relative path, -1, -1)` of every directory below it. `__pycache__` (written when the stub
    imports the model) and hidden entries do not count. A missing directory is empty."""
    entries: set[tuple[str, int, int]] = set()
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        relative_root = os.path.relpath(root, model_dir)
        for name in dirs:
            entries.add((os.path.join(relative_root, name), -1, -1))
        for name in files:
            if name.startswith("."):
                continue
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # removed while we walk: the next poll sees the result
                continue
            entries.add((os.path.join(relative_root, name), stat.st_mtime_ns, stat.st_size))
    return frozenset(entries)
