"""Cloud model repositories: `s3://`, `gs://` and `as://` locations mirrored into a local cache.

A remote repository is listed and copied into a local directory that the rest of the server
reads as if it were a local repository (`find_models`, `model_fingerprint`, the stubs). Each sync
lists the remote tree and downloads only files whose signature (size plus ETag, hash or
modification time, whichever the store reports) changed since the last sync, deletes local files
that disappeared remotely, and leaves unchanged files untouched, so the fingerprints that polling
compares move only when the remote model changed.

Locations, spelled as Triton spells them:

    s3://bucket/prefix                     endpoint from AWS_ENDPOINT_URL, else AWS's
    s3://host:port/bucket/prefix           endpoint http://host:port
    s3://https://host:port/bucket/prefix   endpoint https://host:port
    gs://bucket/prefix
    as://account/container/prefix          Azure Blob Storage (adlfs' `abfs` protocol)

All three go through fsspec (one code path: list with details, get a file); the store's package
(s3fs, gcsfs or adlfs: the `s3`, `gcs`, `azure` extras) is imported only when a location of that
scheme is used. Credentials come from each store's own chain (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, profiles, instance roles).

The cache lives under PYSTUB_REPOSITORY_CACHE (default: `pystub-repository-cache-<uid>` in the
temp directory), one directory per location; it survives restarts so a restarted server fetches
only what changed. Cache layout:

    <cache>/<scheme>-<sha256(location)[:16]>/.pystub-remote.json   relative path -> signature
    <cache>/<scheme>-<sha256(location)[:16]>/.lock                 flock held during a sync
    <cache>/<scheme>-<sha256(location)[:16]>/<model>/...           the mirrored files
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import posixpath
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["RemoteLocation", "RemoteRepositoryError", "cache_root", "is_remote", "parse_location",
           "sync_repository", "REMOTE_SCHEMES"]

REMOTE_SCHEMES = ("s3://", "gs://", "as://")
_EXTRAS = {"s3": "s3", "gcs": "gcs", "abfs": "azure"}
_MANIFEST = ".pystub-remote.json"
_LOCK = ".lock"
_LOCK_TIMEOUT_SECONDS = 120.0
# Bounded network waits for S3: a store that stops answering fails the sync (and the poll logs
# it) instead of hanging the server.
_S3_CONFIG = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}


class RemoteRepositoryError(Exception):
    """A remote repository that cannot be listed or copied; the text names the location."""


class _FileSystem(Protocol):
    """The part of fsspec's AbstractFileSystem a sync uses."""

    def find(self, path: str, *, detail: bool, withdirs: bool) -> Mapping[str, Mapping[str, object]]: ...

    def get_file(self, rpath: str, lpath: str) -> None: ...

    def invalidate_cache(self, path: str | None = None) -> None: ...


@dataclass(frozen=True)
class RemoteLocation:
    """A parsed location: fsspec protocol, the root path inside the store, the store's options."""
    url: str
    protocol: str
    root: str
    options: dict[str, object] = field(default_factory=dict, hash=False)


def is_remote(location: str) -> bool:
    return location.startswith(REMOTE_SCHEMES)


def _s3_location(url: str, rest: str) -> RemoteLocation:
    endpoint = ""
    for scheme in ("http://", "https://"):
        if rest.startswith(scheme):
            host, _, rest = rest[len(scheme):].partition("/")
            endpoint = scheme + host
    if not endpoint:
        first, _, remainder = rest.partition("/")
        if ":" in first:  # Triton's s3://host:port/bucket/path
            endpoint, rest = "http://" + first, remainder
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3", "") or os.environ.get("AWS_ENDPOINT_URL", "")
    options: dict[str, object] = {"config_kwargs": dict(_S3_CONFIG)}
    if endpoint:
        options["endpoint_url"] = endpoint
    return RemoteLocation(url, "s3", rest, options)


def parse_location(url: str) -> RemoteLocation:
    """Parse an `s3://`, `gs://` or `as://` location. Raises RemoteRepositoryError."""
    scheme, _, rest = url.partition("://")
    rest = rest.rstrip("/")  # a leading "/" means an empty bucket name: refused below
    if scheme == "s3":
        location = _s3_location(url, rest)
    elif scheme == "gs":
        location = RemoteLocation(url, "gcs", rest)
    elif scheme == "as":
        account, _, path = rest.partition("/")
        options: dict[str, object] = {"account_name": account} if account else {}
        if os.environ.get("AZURE_STORAGE_KEY"):  # Triton's variable; adlfs reads other names itself
            options["account_key"] = os.environ["AZURE_STORAGE_KEY"]
        location = RemoteLocation(url, "abfs", path, options)
    else:
        raise RemoteRepositoryError(f"unsupported model repository location '{url}': "
                                    f"expected one of {', '.join(REMOTE_SCHEMES)}")
    if not location.root.split("/")[0] or location.root.startswith("/"):
        raise RemoteRepositoryError(f"model repository location '{url}' names no bucket or container")
    return location


def cache_root() -> str:
    """Where remote repositories are mirrored: PYSTUB_REPOSITORY_CACHE or a per-user temp dir."""
    configured = os.environ.get("PYSTUB_REPOSITORY_CACHE", "")
    return configured or os.path.join(tempfile.gettempdir(), f"pystub-repository-cache-{os.getuid()}")


def _filesystem(location: RemoteLocation) -> _FileSystem:
    try:
        import fsspec
        filesystem: _FileSystem = fsspec.filesystem(location.protocol, **location.options)
    except ImportError as exc:
        extra = _EXTRAS[location.protocol]
        raise RemoteRepositoryError(f"model repository '{location.url}' needs the '{extra}' extra: "
                                    f"pip install 'pystub-backend[{extra}]' ({exc})") from None
    return filesystem


def _signature(info: Mapping[str, object]) -> str:
    """What changes when the object changes, from whatever the store reports."""
    for key in ("ETag", "etag", "md5Hash", "content_md5", "LastModified", "last_modified", "updated", "mtime"):
        if info.get(key):
            return f"{info.get('size')}:{info[key]}"
    return str(info.get("size"))


def _relative(root: str, path: str) -> str:
    """The path of a listed object below the root; refuses keys that would escape the cache."""
    relative = path[len(root):].lstrip("/") if path.startswith(root) else ""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        raise RemoteRepositoryError(f"refusing object '{path}' below '{root}': not a relative path")
    return posixpath.normpath(relative)


@dataclass
class _Listing:
    files: dict[str, tuple[str, str]]  # relative path -> (remote path, signature)
    directories: set[str]  # relative paths, including empty ones (directory markers)


def _list(filesystem: _FileSystem, location: RemoteLocation) -> _Listing:
    """Every file and directory below the root. An empty version directory exists in a store only
    as a marker object; it is kept, as a local repository would keep it."""
    try:
        filesystem.invalidate_cache()
        entries = filesystem.find(location.root, detail=True, withdirs=True)
    except FileNotFoundError:
        entries = {}
    except Exception as exc:  # every store raises its own classes; all of them mean "cannot list"
        raise RemoteRepositoryError(f"failed to list model repository {location.url}: "
                                    f"{type(exc).__name__}: {exc}") from exc
    listing = _Listing({}, set())
    for path, info in entries.items():
        if path.rstrip("/") == location.root:
            continue
        relative = _relative(location.root, path.rstrip("/"))
        if info.get("type", "file") == "file" and not path.endswith("/"):
            listing.files[relative] = (path, _signature(info))
        else:
            listing.directories.add(relative)
    if not listing.files:
        raise RemoteRepositoryError(f"failed to stat file {location.url}: the model repository does not exist "
                                    f"or is empty")
    return listing


@contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Hold the cache directory's lock (two servers may share a cache); give up after a deadline."""
    with open(os.path.join(directory, _LOCK), "a") as handle:
        deadline = time.monotonic() + _LOCK_TIMEOUT_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RemoteRepositoryError(
                        f"timed out after {_LOCK_TIMEOUT_SECONDS:.0f}s waiting for the lock of the "
                        f"repository cache {directory} (another server is syncing it)") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_manifest(directory: str) -> dict[str, str]:
    try:
        with open(os.path.join(directory, _MANIFEST)) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in manifest.items()} if isinstance(manifest, dict) else {}


def _write_manifest(directory: str, manifest: dict[str, str]) -> None:
    temporary = os.path.join(directory, _MANIFEST + ".tmp")
    with open(temporary, "w") as handle:
        json.dump(manifest, handle, sort_keys=True)
    os.replace(temporary, os.path.join(directory, _MANIFEST))


def _download(filesystem: _FileSystem, location: RemoteLocation, remote: str, local: str) -> None:
    """Fetch into a temporary name, then rename: a stub never imports a half-written file."""
    os.makedirs(os.path.dirname(local), exist_ok=True)
    temporary = f"{local}.pystub-partial"
    try:
        filesystem.get_file(remote, temporary)
        os.replace(temporary, local)
    except Exception as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise RemoteRepositoryError(f"failed to download {remote} from model repository {location.url}: "
                                    f"{type(exc).__name__}: {exc}") from exc


def _remove_stale(directory: str, stale: set[str], keep: set[str]) -> None:
    """Delete files gone from the store, then directories left empty that the store does not hold."""
    for relative in stale:
        path = os.path.join(directory, relative)
        if os.path.lexists(path):
            os.unlink(path)
    for root, _, _ in os.walk(directory, topdown=False):
        relative = os.path.relpath(root, directory)
        if root != directory and relative not in keep and not os.listdir(root):
            os.rmdir(root)


def _mirror(filesystem: _FileSystem, location: RemoteLocation, directory: str) -> None:
    listing = _list(filesystem, location)
    manifest = _read_manifest(directory)
    for relative in sorted(listing.directories):
        os.makedirs(os.path.join(directory, relative), exist_ok=True)
    for relative, (path, signature) in sorted(listing.files.items()):
        local = os.path.join(directory, relative)
        if manifest.get(relative) != signature or not os.path.isfile(local):
            _download(filesystem, location, path, local)
            manifest[relative] = signature
            _write_manifest(directory, manifest)  # after each file: an interrupted sync resumes
    _remove_stale(directory, set(manifest) - set(listing.files), listing.directories)
    _write_manifest(directory, {k: v for k, v in manifest.items() if k in listing.files})


def sync_repository(url: str) -> str:
    """Bring the local mirror of `url` up to date and return its directory.
    Raises RemoteRepositoryError when the location is malformed, unreachable or empty."""
    location = parse_location(url)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    directory = os.path.join(cache_root(), f"{location.protocol}-{digest}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    filesystem = _filesystem(location)
    with _locked(directory):
        _mirror(filesystem, location, directory)
    return directory
