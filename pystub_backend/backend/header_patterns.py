"""The regular expressions of `--http-header-forward-pattern` / `--grpc-header-forward-pattern`,
read as Triton reads them.

Triton 2.51 builds `RE2("(?i)" + pattern)` and forwards every header (gRPC metadata key) in which
the expression is found (`RE2::PartialMatch`):

    case          ignored, unless the pattern turns it back on: `(?-i)MY_HEADER.*`
    anchoring     none: `x-` is found in `my-x-header`; `^x-.*` anchors it
    syntax        RE2's (`(?-i)`, `\\pL`, `\\C`, `(?P<name>...)`, no backreferences)

With google-re2 installed (the `re2` extra: `pip install pystub-backend[re2]`) the pattern is
compiled by RE2 itself, so every pattern Triton takes means the same here. Without it Python's
`re` reads it, which agrees with RE2 on the patterns such flags use (literals, classes,
repetition, alternation, anchors) once a flag group at the pattern's start, `(?-i)` (which `re`
refuses there), is taken as `re`'s flags; a pattern `re` cannot read is refused with a hint to
install the extra. Either way a pattern neither can compile is refused at start-up
(Triton logs RE2's error and forwards nothing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

try:
    import re2
except ImportError:  # the `re2` extra is not installed: Python's re reads the pattern
    re2 = None

__all__ = ["HeaderPattern", "HeaderPatternError", "RE2_AVAILABLE"]

RE2_AVAILABLE = re2 is not None
_REMEMBERED = 4096  # header names whose answer is kept
# RE2's inline flag groups with no colon at the start of the pattern: (?-i), (?i), (?s-i), ...
_LEADING_FLAGS = re.compile(r"\(\?([imsU]*)(?:-([imsU]+))?\)")


class HeaderPatternError(ValueError):
    """A pattern that cannot be compiled; the message says why."""


class HeaderPattern:
    """A compiled forward pattern: `finds(name)` says whether a header is forwarded."""

    __slots__ = ("text", "engine", "_search", "_seen")

    def __init__(self, text: str, engine: str | None = None) -> None:
        """`engine`: "RE2" or "re"; by default RE2 where google-re2 is installed.

        Raises HeaderPatternError for a pattern that cannot be compiled (or RE2 asked for and missing).
        """
        self.text = text
        self._seen: dict[str, bool] = {}
        self.engine = engine or ("RE2" if RE2_AVAILABLE else "re")
        if self.engine == "RE2":
            self._search = _compile_re2(text)
        elif self.engine == "re":
            self._search = _compile_python(text)
        else:
            raise HeaderPatternError(f"unknown regular expression engine '{engine}' (RE2 or re)")

    def finds(self, name: str) -> bool:
        """Whether the pattern is found in `name` (case-insensitively unless it says otherwise).

        Remembered per name: one RE2 search through its Python binding costs about 1.1 µs (Python's
        re: 0.07 µs; tools/bench_header_patterns.py), and a client sends the same few header names
        on every request, so each name is searched once and then looked up (0.04 µs). At most
        _REMEMBERED names are kept (a client inventing names cannot grow it): then it starts over.
        """
        found = self._seen.get(name)
        if found is None:
            found = self._search(name) is not None
            if len(self._seen) >= _REMEMBERED:
                self._seen.clear()
            self._seen[name] = found
        return found

    def __reduce__(self) -> tuple[type[HeaderPattern], tuple[str, str]]:  # compiled patterns do not pickle
        return HeaderPattern, (self.text, self.engine)

    def __repr__(self) -> str:
        return f"HeaderPattern({self.text!r}, {self.engine})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeaderPattern) and (other.text, other.engine) == (self.text, self.engine)

    def __hash__(self) -> int:
        return hash((self.text, self.engine))


def _compile_re2(text: str) -> Callable[[str], Any]:
    if re2 is None:
        raise HeaderPatternError(f"cannot compile '{text}' with RE2: google-re2 is not installed (the 're2' extra)")
    options = re2.Options()
    options.log_errors = False  # the error is raised here instead of printed by RE2
    try:
        return re2.compile("(?i)" + text, options).search
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
        raise HeaderPatternError(f"invalid regular expression '{text}' (RE2: {reason})") from None


def _compile_python(text: str) -> Callable[[str], Any]:
    flags = re.IGNORECASE
    body = text
    leading = _LEADING_FLAGS.match(text)
    if leading is not None and "U" not in leading.group(0):
        on, off = leading.group(1), leading.group(2) or ""
        flags = (flags | _flag_bits(on)) & ~_flag_bits(off)
        body = text[leading.end():]
    try:
        return re.compile(body, flags).search
    except re.error as error:
        raise HeaderPatternError(f"invalid regular expression '{text}' ({error}; Python's re read it: install the "
                                 f"'re2' extra for RE2's syntax)") from None


def _flag_bits(letters: str) -> re.RegexFlag:
    bits = re.RegexFlag(0)
    for letter in letters:
        bits |= {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}[letter]
    return bits
