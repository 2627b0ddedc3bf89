"""Real tools against the mount, MIG: NVIDIA's own nvidia-smi of every branch Debian ships (470,
525, 535, 550; fetched by scripts/fetch_nvidia_smi.sh) shows the MIG devices of a partitioned GPU
on our libnvidia-ml, in its default table, -q's MIG Device blocks and -q -x's <mig_devices>, with
the values our own nvidia-smi shows on the same state, and a CUDA process on a MIG device on its
GPU and compute instance.

The first tests compare values with a CUDA process on a MIG device (the numbers of each MIG row,
-q's label/value pairs, -q -x's elements); the last runs every MIG step of the branch recorder
(shims/nvidia-smi/record_branches.py) with both tools and compares them byte for byte."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO, world_readable_node
from helpers import killed_at_end, mount_env, wait_for
from test_cuda_mig import ALLOC_1G, mig_devices, mig_processes
from test_real_nvidia_smi import BRANCHES, Node, driver_version, ok, real_smi

pytestmark = pytest.mark.level("tools")

# One board per branch that the branch drives (470 ends at Ampere). Profile ids 9, 14, 19 are
# 3g, 2g and 1g on both boards.
BOARD = {470: "a100", 525: "h100", 535: "h100", 550: "h100"}
LAYOUT = "9,14,19"


@pytest.fixture(scope="module", params=BRANCHES, ids=[str(b) for b in BRANCHES])
def mig(request):
    """GPU 1 partitioned into three MIG devices, a CUDA process holding 1 GiB on the third."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    branch = request.param
    for mounted in world_readable_node(BOARD[branch], 2, ("--driver-version", driver_version(branch)),
                                       runtime_dir=True):
        for args in (("mig", "enable"), ("mig", "create", LAYOUT)):
            assert mounted.cli("inject", "--root", str(mounted.mnt), "1", *args).returncode == 0
        target = mig_devices(mounted, 1)[2]
        holder = subprocess.Popen([sys.executable, "-c", ALLOC_1G], stdout=subprocess.PIPE, text=True,
                                  env=dict(mount_env(mounted), CUDA_VISIBLE_DEVICES=target["uuid"]))
        with killed_at_end(holder):
            holder.stdout.readline()
            assert wait_for(lambda: holder.pid in mig_processes(mounted))
            node = Node(mounted, branch)
            node.holder = holder.pid
            node.target = target
            yield node


MIG_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s*(\d+)MiB / +(\d+)MiB\s*\|\s*(\d+)\s+(\S+)\s*\|"
                     r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")
BAR1_ROW = re.compile(r"^\|\s+\|\s*(\d+)MiB / +(\d+)MiB\s*\|\s+\|\s+\|$")


def mig_table(text: str) -> list[tuple[str, ...]]:
    """The MIG devices table's rows: gpu gi ci dev used total sm ecc ce enc dec ofa jpg, then the
    BAR1 used and total of the row under it."""
    lines = text.split("MIG devices:", 1)[1].split("Processes:", 1)[0].splitlines()
    rows = []
    for k, line in enumerate(lines):
        m = MIG_ROW.match(line)
        if m:
            b = BAR1_ROW.match(lines[k + 1])
            rows.append(m.groups() + (b.groups() if b else ("", "")))
    return rows


def process_rows(text: str) -> list[list[str]]:
    return [line.strip("| ").split() for line in text.split("Processes:", 1)[1].splitlines()
            if re.match(r"^\|\s+\d+\s+\d+\s+\d+\s+\d+\s+C\s", line)]


def test_default_table_lists_the_mig_devices_and_the_process_on_its_instance(mig):
    real, ours = ok(mig.real()), ok(mig.ours())
    assert "No MIG devices found" not in real
    # The GPUs' own rows: the memory of GPU 1 in MIG mode (its instances' use, and at 470 no
    # reserved share) is one fact, whichever NVML call each tool reads it with.
    gpu_memory = lambda t: re.findall(r"(\d+)MiB / +(\d+)MiB", t.split("MIG devices:", 1)[0])  # noqa: E731
    assert gpu_memory(real) == gpu_memory(ours)
    rows = mig_table(real)
    assert len(rows) == 3, real
    assert rows == mig_table(ours)
    # The holder's 1 GiB counts on the third device's GPU instance.
    third = rows[2]
    assert third[2] == "0" and int(third[4]) >= 1024, third
    procs = process_rows(real)
    # The name column's width (where a long argv[0] is cut) is the branch's layout: compared apart.
    assert [p[:5] + p[-1:] for p in procs] == [p[:5] + p[-1:] for p in process_rows(ours)]
    row = next(p for p in procs if p[3] == str(mig.holder))
    assert row[:3] == ["1", third[1], third[2]] and row[-1] == "1024MiB", procs


def q_blocks(text: str) -> list[dict[str, str]]:
    """-q's MIG Device blocks as {section path/label: value}."""
    blocks = []
    for chunk in text.split("    MIG Device\n")[1:]:
        block, path = {}, []
        for line in chunk.splitlines():
            indent = len(line) - len(line.lstrip())
            if indent <= 4:
                break
            depth = indent // 4 - 2
            label, _, value = line.strip().partition(":")
            path = path[:depth] + [label.strip()]
            if value:
                block["/".join(path)] = value.strip()
        blocks.append(block)
    return blocks


def test_query_mig_device_blocks_carry_our_values(mig):
    real = q_blocks(ok(mig.real("-q", "-i", "1")))
    assert len(real) == 3
    assert real == q_blocks(ok(mig.ours("-q", "-i", "1")))
    # The holder's 1 GiB on the third device, its SRAM count through NVML on its MIG handle.
    assert real[2]["FB Memory Usage/Used"] != "0 MiB", real[2]
    assert real[2]["ECC Errors/Volatile/SRAM Uncorrectable"] == "0", real[2]


def leaves(element: ET.Element, prefix: str = "") -> dict[str, str]:
    out = {}
    for child in element:
        path = f"{prefix}/{child.tag}"
        if len(child):
            out.update(leaves(child, path))
        else:
            out[path] = (child.text or "").strip()
    return out


def test_xml_mig_devices_and_processes_carry_our_values(mig):
    real = ET.fromstring(ok(mig.real("-q", "-x", "-i", "1"))).find("gpu")
    ours = ET.fromstring(ok(mig.ours("-q", "-x", "-i", "1"))).find("gpu")
    r_devs, o_devs = real.find("mig_devices").findall("mig_device"), ours.find("mig_devices").findall("mig_device")
    assert len(r_devs) == len(o_devs) == 3
    assert [leaves(r) for r in r_devs] == [leaves(o) for o in o_devs]
    r_procs = [leaves(p) for p in real.find("processes").findall("process_info")]
    o_procs = [leaves(p) for p in ours.find("processes").findall("process_info")]
    assert [p["/pid"] for p in r_procs] == [str(mig.holder)]
    keys = ("/gpu_instance_id", "/compute_instance_id", "/pid", "/type", "/used_memory")
    assert [{k: p[k] for k in keys} for p in r_procs] == [{k: p[k] for k in keys} for p in o_procs]


def test_list_shows_the_mig_devices(mig):
    real = ok(mig.real("-L"))
    assert real == ok(mig.ours("-L"))
    assert mig.target["uuid"] in real


# ---- byte for byte: every MIG step of the branch recorder, real vs ours ----------------------

sys.path.insert(0, str(REPO / "shims" / "nvidia-smi"))
from record_branches import MIG_STEPS  # noqa: E402

# Outputs that carry more than MIG: only their MIG parts are compared byte for byte. The rest of
# the default table and -q (the GPU's own rows in MIG mode: Module ID, encoder and decoder
# utilization, its SRAM counters, the bank-remap histogram, and on 470 the part number and GSP
# lines) is the GPU query's, compared by test_real_nvidia_smi.py.
PARTS = {
    "table.txt": lambda t: t[t.index("\n\n+") :],  # the empty line, the MIG devices and processes
    "query.txt": lambda t: "".join(re.findall(r"^    MIG Device\n(?:^ {8}.*\n)+", t, re.M)),
    "query.xml": lambda t: t[t.index("<mig_devices>") : t.index("</mig_devices>")],
}


def run_steps(binary: Path, node) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MOKKA_STATE"}
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver" / "usr" / "lib64")
    out = {}
    for name, args in MIG_STEPS:
        r = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=60)
        text = f"{r.stdout}{r.stderr}{r.returncode}\n"
        out[name] = PARTS[name](text) if name in PARTS else text
    return out


def steps_on_fresh_node(branch: int, binary: Path | None) -> dict[str, str]:
    """MIG_STEPS on a fresh one-GPU node (the same host name: the same UUIDs and bus ids); our
    own nvidia-smi when binary is None. The refusals asked for are logged as daemon warnings."""
    mounted = world_readable_node(BOARD[branch], 1, ("--driver-version", driver_version(branch)))
    node = next(mounted)
    try:
        return run_steps(binary or node.mnt / "driver" / "usr" / "bin" / "nvidia-smi", node)
    finally:
        problems = node.unexpected_log_lines()
        assert all("control_socket WARNING" in line for line in problems), problems
        try:
            mounted.close()
        except AssertionError:
            if not problems:
                raise


@pytest.mark.parametrize("branch", BRANCHES)
def test_every_mig_step_prints_what_the_branch_prints(branch):
    real = steps_on_fresh_node(branch, real_smi(branch))
    ours = steps_on_fresh_node(branch, None)
    assert "Successfully created GPU instance ID" in real["cgi.txt"] and "MIG Device" in real["query.txt"]
    for name, _args in MIG_STEPS:
        assert ours[name] == real[name], (branch, name, real[name], ours[name])
