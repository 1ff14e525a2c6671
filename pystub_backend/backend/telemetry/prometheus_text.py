"""The Prometheus text exposition format (version 0.0.4), written by hand.

prometheus_client's own writer would rename Triton's counters (it appends `_total`), so the
server writes the text itself, following the format's rules:

    # HELP <family> <help, with \\ and newline escaped>
    # TYPE <family> counter|gauge|histogram
    <sample name>{<label>="<value, with \\, " and newline escaped>",...} <value>

- every family appears once, its samples right after its TYPE line;
- label names are sorted (as prometheus-cpp, hence Triton, writes them), a histogram's `le` last;
- values: integers as integers, floats as Go's strconv would write them, `+Inf`, `-Inf`, `NaN`;
- histograms: cumulative `<name>_bucket{le="..."}` per bound (bounds written as values: `le="1"`),
  then `le="+Inf"` (equal to the count), `<name>_sum` and `<name>_count`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.utils import floatToGoString

__all__ = ["TextWriter", "format_value", "escape_help", "escape_label_value"]

Labels = Sequence[tuple[str, str]]


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float | int) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < _EXACT_INTEGERS:
        return str(int(value))  # as Triton (prometheus-cpp) prints a whole number: `5`, not `5.0`
    return floatToGoString(value)


_EXACT_INTEGERS = 2.0 ** 53


def _labels_text(labels: Labels, le: str | None = None) -> str:
    pairs = [f'{name}="{escape_label_value(value)}"' for name, value in sorted(labels)]
    if le is not None:
        pairs.append(f'le="{le}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


class TextWriter:
    """Collects families and renders the exposition text."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._families: set[str] = set()

    def family(self, name: str, kind: str, help_text: str) -> None:
        """Start a family. Raises ValueError if it was already written (the text would be invalid)."""
        if name in self._families:
            raise ValueError(f"metric family '{name}' written twice")
        self._families.add(name)
        self._lines.append(f"# HELP {name} {escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Labels, value: float | int) -> None:
        self._lines.append(f"{name}{_labels_text(labels)} {format_value(value)}")

    def histogram(self, name: str, labels: Labels, bounds: Iterable[float], counts: Iterable[int],
                  total: float, count: int) -> None:
        """One histogram series: `counts` are per bound (not cumulative); `count` includes the
        observations above the last bound."""
        cumulative = 0
        for bound, bucket_count in zip(bounds, counts, strict=False):
            cumulative += bucket_count
            self._lines.append(f"{name}_bucket{_labels_text(labels, format_value(float(bound)))} {cumulative}")
        self._lines.append(f"{name}_bucket{_labels_text(labels, '+Inf')} {count}")
        self._lines.append(f"{name}_sum{_labels_text(labels)} {format_value(float(total))}")
        self._lines.append(f"{name}_count{_labels_text(labels)} {count}")

    def raw(self, lines: Iterable[str]) -> None:
        """Lines rendered elsewhere (complete families)."""
        self._lines.extend(lines)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n" if self._lines else ""
