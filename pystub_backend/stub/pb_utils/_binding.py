"""Argument checking as Triton's pb_utils does it: its classes are pybind11 bindings
(`c_python_backend_utils`), which refuse arguments of the wrong type before any code runs, with
one TypeError text:

    <name>(): incompatible function arguments. The following argument types are supported:
        1. (self: c_python_backend_utils.Tensor) -> str
    <blank line>
    Invoked with: <c_python_backend_utils.Tensor object at 0x7f...>, 1

(constructors: `__init__(): incompatible constructor arguments.`, the signature names the class
and `Invoked with` leaves `self` out; keyword arguments follow as `; kwargs: name=repr, ...`).

`@binding(signature, Arg(...), ...)` puts that check in front of a function: arguments are bound
as pybind11 binds them (positionally in the signature's order, then by keyword; `argN` and `self`
are positional only) and each is tested by its `accepts`. The function is then called with the
same values, positional-only ones positionally and the rest by keyword, so its own parameter
order does not matter. `PybindRepr` gives objects the `<module.Class object at 0x...>` repr those
texts show.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = ["MODULE", "Arg", "binding", "PybindRepr", "STR", "INT", "UINT32", "UINT64", "FLOAT", "BOOL", "NDARRAY",
           "OBJECT", "list_of", "instance_of", "enum_of"]

MODULE = "c_python_backend_utils"
_REQUIRED = object()
_POSITIONAL_ONLY = re.compile(r"^(arg\d+|self)$")
F = TypeVar("F", bound=Callable[..., Any])


class PybindRepr:
    """`<c_python_backend_utils.<Class> object at 0x...>`, as pybind11 objects show themselves."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{MODULE}.{type(self).__name__} object at {id(self):#x}>"


@dataclass(frozen=True)
class Arg:
    """One parameter: its name, what it accepts, its default (none: required)."""

    name: str
    accepts: Callable[[object], bool]
    default: object = _REQUIRED

    @property
    def positional_only(self) -> bool:
        return bool(_POSITIONAL_ONLY.match(self.name))


def _is_str(value: object) -> bool:
    return isinstance(value, (str, bytes))


def _is_int(value: object) -> bool:
    # pybind11's integer caster: ints (bools too) and objects with __index__; never floats or str
    return not isinstance(value, (float, str, bytes)) and (isinstance(value, int) or hasattr(type(value), "__index__"))


def _uint(bits: int) -> Callable[[object], bool]:
    """An unsigned integer of `bits` bits (pybind11 refuses what does not fit)."""
    top = 2**bits - 1
    return lambda value: _is_int(value) and 0 <= int(value) <= top  # type: ignore[call-overload]


def _is_float(value: object) -> bool:
    # pybind11's float caster converts what float() takes from a number: ints, numpy scalars, ...
    return not isinstance(value, (str, bytes)) and any(hasattr(type(value), n) for n in ("__float__", "__index__"))


def _is_bool(value: object) -> bool:
    # numbers count by their truth; None, str, lists, ... are refused (as Triton 2.51's bindings do)
    return isinstance(value, (bool, int, float, np.bool_, np.number))


STR, INT, UINT32, UINT64, FLOAT, BOOL = _is_str, _is_int, _uint(32), _uint(64), _is_float, _is_bool


def NDARRAY(value: object) -> bool:  # noqa: N802 - a predicate named as the type it admits
    return isinstance(value, np.ndarray)


def OBJECT(value: object) -> bool:  # noqa: N802
    return True


def list_of(item: Callable[[object], bool]) -> Callable[[object], bool]:
    """A sequence (not str or bytes, not a dict or set) whose items `item` accepts."""
    def accepts(value: object) -> bool:
        return isinstance(value, (list, tuple, range, np.ndarray)) and all(map(item, value))
    return accepts


def instance_of(cls: type, none: bool = True) -> Callable[[object], bool]:
    """An instance of a bound class; None too where pybind11 holds it by pointer (`none`)."""
    return lambda value: isinstance(value, cls) or (none and value is None)


def enum_of(cls: type) -> Callable[[object], bool]:
    """A member of a bound enum: plain ints are refused."""
    return lambda value: isinstance(value, cls)


class _Parameters:
    """A binding's parameters, with what each call would otherwise recompute: their names, which
    are positional only, and those that may be given by keyword."""

    __slots__ = ("args", "checks", "names", "positional_only", "named", "any_positional_only", "least")

    def __init__(self, args: tuple[Arg, ...]) -> None:
        self.args = args
        self.checks = tuple(a.accepts for a in args)
        self.names = tuple(a.name for a in args)
        self.positional_only = tuple(a.positional_only for a in args)
        self.named = {a.name: a for a in args if not a.positional_only}
        self.any_positional_only = any(self.positional_only)
        # positional arguments needed at least: up to the last parameter without a default
        self.least = max((i + 1 for i, a in enumerate(args) if a.default is _REQUIRED), default=0)

    def accepts(self, given: tuple[Any, ...], keywords: dict[str, Any]) -> bool:
        """Whether pybind11 would bind `given` and `keywords` to these parameters."""
        args = self.args
        if len(given) > len(args):
            return False
        if not keywords:  # the common call: positional arguments only (a loop: no generator per call)
            for accepts, value in zip(self.checks, given, strict=False):
                if not accepts(value):
                    return False
            return len(given) >= self.least
        values = dict(zip(self.names, given, strict=False))
        for name, value in keywords.items():
            if name not in self.named or name in values:
                return False
            values[name] = value
        for arg in args:
            if arg.name not in values:
                if arg.default is _REQUIRED:
                    return False
            elif not arg.accepts(values[arg.name]):
                return False
        return True

    def split(self, given: tuple[Any, ...], keywords: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The bound call as the function takes it: positional-only values, then the rest by name."""
        if not self.any_positional_only:
            named = dict(zip(self.names, given, strict=False))
            if keywords:
                named.update(keywords)
            return [], named
        positional = [v for only, v in zip(self.positional_only, given, strict=False) if only]
        named = {n: v for n, only, v in zip(self.names, self.positional_only, given, strict=False) if not only}
        if keywords:
            named.update(keywords)  # never positional-only names: `accepts` refused those
        return positional, named


def incompatible(name: str, signature: str, shown: tuple[Any, ...], keywords: dict[str, Any],
                 constructor: bool) -> TypeError:
    """pybind11's TypeError for a call that matches no overload."""
    kind = "constructor" if constructor else "function"
    invoked = ", ".join(repr(value) for value in shown)
    if keywords:
        pairs = ", ".join(f"{key}={value!r}" for key, value in keywords.items())
        invoked += f"{'; ' if shown else ''}kwargs: {pairs}"
    return TypeError(f"{name}(): incompatible {kind} arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {invoked}")


def _same_order(function: Callable[..., Any], skip: int, names: tuple[str, ...]) -> bool:
    """Whether `function` takes the binding's parameters under the same names, in the same order,
    positionally or by keyword: then a checked call is passed on as it came (no rebinding)."""
    try:
        taken = list(inspect.signature(function).parameters.values())[skip:skip + len(names)]
    except (TypeError, ValueError):
        return False
    return [p.name for p in taken] == list(names) and \
        all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in taken)


def binding(signature: str | Callable[[], str], *args: Arg, method: bool = True) -> Callable[[F], F]:
    """Check the decorated function's arguments as the pybind11 binding `signature` does
    (a callable: the text made on first use). `method`: the first argument is `self`, shown in
    `Invoked with` except for `__init__`. Raises TypeError with pybind11's text."""
    def wrap(function: F) -> F:
        constructor = function.__name__ == "__init__"
        skip = 1 if method else 0
        parameters = _Parameters(args)
        # Positional-only parameters alone never bind a keyword (accepts refuses one), and split()
        # would pass them on positionally, in the order given: the call can go on as it came.
        direct = all(parameters.positional_only) or _same_order(function, skip, parameters.names)

        @functools.wraps(function)
        def checked(*given: Any, **keywords: Any) -> Any:
            if not args and len(given) == skip and not keywords:   # the common call of a getter
                return function(*given)
            values = given[skip:]
            if not parameters.accepts(values, keywords):
                text = signature() if callable(signature) else signature
                shown = values if constructor else given
                raise incompatible(function.__name__, text, shown, keywords, constructor)
            if direct:
                return function(*given, **keywords)
            positional, named = parameters.split(values, keywords)
            return function(*given[:skip], *positional, **named)
        return checked  # type: ignore[return-value]
    return wrap
