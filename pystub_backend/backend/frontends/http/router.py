"""Routes of the HTTP listener: a path pattern, a method and a handler, resolved as aiohttp's
router resolved them (the routes, their order and their answers did not change with the server).

    "/v2/health/live"                         a plain path, compared as it is
    "/v2/models/{model}/infer"                a variable matches one segment ([^{}/]+)
    "/v2/models/{model}/versions/{version:[0-9]+}"   or what its regular expression says
    "/{tail:.*}"                              everything (the frontend workers' relay)

Resolution (aiohttp's UrlDispatcher): the routes are indexed by their path up to the first
variable's segment; a request path is looked up there, then with its last segment cut off, and so
on up to "/", trying each index entry's routes in the order they were added. The first route whose
pattern and method match wins; a pattern that matches with other methods only adds them to the
`Allow` of a 405; nothing at all is a 404. A GET route answers HEAD too; method "*" answers any.
Variables are matched on the path with %2F and %25 still encoded, then decoded.

Resolved routes are remembered by method and path (at most `_CACHE_SIZE` short paths, forgotten
all at once when full): a request to a path seen before costs one dictionary lookup. The variables
are shared by the requests of one path, hence read-only.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystub_backend.backend.frontends.http.messages import Answer, HttpRequest

__all__ = ["Handler", "Route", "Router", "RouteMiss", "get", "post", "route"]

Handler = Callable[["HttpRequest"], Awaitable["Answer"]]

_VARIABLE = re.compile(r"\{(?P<var>[_a-zA-Z][_a-zA-Z0-9]*)(?::(?P<re>.+))?\}")
_SPLIT = re.compile(r"(\{[_a-zA-Z][^{}]*(?:\{[^{}]*\}[^{}]*)*\})")  # aiohttp's ROUTE_RE
_CACHE_SIZE = 1024
_CACHED_PATH = 256  # characters: a longer path is resolved each time (bounds the cache's memory)
Match = tuple["Handler", Mapping[str, str]]


@dataclass(frozen=True)
class Route:
    method: str  # "GET", "POST", ... or "*"
    path: str
    handler: Handler


def get(path: str, handler: Handler) -> Route:
    return Route("GET", path, handler)


def post(path: str, handler: Handler) -> Route:
    return Route("POST", path, handler)


def route(method: str, path: str, handler: Handler) -> Route:
    return Route(method, path, handler)


@dataclass(frozen=True)
class RouteMiss:
    """No route: 404, or 405 with the methods the path allows."""

    status: int
    allowed: frozenset[str] = frozenset()


class _Resource:
    """One path pattern and its handlers by method."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handlers: dict[str, Handler] = {}
        parts = _SPLIT.split(path)
        self.pattern: re.Pattern[str] | None = None
        self.index_key = path.rstrip("/") or "/"
        if len(parts) > 1:
            regex = ""
            for part in parts:
                variable = _VARIABLE.fullmatch(part)
                if variable is not None:
                    regex += f"(?P<{variable['var']}>{variable['re'] or '[^{}/]+'})"
                elif "{" in part or "}" in part:
                    raise ValueError(f"invalid route path {path!r}")
                else:
                    regex += re.escape(part)
            self.pattern = re.compile(regex)
            self.index_key = path.partition("{")[0].rpartition("/")[0].rstrip("/") or "/"

    def match(self, path_safe: str) -> dict[str, str] | None:
        if self.pattern is None:
            return {} if path_safe == self.path else None
        found = self.pattern.fullmatch(path_safe)
        if found is None:
            return None
        return {key: value.replace("%2F", "/").replace("%25", "%") if "%" in value else value
                for key, value in found.groupdict().items()}

    def allowed(self) -> frozenset[str]:
        return frozenset(self.handlers)


class Router:
    """The routes of one listener, added in order."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self._resources: list[_Resource] = []
        self._index: dict[str, list[_Resource]] = {}
        self.cache: dict[tuple[str, str], Match] = {}  # resolved (method, path_safe): the app looks here first
        for each in routes:
            self.add(each)

    def add(self, each: Route) -> None:
        self.cache.clear()
        last = self._resources[-1] if self._resources else None
        if last is not None and last.path == each.path:  # aiohttp's reuse of the last resource
            resource = last
        else:
            resource = _Resource(each.path)
            self._resources.append(resource)
            self._index.setdefault(resource.index_key, []).append(resource)
        resource.handlers[each.method] = each.handler
        if each.method == "GET":
            resource.handlers.setdefault("HEAD", each.handler)

    def add_all(self, routes: Iterable[Route]) -> None:
        for each in routes:
            self.add(each)

    def resolve(self, method: str, path_safe: str) -> Match | RouteMiss:
        """The handler and (read-only) variables of the route for `method` and `path_safe`, else
        the miss."""
        key = (method, path_safe)
        found = self.cache.get(key)
        if found is not None:
            return found
        resolved = self._resolve(method, path_safe)
        if not isinstance(resolved, RouteMiss) and len(path_safe) <= _CACHED_PATH:
            if len(self.cache) >= _CACHE_SIZE:
                self.cache.clear()
            self.cache[key] = resolved
        return resolved

    def _resolve(self, method: str, path_safe: str) -> Match | RouteMiss:
        allowed: set[str] = set()
        index = self._index
        part = path_safe
        while part:
            for resource in index.get(part, ()):
                variables = resource.match(path_safe)
                if variables is None:
                    continue
                handler = resource.handlers.get(method) or resource.handlers.get("*")
                if handler is not None:
                    return handler, MappingProxyType(variables)
                allowed |= resource.allowed()
            if part == "/":
                break
            part = part.rpartition("/")[0] or "/"
        return RouteMiss(405, frozenset(allowed)) if allowed else RouteMiss(404)
