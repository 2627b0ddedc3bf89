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
    assert "memory.total_mib" in refused(big)


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


def _edited(tmp_path: Path, change, name: str = "edited.yaml", source: Path = SHIPPED) -> Path:
    import yaml

    data = yaml.safe_load(source.read_text())
    change(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("key, value, words", [
    ("idle_graphics", 2500, "idle_graphics 2500 MHz is above max_graphics 1980 MHz"),
    ("idle_video", 99999, "idle_video 99999 MHz is above max_video"),
    ("default_app_graphics", 1981, "default_app_graphics 1981 MHz is above max_graphics"),
    ("default_app_mem", 9000, "default_app_mem 9000 MHz is above max_mem"),
])
def test_an_idle_or_default_clock_above_its_maximum_is_refused(tmp_path, key, value, words):
    message = refused(_edited(tmp_path, lambda d: d["clocks"].__setitem__(key, value)))
    assert "invalid profile: clocks: " in message and words in message


COMPOSITION = SHIPPED.parent.parent / "compositions_data" / "hgx-8.yaml"


@pytest.mark.parametrize("loader, source, change, key", [
    (load_profile, SHIPPED, lambda d: d.__setitem__("product_name", "NVIDIA H100\x1b[2J"), "product_name"),
    (load_profile, SHIPPED, lambda d: d.__setitem__("name", "h100\nhealth: healthy"), "name"),
    (load_profile, SHIPPED, lambda d: d["inforom"].__setitem__("oem", "2.1\r"), "inforom.oem"),
    (load_profile, SHIPPED, lambda d: d.__setitem__("vbios_version", "96.00\x85"), "vbios_version"),
    (load_composition, COMPOSITION, lambda d: d.__setitem__("name", "hgx\x07"), "name"),
    (load_composition, COMPOSITION, lambda d: d["cpu"].__setitem__("model", "Xeon\t8480"), "cpu.model"),
    (load_composition, COMPOSITION, lambda d: d["hca"].__setitem__("model", "ConnectX-7\x00"), "hca.model"),
    (load_composition, COMPOSITION, lambda d: d.__setitem__("fabric", {"nodes": ["a", "b\x1b"]}), "fabric.nodes"),
])
def test_control_characters_in_anything_printed_are_refused(tmp_path, loader, source, change, key):
    message = refused(_edited(tmp_path, change, source=source), loader)
    assert f": {key}: " in message and "control character" in message, message


def test_a_hostname_with_control_characters_is_refused():
    from mokkafs.model import compose

    with pytest.raises(ProfileError, match=r"hostname 'node\\x1b\[31m': control character"):
        compose(load_profile("h100"), hostname="node\x1b[31m")


def test_a_number_longer_than_any_key_takes_is_refused_at_its_line(tmp_path):
    text = SHIPPED.read_text()
    long = tmp_path / "long.yaml"
    long.write_text(text.replace("sm_count: 132", "sm_count: " + "9" * 5000, 1))
    line = text[: text.index("sm_count: 132")].count("\n") + 1
    message = refused(long)
    assert f"(line {line})" in message and "a number of 5000 characters" in message
    date = tmp_path / "date.yaml"
    date.write_text(text + "built: 2026-13-45\n")
    assert "month must be in 1..12" in refused(date)


@pytest.mark.parametrize("text, words", [
    ("name: big\nseed: " + "9" * 5000 + "\nsteps:\n  - at: 0\n    command: xid 79\n",
     "big.yaml:2: not YAML: a number of 5000 characters"),
    ("name: twice\nname: again\nsteps:\n  - at: 0\n    command: xid 79\n", "big.yaml:2: not YAML: duplicate key 'name'"),
])
def test_scenario_run_refuses_a_file_it_cannot_read_in_one_line(tmp_path, text, words):
    """Before it looks for the node: `mokka scenario run` of a 5,000-digit seed (Python refuses
    to convert it) or a key given twice ends in one line and exit 2, never a traceback."""
    path = tmp_path / "big.yaml"
    path.write_text(text)
    out = mokka("scenario", "run", str(path), "--root", str(tmp_path / "no-node"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mokka: {words}"), out.stderr


def test_profile_import_names_the_capture_and_the_key_in_one_line(tmp_path):
    import re

    capture = tmp_path / "q.xml"
    capture.write_text(re.sub(r"(<fb_memory_usage>\s*<total>)[^<]*", lambda m: m.group(1) + "99999999999999999999 MiB",
                              CAPTURE.read_text(), count=1))
    out = mokka("profile", "import", str(capture), "-o", str(tmp_path / "p.yaml"), "--fill-from", "h100")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"mokka: {capture}: the imported profile does not load: memory.total_mib: Input should be less than or "
        f"equal to 16777216"], out.stderr


def _mount_once(mnt: Path, *args: str):
    """`mokka mount MNT ARGS` with its pid file beside MNT; unmounted again should it mount."""
    import subprocess
    import sys

    env = dict(os.environ, MOKKA_RUNTIME_DIR=str(mnt.parent / "pids"))
    cmd = [sys.executable, "-m", "mokkafs.cli"]
    try:
        return subprocess.run([*cmd, "mount", str(mnt), *args], capture_output=True, text=True, timeout=60, env=env)
    finally:
        if os.path.ismount(mnt):
            subprocess.run([*cmd, "umount", str(mnt)], capture_output=True, timeout=60, env=env)


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.level("mount")
@pytest.mark.parametrize("args, words", [
    (("--profile", "PROFILE"), "PROFILE: invalid profile: clocks: Value error, idle_graphics 2500 MHz"),
    (("--node", "NODE"), "NODE: invalid composition: gpus: Input should be less than or equal to 64"),
    (("--profile", "b200", "--gpus", "16"), "--gpus 16: b200 (NVIDIA B200) boards sit at most 8 to a node"),
    (("--hostname", "a\x07b"), "hostname 'a\\x07b': control character"),
])
def test_a_refused_mount_says_one_line_exits_2_and_makes_nothing(tmp_path, args, words):
    profile = _edited(tmp_path, lambda d: d["clocks"].__setitem__("idle_graphics", 2500), "bad-profile.yaml")
    node = _edited(tmp_path, lambda d: d.__setitem__("gpus", 65) or d.pop("slots", None), "bad-node.yaml",
                   COMPOSITION)
    args = tuple(str(profile) if a == "PROFILE" else str(node) if a == "NODE" else a for a in args)
    words = words.replace("PROFILE", str(profile)).replace("NODE", str(node))
    state, mnt = tmp_path / "run" / "mokka" / "state", tmp_path / "mnt"
    shm = _shm()
    out = _mount_once(mnt, *args, "--state-dir", str(state))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mokka: {words}"), out.stderr
    assert not (tmp_path / "run").exists() and not mnt.exists()
    assert _shm() <= shm  # nothing new in /dev/shm


@pytest.mark.level("mount")
def test_a_mount_the_daemon_refuses_leaves_no_state_directory_it_made(tmp_path):
    """The daemon's own refusal (here: the mount point is a file) is said in one line, the file
    named, and the state directory `mokka mount` made for it is gone again."""
    mnt = tmp_path / "not-a-dir"
    mnt.write_text("")
    state = tmp_path / "made" / "state"
    out = _mount_once(mnt, "--gpus", "1", "--state-dir", str(state))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [f"mokka: {mnt}: File exists"], out.stderr
    assert not (tmp_path / "made").exists()


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
