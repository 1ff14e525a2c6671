"""The model repository: finding model directories, reading and completing their configs, choosing versions
(docs/reference/protocol.md#model-configuration-and-metadata,
docs/reference/model-api.md#files-imports-and-processes, #config-fields-the-backend-reads).

    <repo>/<model>/config.pbtxt            optional when auto-complete can fill it in
    <repo>/<model>/<version>/model.py      or `default_model_filename`

Model and instance names become stub names, which Triton refuses when they contain shell
metacharacters (`check_stub_name`). Paths a config names stay inside the model directory
(`check_model_paths`). `model_fingerprint` is what repository polling compares.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from pystub_backend.backend.config.model_config import (
    ConfigError,
    ModelConfig,
    config_from_json,
    config_parameters,
    config_to_json,
    instance_names,
    load_config_file,
    normalize,
)
from pystub_backend.backend.features.install import feature_services
from pystub_backend.backend.models.python_backends import with_backend_runtime
from pystub_backend.backend.models.remote import RemoteRepositoryError, is_remote, sync_repository
from pystub_backend.backend.supervision.settings import StubSettings
from pystub_backend.backend.supervision.stub_process import StubProcess, StubStartError

__all__ = ["ModelSource", "RepositoryError", "PollError", "POLL_FAILED", "check_config_name", "find_models",
           "prepare_model",
           "select_versions", "model_file", "check_stub_name", "check_model_paths", "model_fingerprint", "config_file",
           "INVALID_STUB_NAME"]

log = logging.getLogger("pystub.repository")
_ENV_PLACEHOLDER = "$$TRITON_MODEL_DIRECTORY"


class RepositoryError(Exception):
    """A model directory that cannot be turned into a loadable model; the text says why."""


class PollError(RepositoryError):
    """The repository does not describe the model: no directory, a config.pbtxt that cannot be
    read, or one that names another model. Triton reports these as a failed poll (the text here
    goes to the log, the client gets `POLL_FAILED`)."""


POLL_FAILED = "failed to load '{name}', failed to poll from model repository"


@dataclass
class ModelSource:
    name: str
    model_dir: str
    config: ModelConfig
    versions: list[int]
    backend_model: str = ""  # a Python-based backend's model.py, which serves every version

    def model_path(self, version: int) -> str:
        return self.backend_model or os.path.join(self.model_dir, str(version), model_file(self.config))


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
    """Run the model's `auto_complete_config` in a throw-away stub
    (docs/reference/model-api.md#files-imports-and-processes)."""
    if not os.path.isfile(model_path):
        return config
    stub = StubProcess(f"{config.name}_auto_complete", settings, config.name, feature_services(None))
    try:
        stub.spawn()
        completed = await stub.auto_complete(model_path, json.dumps(config_to_json(config)))
    finally:
        await stub.stop(finalize_timeout=0)
    return config_from_json(completed)


def config_file(model_dir: str, config_name: str) -> str:
    """`configs/<config_name>.pbtxt` when --model-config-name names one that exists, else config.pbtxt."""
    if config_name:
        custom = os.path.join(model_dir, "configs", f"{config_name}.pbtxt")
        if os.path.isfile(custom):
            return custom
    return os.path.join(model_dir, "config.pbtxt")


def backend_model_file(config: ModelConfig, backend_directory: str) -> str:
    """`<backend_directory>/<backend>/model.py` of a Python-based backend, or "" when there is none."""
    if not backend_directory or not config.backend or config.backend == "python":
        return ""
    path = os.path.join(backend_directory, config.backend, "model.py")
    return path if os.path.isfile(path) else ""


def _inside(model_dir: str, path: str) -> bool:
    root = os.path.realpath(model_dir)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def check_model_paths(config: ModelConfig, model_dir: str, versions: list[int], from_request: bool) -> None:
    """Refuse a config whose paths lead out of the model directory (raises RepositoryError).

    `default_model_filename` names a file of each version directory: not absolute, no `..`, and
    not a symlink resolving outside the model directory (the file is run as the model's code). A
    config sent with a load request (`from_request`) must keep `EXECUTION_ENV_PATH` inside the model
    directory too: a remote caller must not pick an environment (whose activate script runs) from
    elsewhere on disk; a repository's own config.pbtxt may, as in Triton.
    """
    filename = model_file(config)
    if os.path.isabs(filename) or ".." in filename.replace("\\", "/").split("/") or "\0" in filename:
        raise RepositoryError(f"default_model_filename '{filename}' must name a file inside the version "
                              f"directory (no absolute path, no '..')")
    for version in versions:
        if not _inside(model_dir, os.path.join(model_dir, str(version), filename)):
            raise RepositoryError(f"default_model_filename '{filename}' of version {version} leads outside the "
                                  f"model directory (a symbolic link out of it)")
    env = config_parameters(config).get("EXECUTION_ENV_PATH", "") if from_request else ""
    if env and not _inside(model_dir, env.replace(_ENV_PLACEHOLDER, model_dir)):
        raise RepositoryError(f"EXECUTION_ENV_PATH '{env}' of a config sent with the load request must be "
                              f"inside the model directory ({_ENV_PLACEHOLDER}/...)")


async def prepare_model(name: str, model_dir: str, settings: StubSettings, auto_complete: bool = True,
                        config_override: ModelConfig | None = None, backend_directory: str = "",
                        config_name: str = "") -> ModelSource:
    """Read, complete and normalize a model's config. Raises RepositoryError."""
    check_stub_name(name)
    config = config_override if config_override is not None else _read_config(name, model_dir, config_name)
    backend_model = ""
    try:
        if not config.name:
            config.name = name
        backend_model = backend_model_file(config, backend_directory)
        versions = _numeric_subdirs(model_dir)
        if not backend_model:  # before auto-complete, which runs the file
            check_model_paths(config, model_dir, versions, config_override is not None)
        if auto_complete and versions and not config.platform:
            latest_path = backend_model or os.path.join(model_dir, str(versions[-1]), model_file(config))
            config = await _auto_complete(config, latest_path, settings)
        config = normalize(config, name, settings.gpus)
        config = with_backend_runtime(config, backend_directory)  # config-sections hook: runtime "model.py"
    except (ConfigError, StubStartError, OSError) as exc:
        raise RepositoryError(str(exc)) from exc
    for _, instance_name, _ in instance_names(config):
        check_stub_name(instance_name)
    if not backend_model:  # again: auto-complete may have set default_model_filename
        check_model_paths(config, model_dir, versions, config_override is not None)
    return ModelSource(name, model_dir, config, select_versions(config, model_dir), backend_model)


def _read_config(name: str, model_dir: str, config_name: str = "") -> ModelConfig:
    """The model directory's config (`config_file`; empty when there is none). Raises PollError
    when it cannot be read or names another model."""
    path = config_file(model_dir, config_name)
    try:
        config = load_config_file(path) if os.path.isfile(path) else ModelConfig()
    except (ConfigError, OSError) as exc:
        raise PollError(str(exc)) from exc
    check_config_name(name, config)
    return config


def check_config_name(name: str, config: ModelConfig) -> None:
    """Raises PollError when `config` names a model other than `name` (its directory's)."""
    if config.name and config.name != name:
        raise PollError(f"unexpected directory name '{name}' for model '{config.name}', directory name must equal "
                        f"model name")


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
