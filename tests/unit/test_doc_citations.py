"""Every citation of the documentation in code, tests and docs (`docs/<page>.md#<anchor>`) names a
page that exists and a section of it that exists; the specification lives in the repository.

Anchors are computed as MkDocs computes them (Python-Markdown's `toc` extension: `slugify` of the
heading's text, `_1`, `_2`, ... for repeated headings); the last test checks that computation
against Python-Markdown itself where it is installed (the `docs` extra).
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A citation: the path from the repository root, then optional anchors: `docs/page.md#a`, or more of
# the same page as `docs/page.md#a, #b and #c` (a line break, and a comment's `#`, may come between).
CITATION = re.compile(r"docs/((?:[\w-]+/)*[\w-]+\.md)((?:#[\w-]+)(?:,?\s+(?:and\s+)?(?:#\s+)?#[\w-]+)*)?")
_ANCHOR = re.compile(r"(?<![\w-])#([\w-]+)")
# What the project keeps outside its repository must not be cited at all.
OUTSIDE_SPECS = re.compile(r"\b(?:API|PROTOCOL|DESIGN)\.md\b")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def slugify(text: str) -> str:
    """Python-Markdown's `toc.slugify` (separator "-")."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _heading_text(markdown: str) -> str:
    """The text of a heading as the toc extension sees it: link text kept, markup dropped."""
    text = _LINK.sub(r"\1", markdown)
    return re.sub(r"[`*]", "", text)


def anchors(page: Path) -> list[str]:
    """The ids of a page's headings, in order, as MkDocs gives them."""
    found: list[str] = []
    seen: set[str] = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else _HEADING.match(line)
        if match is None:
            continue
        slug = base = slugify(_heading_text(match.group(2)))
        number = 0
        while slug in seen:
            number += 1
            slug = f"{base}_{number}"
        seen.add(slug)
        found.append(slug)
    return found


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    paths = [ROOT / name for name in listed if name]
    return [p for p in paths if p.is_file() and p.suffix in {".py", ".md", ".pbtxt", ".yaml", ".yml", ".cfg", ".sh",
                                                            ".toml", ".txt", ""}]


def _citations() -> list[tuple[str, int, str, str | None]]:
    """(file, line, page, anchor or None) for every citation in the repository's text files."""
    found = []
    for path in _tracked_text_files():
        if path.resolve() == Path(__file__).resolve():
            continue  # its examples are not citations
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for match in CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            anchors_cited = _ANCHOR.findall(match.group(2) or "")
            for anchor in anchors_cited or [None]:
                found.append((str(path.relative_to(ROOT)), line, match.group(1), anchor))
    return found


def test_every_doc_citation_names_a_page_and_a_section_that_exist() -> None:
    citations = _citations()
    assert len(citations) > 50  # code and tests cite the reference pages throughout
    known: dict[str, set[str]] = {}
    broken = []
    for where, line, page, anchor in citations:
        path = DOCS / page
        if not path.is_file():
            broken.append(f"{where}:{line}: docs/{page} does not exist")
            continue
        ids = known.setdefault(page, set(anchors(path)))
        if anchor is not None and anchor not in ids:
            broken.append(f"{where}:{line}: docs/{page} has no section #{anchor}")
    assert broken == []


def test_nothing_cites_specifications_kept_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in _tracked_text_files() if path.resolve() != this_file
             for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if OUTSIDE_SPECS.search(line)]
    assert found == []


def test_the_check_finds_a_missing_page_and_a_missing_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## The `initialize` arguments\n\n```\n# not a heading\n```\n\n## Title\n")
    assert anchors(page) == ["title", "the-initialize-arguments", "title_1"]
    one = "see docs/reference/protocol.md#http-routes."
    assert CITATION.findall(one) == [("reference/protocol.md", "#http-routes")]
    several = CITATION.search("(docs/reference/protocol.md#grpc-service, #request-parameters,\n    # #cancellation).")
    assert several is not None
    assert _ANCHOR.findall(several.group(2)) == ["grpc-service", "request-parameters", "cancellation"]
    assert "no-such-section" not in anchors(DOCS / "reference" / "protocol.md")


def test_the_anchors_are_the_ones_python_markdown_gives() -> None:
    markdown = pytest.importorskip("markdown", reason="the docs extra installs Python-Markdown")
    for page in sorted(DOCS.rglob("*.md")):
        converter = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
        converter.convert(page.read_text(encoding="utf-8"))
        expected: list[str] = []
        pending = list(converter.toc_tokens)
        while pending:
            token = pending.pop(0)
            expected.append(token["id"])
            pending[:0] = token["children"]
        assert anchors(page) == expected, page.relative_to(ROOT)
