"""Which modules run compiled: the import hook in front of the compiled hot path.

`tools/build_compiled.py` compiles the hot modules into a tree of their own,
`pystub_backend/_native/pystub_backend/...`, with `manifest.json` naming each module and its
source's SHA-256. `install()` (run by `import pystub_backend`, before any submodule is imported)
puts a finder first on `sys.meta_path` that serves those modules from their extensions, and
nothing else. The `.py` files stay where they are and are what runs:

    PYSTUB_PURE_PYTHON=1    always (the finder is not installed);
    no compiled tree        always (nothing was built, or the build failed and said so);
    a module whose source changed since the build, or whose extension was built for another
    interpreter (`EXECUTION_ENV_PATH` may run a stub on another Python)
                            for that module only, and `STATE` says which.

Cython's extensions hold ordinary Python objects, so compiled and pure modules mix freely.
`STATE` says what was decided; the backend logs it at start-up (a stale module as a warning) and
serves it at `GET /v2/pystub/build`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = ["PURE_ENV", "NativeState", "STATE", "decide", "install"]

PURE_ENV = "PYSTUB_PURE_PYTHON"
# The compiled tree mirrors the package from its parent down: _native/pystub_backend/ipc/wire.<suffix>
_TREE = Path(__file__).resolve().parent / "_native"


@dataclass
class NativeState:
    """What `install()` decided. `mode` is "compiled" (at least one module served compiled) or
    "pure"; `reason` says why pure, or what is left uncompiled."""

    mode: str = "pure"
    reason: str = "not decided yet"
    compiler: str = ""
    compiled: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "reason": self.reason, "compiler": self.compiler,
                "compiled_modules": sorted(self.compiled), "stale_modules": sorted(self.stale)}


STATE = NativeState()


class _CompiledFinder:
    """A meta path finder serving `modules` (full name -> extension file) and nothing else."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        extension = self.modules.get(fullname)
        if extension is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(extension))
        return importlib.machinery.ModuleSpec(fullname, loader, origin=str(extension))

    def invalidate_caches(self) -> None:
        """Nothing cached (importlib.invalidate_caches calls this on every finder)."""


def _fresh_modules(manifest: dict[str, object], tree: Path, state: NativeState) -> dict[str, Path]:
    """The manifest's modules whose extension exists for this interpreter and whose source (beside
    the package, `tree`'s parent) is unchanged; the rest go to `state.stale`. Another interpreter's
    build is not stale: nothing of it is served."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if manifest.get("suffix") != suffix:
        return {}
    served: dict[str, Path] = {}
    modules = manifest.get("modules")
    for module, digest in (modules.items() if isinstance(modules, dict) else ()):
        parts = module.split(".")
        extension = tree.joinpath(*parts[:-1], parts[-1] + suffix)
        try:
            source = tree.parent.parent.joinpath(*parts).with_suffix(".py")
            fresh = hashlib.sha256(source.read_bytes()).hexdigest() == digest
        except OSError:
            fresh = False
        if fresh and extension.is_file():
            served[module] = extension
        else:
            state.stale.append(module)
    return served


def decide(environ: Mapping[str, str], tree: Path) -> tuple[NativeState, dict[str, Path]]:
    """What runs compiled, given the environment and the compiled tree (`<package>/_native`):
    the state to report and the modules to serve (full name -> extension file)."""
    state = NativeState()
    if environ.get(PURE_ENV, "") not in ("", "0"):
        state.reason = f"{PURE_ENV}={environ[PURE_ENV]}"
        return state, {}
    try:
        manifest = json.loads((tree / "manifest.json").read_text())
    except OSError:
        state.reason = "no compiled modules were built (tools/build_compiled.py)"
        return state, {}
    except ValueError as error:
        state.reason = f"the compiled tree's manifest is unreadable ({error})"
        return state, {}
    state.compiler = str(manifest.get("compiler", ""))
    served = _fresh_modules(manifest, tree, state)
    if not served and not state.stale:
        state.reason = f"the compiled modules were built for another interpreter ({manifest.get('suffix')})"
    elif state.stale:
        state.reason = (f"{len(state.stale)} compiled module(s) are older than their sources and run as "
                        "Python; rebuild with tools/build_compiled.py")
    else:
        state.reason = f"every compiled module is current ({len(served)})"
    if served:
        state.mode = "compiled"
        state.compiled = sorted(served)
    return state, served


def install() -> NativeState:
    """Decide once which modules run compiled and put the finder in front (idempotent)."""
    if STATE.reason != "not decided yet":
        return STATE
    decided, served = decide(os.environ, _TREE)
    for name, value in vars(decided).items():
        setattr(STATE, name, value)
    if served:
        sys.meta_path.insert(0, _CompiledFinder(served))
    return STATE
