"""Bad profile, composition and capture files: refused with one line naming the file (and the
line or key), never read whole, never hung on, never a traceback."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mokkafs.model.profiles import MAX_INPUT_BYTES, load_composition, load_profile
from mokkafs.model.schema import ProfileError

pytestmark = pytest.mark.level("model")

SHIPPED = Path(__file__).resolve().parent.parent / "mokkafs" / "profiles_data" / "h100.yaml"


def refused(path: Path, loader=load_profile, one_line: bool = True) -> str:
    done: list[str] = []

    def load() -> None:
        try:
            loader(str(path))
        except ProfileError as e:
            done.append(str(e))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    assert done, f"{path}: not refused within 10 s (hung, or accepted)"
    message = done[0]
    assert str(path) in message, message
    if one_line:
        assert "\n" not in message and len(message) < 400, message
    return message


def test_fifos_devices_and_huge_files_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in refused(fifo)
    assert "not a regular file" in refused(Path("/dev/zero"))
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as f:
        f.truncate(3 << 30)  # a sparse 3 GiB file: refused by its size, never read
    assert f"more than the {MAX_INPUT_BYTES}" in refused(huge)
    assert "not a regular file" in refused(fifo, load_composition)


def test_non_utf8_and_duplicate_keys_name_the_line(tmp_path):
    text = SHIPPED.read_text()
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(text.encode() + b"\n# caf\xe9\n")
    assert "not UTF-8" in refused(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text(text + "\nname: again\n")
    message = refused(dup)
    assert "duplicate key 'name'" in message and "line" in message


def test_a_memory_size_no_field_can_hold_is_refused(tmp_path):
    text = SHIPPED.read_text()
    import re

    big = tmp_path / "big.yaml"
    big.write_text(re.sub(r"total_mib: *\d+", f"total_mib: {1 << 70}", text))
    assert "memory.total_mib" in refused(big, one_line=False)


CAPTURE = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi-branches" / "550" / "query.xml"


def mokka(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mokkafs.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("total", ["lots", "99999999999999999999 MiB"])
def test_profile_import_refuses_a_capture_it_cannot_read_in_one_line(tmp_path, total):
    import re

    capture = tmp_path / "q.xml"
    capture.write_text(re.sub(r"(<fb_memory_usage>\s*<total>)[^<]*", lambda m: m.group(1) + total,
                              CAPTURE.read_text(), count=1))
    out = mokka("profile", "import", str(capture), "-o", str(tmp_path / "p.yaml"), "--fill-from", "h100")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "total_mib" in out.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_profile_import_refuses_fifos_and_devices_at_once(tmp_path):
    fifo = tmp_path / "q.xml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        out = mokka("profile", "import", str(path), "-o", str(tmp_path / "p.yaml"))
        assert out.returncode == 2 and "not a regular file" in out.stderr and str(path) in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_scenario_nested_past_the_parser_is_refused_not_a_traceback():
    from mokkafs.model.scenario import ScenarioError, load_text

    text = "name: deep\nsteps:\n  - at: 0\n    command: " + "[" * 3000 + "]" * 3000 + "\n"
    with pytest.raises(ScenarioError, match="deep.yaml: nested too deeply"):
        load_text(text, "deep.yaml")
