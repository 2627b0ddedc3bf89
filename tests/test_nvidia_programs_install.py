"""scripts/install_go_tools.sh and scripts/go-tools.txt: every pinned program is installed at its
version, a second run builds nothing, and a line that names no program is refused."""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from helpers_go import REPO, TOOLS_LIST, go_tool, pinned

pytestmark = pytest.mark.level("tools")

INSTALL = REPO / "scripts" / "install_go_tools.sh"


def test_every_line_is_one_pinned_program():
    for line in TOOLS_LIST.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, spec, *flags = line.split()
        assert re.fullmatch(r"[a-z][a-z0-9-]*", name), line
        assert re.fullmatch(r"(\./[\w./-]+@local|[\w.-]+(/[\w.-]+)+@v\d+\.\d+\.\d+(-[\w.]+)?)", spec), line
        assert all(f == "cgo" or re.fullmatch(r"in=\./[\w./-]+", f) for f in flags), line
        for f in flags:
            if f.startswith("in="):  # a wrapper module of this repository that requires the package's module
                assert (REPO / f[3:] / "go.mod").is_file(), line


@pytest.mark.parametrize("name", sorted(pinned()))
def test_each_program_is_installed_at_its_pin(name):
    assert go_tool(name).stat().st_size > 0


def test_a_second_run_builds_nothing():
    start = time.monotonic()
    r = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "building" not in r.stdout + r.stderr
    assert time.monotonic() - start < 30


def test_an_unknown_name_is_refused():
    r = subprocess.run([str(INSTALL), "no-such-program"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no-such-program is not in" in r.stderr
