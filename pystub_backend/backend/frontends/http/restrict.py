"""`--http-restricted-api`: endpoints of a restricted group need a header key=value (403 otherwise);
and state-changing calls follow the access policy (frontends/access.py: loopback peers only,
unless their group is restricted or opened), 403 otherwise.

The groups are Triton's. pystub's admin endpoint (`/v2/pystub/...`) is in "model-repository",
since it restarts models. Paths of no group (unknown routes) are left to the router's 404.
A call changes state when it is not a GET/HEAD/OPTIONS of a state group, except the repository
index (a POST that only reads).
"""

from __future__ import annotations

import re

from pystub_backend.backend.frontends.access import STATE_GROUPS, AccessPolicy
from pystub_backend.backend.frontends.http.messages import HttpRequest, Response, json_response

__all__ = ["path_group", "changes_state", "refusal_response", "READ_METHODS"]

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
_PATTERNS = [(re.compile(pattern), group) for pattern, group in (
    (r"/v2/health/(?:live|ready)", "health"),
    (_MODEL + r"/ready", "health"),
    (r"/v2", "metadata"),
    (r"/v2/models/stats", "statistics"),  # before _MODEL, which would read it as a model named "stats"
    (_MODEL, "metadata"),
    (_MODEL + r"/(?:infer|generate|generate_stream)", "inference"),
    (r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "shared-memory"),
    (_MODEL + r"/config", "model-config"),
    (r"/v2/repository(?:/.*)?", "model-repository"),
    (r"/v2/pystub(?:/.*)?", "model-repository"),
    (_MODEL + r"/stats", "statistics"),
    (r"/v2/trace/setting", "trace"),
    (_MODEL + r"/trace/setting", "trace"),
    (r"/v2/logging", "logging"),
    (r"/v1/(?:models(?:/[^/]+)?|completions|chat/completions|embeddings)", "openai"),  # the OpenAI port
)]


def path_group(path: str) -> str | None:
    """The API group of a request path, None when it belongs to none."""
    path = path.rstrip("/") or "/"
    for pattern, group in _PATTERNS:
        if pattern.fullmatch(path):
            return group
    return None


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_INDEX = re.compile(r"/v2/repository(?:/[^/]+)?/index/?")


def _may_change_state(method: str, path: str) -> bool:
    """A cheap superset of `changes_state`: under /v2/models/ only trace settings change state."""
    return method not in READ_METHODS and (not path.startswith("/v2/models/") or "/trace/setting" in path)


def changes_state(method: str, path: str, group: str | None) -> bool:
    """Whether a request of `group` changes the server's state (see the module docstring)."""
    return group in STATE_GROUPS and method not in READ_METHODS and not _INDEX.fullmatch(path)


def refusal_response(policy: AccessPolicy, request: HttpRequest) -> Response | None:
    """The 403 for a request of a restricted group without the expected header, or for a
    state-changing request the access policy refuses; None when it may go on."""
    restrictions = policy.restrictions
    if not restrictions and not _may_change_state(request.method, request.path):
        return None  # inference and reads: no pattern matching on the hot path
    group = path_group(request.path)
    restriction = restrictions.get(group) if group else None
    if restriction is not None and request.headers.get(restriction.key) != restriction.value:
        return json_response({"error": f"This API is restricted, expecting header '{restriction.key}'"}, status=403)
    if group is not None and changes_state(request.method, request.path, group):
        refusal = policy.refusal(group, request.remote or "")
        if refusal is not None:
            return json_response({"error": refusal}, status=403)
    return None
