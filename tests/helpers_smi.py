"""Helpers for the nvidia-smi tests: the built binary (or one compiled here until setup.py
builds it), running it against a published state, and reading the real captures."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mokkafs.render import native

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
TEXT_H100 = CAPTURES / "nvidia-smi-text.h100-80gb-hbm3.590.48.01.txt"
TEXT_L40S = CAPTURES / "nvidia-smi-text.l40s.595.80.txt"
XML_PROFILES = ["a100", "h100", "b200", "gb200", "gb300", "l40s", "t4"]


def smi_binary(tmp_factory) -> Path:
    """The nvidia-smi that pip install built, else one compiled from shims/ for this session."""
    built = native.LIB_DIR.parent / "bin" / "nvidia-smi"
    if built.is_file():
        return built
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        pytest.skip("no C compiler to build shims/nvidia-smi")
    out = tmp_factory.mktemp("smi") / "nvidia-smi"
    subprocess.run([cc, "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "shims" / "include"),
                    "-I", str(REPO / "shims" / "common"), *map(str, sorted((REPO / "shims" / "nvidia-smi").glob("*.c"))),
                    str(REPO / "shims" / "common" / "mokka_client.c"), str(REPO / "shims" / "common" / "mokka_view.c"),
                    str(REPO / "shims" / "common" / "mokka_control.c"), "-pthread", "-o", str(out)], check=True)
    return out


def capture_section(path: Path, title: str) -> list[str]:
    """Lines of one `# <title>` section of an nvidia_gpu_exporter text capture."""
    lines = path.read_text().splitlines()
    i = lines.index(f"# {title}") + 1
    while not lines[i].startswith("####"):
        i += 1
    body = []
    for line in lines[i + 1:]:
        if line.startswith("################"):
            break
        body.append(line)
    while body and not body[-1]:
        body.pop()
    return body


def element_paths(gpu) -> list[str]:
    """Element paths under one <gpu>, first occurrence order (lists collapse to one entry)."""
    out, seen = [], set()

    def walk(e, prefix):
        for c in e:
            p = f"{prefix}/{c.tag}"
            if p not in seen:
                seen.add(p)
                out.append(p)
            walk(c, p)

    walk(gpu, "")
    return out


def shape(line: str) -> tuple[int, list[int]]:
    """The layout of a table line, column for column: its length, where its separators are and
    where each cell ends (values are right-aligned to their column; words within a cell are
    joined by single spaces)."""
    import re

    return len(line), [m.end() for m in re.finditer(r"[^\s|]+(?: [^\s|]+)*|\|", line)]
