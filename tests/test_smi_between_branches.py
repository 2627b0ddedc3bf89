"""Our nvidia-smi at a driver between the recorded branches (550) and the 590 capture, against a
real node of that driver: the 8 x H100 SXM node at 565.57.01 of tests/fixtures/captures
(thamada/nvidia-smi `nvsim/H100SXMx8_smi.py`), `-q` line for line and the default table's frame,
and the A100 at 555.42.02 `-q` label for label."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers_nvml import Published, consumer_env, nvml_path
from helpers_smi import CAPTURES, shape, smi_binary

pytestmark = pytest.mark.level("shims")

Q_565 = CAPTURES / "nvidia-smi-q.h100.565.57.01.txt"
TABLE_565 = CAPTURES / "nvidia-smi.h100.565.57.01.txt"
Q_555 = CAPTURES / "nvidia-smi-q.a100-80gb.555.42.02.txt"

# -q lines whose value legitimately differs between two nodes: compared by their shape (each run
# of digits, or of hex digits for identifiers, stands for any), with the reason.
SHAPED = {
    "Serial Number": "each board's own", "GPU UUID": "each board's own",
    "VBIOS Version": "the machine's firmware (the h100 profile's is the 580 capture's board's)",
    "Module Id": "the baseboard's wiring of this server",
    "Board ID": "the bus (below)", "Bus": "the server's PCIe layout (hgx-8's slots are not this server's)",
    "Bus Id": "as Bus",
    "Replays Since Reset": "a counter", "Tx Throughput": "a reading", "Rx Throughput": "a reading",
    "Reserved": "the driver's own reservation, 454 MiB at 565 (480 at 580: the profile's)",
    "Used": "a reading", "Free": "total less reserved and used",
    "GPU Current Temp": "a reading", "GPU T.Limit Temp": "a reading", "Memory Current Temp": "a reading",
    "Power Draw": "a reading",
    "Voltage/Graphics": "a reading (685 mV on GPU 0, the profile's idle value, 670 on others)",
}
# Values the real node shows that the model has none for: ours prints N/A (docs/nvidia-smi.md, Gaps).
OURS_NA = {
    "Latest Timestamp": "the InfoROM black box's flush", "Latest Duration": "the InfoROM black box's flush",
    "Host Max": "the host CPU's PCIe generation",
    "Atomic Caps Outbound": "PCIe atomics", "Atomic Caps Inbound": "PCIe atomics",
    "GPU Memory Power Readings/Power Draw": "the memory's power reading",
}
# Values the model has but not as this node: both masked.
DIFFERS = {"Display Mode": "a board setting the model answers Disabled for every board (this node: Enabled; the "
                           "H200's capture at 550: Disabled)"}


@pytest.fixture(scope="module")
def smi(tmp_path_factory) -> Path:
    nvml_path()
    return smi_binary(tmp_path_factory)


def run(smi: Path, node: Published, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(smi), *args], env=consumer_env(node.path), capture_output=True, text=True, timeout=30)


def masked(lines: list[str], ours: bool) -> list[str]:
    """Each -q line with SHAPED values reduced to their shape and, in our output, the OURS_NA
    values the real one has written as <real>; section paths kept to tell same-named labels apart."""
    out, stack = [], []
    for line in lines:
        if line.startswith("GPU 0000"):
            out.append(re.sub(r"[0-9A-F]+", "#", line))
            stack = []
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        label, sep, value = line.partition(" : ")
        label = label.strip() if sep else line.strip()
        del stack[max(depth - 1, 0):]
        path = "/".join(stack + [label])
        if not sep:
            stack.append(label)
            out.append(line)
            continue
        if path == "Timestamp":  # the time of the run
            value = "<time>"
        elif path in DIFFERS:
            value = "<differs>"
        elif path in OURS_NA or label in OURS_NA:
            value = "<real>" if ours and value == "N/A" else "<real>" if not ours else value
        elif label in SHAPED or path in SHAPED:
            value = re.sub(r"[0-9a-fA-F]{2,}|\d+", "#", value)
        out.append(f"{line.partition(' : ')[0]} : {value}")
    return out


@pytest.fixture(scope="module")
def node_565(tmp_path_factory):
    p = Published(tmp_path_factory.mktemp("n565"), "h100", 8, "565.57.01")  # CUDA 12.7: the branch's
    yield p
    p.close()


def test_query_565_equals_the_real_node(smi, node_565):
    """Every line of the real 8 x H100 `-q` at 565.57.01, labels and values, with only what two
    nodes legitimately differ in masked: 565's Platform Info block, GPU Recovery Action, the
    Outbound-then-Inbound atomics, one Power Draw per power section and Capabilities/EGM, 550's
    record does not have; Addressing Mode None, as the real driver before 570."""
    r = run(smi, node_565, "-q")
    assert r.returncode == 0, r.stdout[-500:]
    real = Q_565.read_text().splitlines()
    ours = r.stdout.splitlines()
    assert len(ours) == len(real) + 1  # ours ends with the empty line after the last GPU, as printed
    assert ours[-1] == ""
    assert masked(ours[:-1], True) == masked(real, False)


def test_table_565_has_the_real_frame(smi, node_565):
    """The default table at 565.57.01: every line of the capture (which starts at its frame) in
    the same shape, the line between the tables included."""
    real = TABLE_565.read_text().splitlines()
    ours = run(smi, node_565).stdout.splitlines()[1:]  # our first line is the time
    assert len(ours) == len(real)
    for o, c in zip(ours, real):
        assert shape(o) == shape(c), (o, c)
    assert ours[0] == real[0] and ours[1].replace("565.57.01", "#") == real[1].replace("565.57.01", "#")


def test_query_555_has_the_real_labels(smi, tmp_path):
    """The A100 at 555.42.02: 550's layout but one Power Draw per power section and
    Capabilities/EGM, and Module ID where 565 has Platform Info."""
    node = Published(tmp_path, "a100", 1, "555.42.02", "12.5")
    try:
        ours = run(smi, node, "-q").stdout.splitlines()
    finally:
        node.close()
    real = Q_555.read_text().splitlines()
    first = lambda lines: lines[next(i for i, l in enumerate(lines) if l.startswith("GPU ")):]  # noqa: E731
    real_gpu = first(real)[:first(real)[1:].index("") + 1]
    label = lambda l: l.split(" : ")[0]  # noqa: E731
    assert [label(l) for l in first(ours)[1:len(real_gpu)]] == [label(l) for l in real_gpu[1:]]
    values = dict((label(l).strip(), l.split(" : ")[1]) for l in first(ours) if " : " in l)
    assert values["Addressing Mode"] == "None"


def test_the_branch_table_covers_every_branch_with_a_source():
    """docs/nvidia-smi.md's per-branch table: a row per production branch from 470 to 595, each
    with its source, and every layout the generator makes (records, captures between them, the
    590 and 595 captures) among them."""
    import importlib.util

    doc = (CAPTURES.parents[2] / "docs" / "nvidia-smi.md").read_text()
    table = doc.split("| branch | what it changes", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = {int(r.split("|")[1]): r.split("|")[3].strip() for r in table}
    spec = importlib.util.spec_from_file_location("gen_smi", CAPTURES.parents[2] / "shims" / "nvidia-smi" / "gen_smi.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert set(gen.BRANCHES) | set(gen.BETWEEN) | {590, 595} <= set(rows)
    assert sorted(rows) == [470, 525, 535, 545, 550, 555, 560, 565, 570, 575, 580, 590, 595]
    assert all(rows.values())
    for b, capture in gen.BETWEEN.items():
        assert (CAPTURES / capture).is_file() and capture.split(".", 2)[2].startswith(str(b)), b
