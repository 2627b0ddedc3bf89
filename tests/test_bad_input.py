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


# --- the number rule: one for every number a command carries ------------------------------------

TWENTY = "00000000000000000079"  # 20 characters: the most a number may have


@pytest.mark.parametrize("verb, text, value", [
    ("xid", "0000079", 79),
    ("xid", "00000079", 79),
    ("xid", TWENTY, 79),
    ("temperature", "0000000085", (85,)),
    ("clocks", "000000001400 0000002619", (1400, 2619)),
    ("ecc", "sbe 0000000000042", 42),
    ("nvlink", "00000003 errors 000000000005", 5),
    ("power_limit", "00000000000500.5", 500.5),
    ("locked_clocks", "0000000000001000 00000001500", (1000, 1500)),
    ("mig", "create 00000000000000000019:0000000000", None),
])
def test_a_number_is_read_whatever_its_leading_zeros(verb, text, value):
    from mokkafs.model import commands

    event = commands.command(commands.gpu(0), verb, text).event
    got = {"xid": lambda e: e.code, "temperature": lambda e: e.values, "clocks": lambda e: e.values,
           "ecc": lambda e: e.count, "nvlink": lambda e: e.count, "power_limit": lambda e: e.value,
           "locked_clocks": lambda e: e.value, "mig": lambda e: None}[verb](event)
    assert got == value


@pytest.mark.parametrize("verb, text", [
    ("xid", "0" + TWENTY),
    ("temperature", "0" * 40 + "85"),
    ("ecc", "sbe 000000000000000000042"),
    ("power_limit", "0000000000000000500.5"),
    ("mig", "create_gi 000000000000000000009"),
])
def test_a_number_past_twenty_characters_is_refused_saying_so(verb, text):
    from mokkafs.model import commands
    from mokkafs.model.events import InvalidCommand

    with pytest.raises(InvalidCommand, match=r"characters, more than the 20 a number may have"):
        commands.command(commands.gpu(0), verb, text)


@pytest.mark.level("daemon")
def test_control_files_take_numbers_by_one_rule(tmp_path, expect_log):
    """Written to the files themselves: 8 and 10 digits read as 7 do; 21 characters are refused
    (EINVAL) and change nothing."""
    import errno

    import trio
    import trio.testing

    from test_scenarios import daemon
    from test_virtual_time import read, write

    expect_log(r"EINVAL write .*more than the 20 a number may have")

    async def main(mock):
        async with daemon(tmp_path, mock) as d:
            out = {}
            for path, data in (("gpu0/inject_xid", b"00000079\n"), ("gpu1/temperature", b"0000000042\n"),
                               ("gpu1/inject_ecc", b"dbe 0000000003\n"), ("gpu1/nvlink", b"000000002 down\n"),
                               ("ib/mlx5_0/port1", b"errors 00000000007\n"), ("gpu1/power", b"0" * 21 + b"\n"),
                               ("gpu1/utilization", b"00000000000000000090 0000040\n")):
                out[path] = await write(d.ops, path, data)
            out["xid"] = (await read(d.ops, "gpu0/inject_xid")).split()[0]
            out["temperature"] = await read(d.ops, "gpu1/temperature")
            out["ecc"] = "volatile dbe dram 3" in await read(d.ops, "gpu1/inject_ecc")
            out["port"] = await read(d.ops, "ib/mlx5_0/port1")
            out["utilization"] = await read(d.ops, "gpu1/utilization")
            return out

    mock = trio.testing.MockClock()
    out = trio.run(main, mock, clock=mock)
    assert out["gpu1/power"] == errno.EINVAL
    assert [k for k, v in out.items() if "/" in k and v != 0] == ["gpu1/power"], out
    assert out["xid"] == "79" and out["temperature"] == "42\n" and out["ecc"], out
    assert "symbol_error: 7" in out["port"] or "symbol_error 7" in out["port"], out["port"]
    assert out["utilization"].split()[:2] == ["90", "40"], out["utilization"]
