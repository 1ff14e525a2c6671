"""The backend's seams are typed: at most ANY_BUDGET function parameters in `pystub_backend/backend`
may be annotated `Any`.

The rule, read with `ast` from the source: a parameter counts when its annotation is `Any` itself
or has `Any` at its top level, that is as a member of a union (`Any | None`, `Optional[Any]`,
`Union[Any, int]`); `*args: Any` and `**kwargs: Any` count like any other parameter. `Any` nested
inside another type (`dict[str, Any]`, `list[Any]`) does not count: that is a container of
values of many kinds (a JSON document, a metric's labels), not a seam whose type is unknown.
`typing.Any` written as an attribute counts as well, and so does a string annotation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pystub_backend.backend

BACKEND = Path(pystub_backend.backend.__file__).parent
ANY_BUDGET = 40


def _is_any(node: ast.expr) -> bool:
    """Whether an annotation is `Any` or a union with `Any` as one of its members."""
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Attribute):
        return node.attr == "Any"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _is_any(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_any(node.left) or _is_any(node.right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("Optional", "Union"):
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(_is_any(member) for member in members)
    return False


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    arguments = function.args
    starred = [arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None]
    return arguments.posonlyargs + arguments.args + arguments.kwonlyargs + starred


def any_parameters(root: Path) -> list[str]:
    """`path:line function(parameter)` for every parameter under `root` the rule counts."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.extend(f"{path.relative_to(root)}:{node.lineno} {node.name}({arg.arg})"
                             for arg in _parameters(node) if arg.annotation is not None and _is_any(arg.annotation))
    return found


def test_the_rule_reads_annotations_as_documented() -> None:
    source = ("def f(a: Any, b: typing.Any, c: Any | None, d: Optional[Any], e: Union[int, Any], f: 'Any',\n"
              "      g: dict[str, Any], h: list[Any], i: int, j, *args: Any, **kwargs: Any) -> Any: ...\n")
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    counted = [arg.arg for arg in _parameters(function) if arg.annotation is not None and _is_any(arg.annotation)]
    assert counted == ["a", "b", "c", "d", "e", "f", "args", "kwargs"]


def test_the_backend_keeps_its_any_budget() -> None:
    found = any_parameters(BACKEND)
    print(f"{len(found)} parameters typed Any in pystub_backend/backend (budget {ANY_BUDGET})")
    assert len(found) <= ANY_BUDGET, (f"{len(found)} parameters in pystub_backend/backend are typed Any, "
                                      f"over the budget of {ANY_BUDGET}; give these real types:\n" + "\n".join(found))
