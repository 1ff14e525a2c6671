"""pystub_backend.backend.models.snapshot: a version keeps its model.py first, then the other .py
files under its version directory, within the budget; caches and hidden directories are not kept."""

from __future__ import annotations

from pathlib import Path

from pystub_backend.backend.models.snapshot import snapshot_sources


def test_model_py_first_then_the_other_sources_within_the_budget(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    (version / "helpers").mkdir(parents=True)
    (version / "__pycache__").mkdir()
    (version / ".hidden").mkdir()
    (version / "model.py").write_bytes(b"m" * 100)
    (version / "a.py").write_bytes(b"a" * 50)
    (version / "helpers" / "b.py").write_bytes(b"b" * 60)
    (version / "weights.bin").write_bytes(b"w" * 10)
    (version / "__pycache__" / "c.py").write_bytes(b"c")
    (version / ".hidden" / "d.py").write_bytes(b"d")

    kept = snapshot_sources(str(version / "model.py"), budget=1000)
    assert sorted(Path(path).relative_to(version).as_posix() for path in kept) == \
        ["a.py", "helpers/b.py", "model.py"]
    assert kept[str(version / "model.py")] == b"m" * 100

    kept = snapshot_sources(str(version / "model.py"), budget=170)  # model.py and a.py fit, b.py does not
    assert sorted(Path(path).name for path in kept) == ["a.py", "model.py"]
    assert snapshot_sources(str(version / "model.py"), budget=99) == {str(version / "a.py"): b"a" * 50}
