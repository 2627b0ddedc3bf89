"""Level t0: docs/architecture.md stays true. Every module of the package and every hand-written
or generating source of the shims has a row in its module tables, and every row names a file
that exists, so a newcomer's map of the code is never out of date."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"


def _modules() -> set[str]:
    pkg = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "mokkafs").rglob("*.py")
        if "_native" not in p.parts and p.name != "__init__.py"
    }
    shims = {
        p.relative_to(REPO).as_posix()
        for ext in ("*.c", "*.h", "*.py")
        for p in (REPO / "shims").rglob(ext)
        # generated outputs and NVIDIA's header are covered by the row of their generator / user
        if not re.search(r"(_gen\.[ch]|_stubs\.c|/nvml\.h)$", p.as_posix())
    }
    return pkg | shims


def _rows() -> set[str]:
    text = DOC.read_text()
    return set(re.findall(r"^\| `([^`]+)`", text, flags=re.M))


def test_every_module_has_a_row():
    missing = sorted(_modules() - _rows())
    assert missing == [], f"docs/architecture.md has no row for: {missing}"


def test_every_row_names_a_file_that_exists():
    gone = sorted(r for r in _rows() if not (REPO / r.rstrip("/")).exists())
    assert gone == [], f"docs/architecture.md names files that do not exist: {gone}"
