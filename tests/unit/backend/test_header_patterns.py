"""The header forward patterns read as Triton 2.51 reads them (`RE2("(?i)" + pattern)`, searched),
with RE2 itself and with the Python `re` fallback; and `forward_headers`' replacement rules.

The (pattern, header, forwarded) rows are what real Triton 2.51 forwarded for these flags and
headers (`tests/differential/test_header_forward_patterns.py` asks it again on every run).
"""

from __future__ import annotations

import pickle

import pytest

from pystub_backend.backend.arguments import build_parser
from pystub_backend.backend.frontends.forwarding import forward_headers
from pystub_backend.backend.header_patterns import RE2_AVAILABLE, HeaderPattern, HeaderPatternError

ENGINES = ["RE2", "re"]

TRITON_ROWS = [
    ("(?-i)PREFIX_.*", "PREFIX_a", True),
    ("(?-i)PREFIX_.*", "prefix_b", False),   # (?-i): case counts
    ("(?-i)PREFIX_.*", "xPREFIX_c", True),   # found, not anchored
    ("(?-i)PREFIX_.*", "Prefix_D", False),
    ("PREFIX_", "prefix_b", True),           # case ignored by default
    ("PREFIX_", "xprefix_c", True),
    ("PREFIX_", "PREFIX_", True),
    ("PREFIX_", "x-a", False),
    ("prefix_.*|x-(a|b)", "x-ab", True),
    ("prefix_.*|x-(a|b)", "X-B", True),
    ("prefix_.*|x-(a|b)", "x-c", False),
    ("^x-", "my-x-id", False),
    ("x-", "my-x-id", True),
]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    assert RE2_AVAILABLE, "google-re2 (the test extra installs it) is missing: the RE2 rows would not run"
    return request.param


@pytest.mark.parametrize("pattern, header, forwarded", TRITON_ROWS)
def test_patterns_find_as_triton_does(engine: str, pattern: str, header: str, forwarded: bool) -> None:
    assert HeaderPattern(pattern, engine).finds(header) is forwarded


def test_re2_syntax_python_cannot_read() -> None:
    # \pL (a Unicode letter class) is RE2's and Perl's, not Python re's
    assert HeaderPattern(r"^x-\pL+$", "RE2").finds("x-héllo")
    with pytest.raises(HeaderPatternError, match=r"install the 're2' extra"):
        HeaderPattern(r"^x-\pL+$", "re")


@pytest.mark.parametrize("pattern", ["(a", "a**", "[z-a]"])
def test_broken_patterns_are_refused(engine: str, pattern: str) -> None:
    with pytest.raises(HeaderPatternError, match=r"invalid regular expression"):
        HeaderPattern(pattern, engine)


def test_a_pattern_survives_pickling(engine: str) -> None:
    pattern = pickle.loads(pickle.dumps(HeaderPattern("(?-i)PREFIX_", engine)))
    assert pattern == HeaderPattern("(?-i)PREFIX_", engine) and pattern.engine == engine
    assert pattern.finds("xPREFIX_") and not pattern.finds("prefix_")


def test_the_flags_take_re2_syntax() -> None:
    args = build_parser().parse_args(["--model-repository=/m", "--http-header-forward-pattern=(?-i)MY_HEADER.*",
                                      "--grpc-header-forward-pattern=my_header"])
    assert args.http_header_forward_pattern.finds("x-MY_HEADER-1")
    assert not args.http_header_forward_pattern.finds("my_header")
    assert args.grpc_header_forward_pattern.finds("MY_HEADER")


def test_a_broken_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--model-repository=/m", "--http-header-forward-pattern=(a"])
    assert exit_info.value.code == 2
    assert "invalid regular expression '(a'" in capsys.readouterr().err


def test_a_header_replaces_the_parameter_of_its_name() -> None:
    # Triton appends the header after the request's parameter; the model reads the last of the two
    parameters = {"x-tenant": "given", "keep": 1}
    forward_headers([("x-tenant", "header"), ("x-trace", "one"), ("x-trace", "two"), ("other", "no")],
                    parameters, HeaderPattern("^x-"))
    assert parameters == {"x-tenant": "header", "keep": 1, "x-trace": "two"}


def test_reserved_binary_and_triton_headers_are_not_forwarded() -> None:
    parameters: dict = {"sequence_id": 5}
    headers = [("sequence_id", "abc"), ("priority", "9"), ("triton_x", "1"), ("x-bin", b"\x00\x01"), ("x", "ok")]
    forward_headers(headers, parameters, HeaderPattern(".*"))
    assert parameters == {"sequence_id": 5, "x": "ok"}


def test_no_pattern_forwards_nothing() -> None:
    parameters: dict = {}
    forward_headers([("x-a", "1")], parameters, None)
    assert parameters == {}
