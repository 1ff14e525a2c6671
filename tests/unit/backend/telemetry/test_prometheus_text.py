"""backend.telemetry.prometheus_text: the exposition format, checked against prometheus_client's parser."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pystub_backend.backend.telemetry.prometheus_text import TextWriter, format_value


def test_values() -> None:
    # a whole float prints as Triton (prometheus-cpp) prints it: `1`, not `1.0`
    assert [format_value(v) for v in (3, True, 0.5, 1.0, -5.0, 1e20, math.inf, -math.inf)] == \
        ["3", "1", "0.5", "1", "-5", "1e+20", "+Inf", "-Inf"]
    assert format_value(math.nan) == "NaN"


def test_escaping_survives_the_parser() -> None:
    writer = TextWriter()
    writer.family("odd", "gauge", 'help with \\ backslash\nand newline "quoted"')
    writer.sample("odd", [("z", 'a "quoted"\nvalue\\'), ("a", "plain")], 1.5)
    text = writer.text()
    assert text.splitlines()[0] == '# HELP odd help with \\\\ backslash\\nand newline "quoted"'
    assert text.splitlines()[2] == 'odd{a="plain",z="a \\"quoted\\"\\nvalue\\\\"} 1.5'  # sorted labels
    (family,) = text_string_to_metric_families(text)
    assert family.documentation == 'help with \\ backslash\nand newline "quoted"'
    assert family.samples[0].labels == {"a": "plain", "z": 'a "quoted"\nvalue\\'}


def test_histogram_series() -> None:
    writer = TextWriter()
    writer.family("h", "histogram", "a histogram")
    writer.histogram("h", [("m", "x")], [0.5, 1.0], [2, 1], 4.25, 5)
    assert writer.text().splitlines()[2:] == [
        'h_bucket{m="x",le="0.5"} 2', 'h_bucket{m="x",le="1"} 3', 'h_bucket{m="x",le="+Inf"} 5',
        'h_sum{m="x"} 4.25', 'h_count{m="x"} 5']
    (family,) = text_string_to_metric_families(writer.text())
    assert family.type == "histogram" and len(family.samples) == 5


def test_a_family_is_written_once() -> None:
    writer = TextWriter()
    writer.family("c", "counter", "x")
    with pytest.raises(ValueError, match="metric family 'c' written twice"):
        writer.family("c", "counter", "x")
    assert TextWriter().text() == ""
