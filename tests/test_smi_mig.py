"""nvidia-smi's MIG (docs/nvidia-smi.md, "MIG"; docs/mig.md): `-mig 0|1` and `nvidia-smi mig` on a
mounted H100 node, with the real tool's lines, tables and exit codes; the MIG devices in `-L`, the
default table, `-q`, `-q -x`, `--query-gpu` and `nvlink -s`; refusals (an over-full layout, a
placement conflict, a board without MIG, a user without permission) that change nothing; and the
GI/CI columns of a process that runs on a MIG device (a node published from the model)."""
from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import MountedNode, world_readable_node
from helpers_nvml import Published, consumer_env
from mokkafs.model.commands import parse_line
from mokkafs.model.events import SetProcesses
from helpers import mount_env

pytestmark = pytest.mark.level("shims")

GPU0, GPU1 = "00000000:18:00.0", "00000000:1E:00.0"  # an H100 node's first two bus ids
LAYOUT = "3g.40gb,2g.20gb,1g.10gb,1g.10gb"  # the layout
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
TERMINATING = "Terminating early due to previous errors.\n"

# `nvidia-smi mig -lgip` of an H100 80GB HBM3, as a public write-up pasted it (the same rows as
# stackhpc/ansible-slurm-appliance docs/mig.md, whose older driver prints the table 2 columns narrower).
REAL_LGIP = """\
+-------------------------------------------------------------------------------+
| GPU instance profiles:                                                        |
| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                                Free/Total   GiB              CE    JPEG  OFA  |
|===============================================================================|
|   0  MIG 1g.10gb         19     7/7        9.75       No     16     1     0   |
|                                                               1     1     0   |
+-------------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me      20     1/1        9.75       No     16     1     0   |
|                                                               1     1     1   |
+-------------------------------------------------------------------------------+
|   0  MIG 1g.20gb         15     4/4        19.62      No     26     1     0   |
|                                                               1     1     0   |
+-------------------------------------------------------------------------------+
|   0  MIG 2g.20gb         14     3/3        19.62      No     32     2     0   |
|                                                               2     2     0   |
+-------------------------------------------------------------------------------+
|   0  MIG 3g.40gb          9     2/2        39.50      No     60     3     0   |
|                                                               3     3     0   |
+-------------------------------------------------------------------------------+
|   0  MIG 4g.40gb          5     1/1        39.50      No     64     4     0   |
|                                                               4     4     0   |
+-------------------------------------------------------------------------------+
|   0  MIG 7g.80gb          0     1/1        79.25      No     132    7     0   |
|                                                               8     7     1   |
+-------------------------------------------------------------------------------+
"""
# `nvidia-smi mig -lgipp`, the MIG user guide's (an A100's ids and placements, which H100 shares).
REAL_LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""


def smi(node: MountedNode, *args: str, user: bool = False) -> subprocess.CompletedProcess:
    """Our nvidia-smi from the mount's driver root, as a consumer runs it (as nobody if `user`)."""
    return subprocess.run([*(NOBODY if user else []), str(node.mnt / "driver/usr/bin/nvidia-smi"), *args],
                          env=mount_env(node), capture_output=True, text=True, timeout=30, cwd="/")


def ok(node: MountedNode, *args: str) -> str:
    r = smi(node, *args)
    assert (r.returncode, r.stderr) == (0, ""), (args, r.stdout)
    return r.stdout


def layout(node: MountedNode, i: int = 0) -> list[tuple[int, str, str]]:
    """(gi id, profile, MIG UUID) of each compute instance, as gpuN/mig shows them."""
    out, gi, profile = [], None, None
    for line in node.read(f"gpu{i}/mig").splitlines():
        words = line.split()
        if words and words[0] == "gi":
            gi, profile = int(words[1]), words[3]
        elif words and words[0] == "ci":
            out.append((gi, profile, words[words.index("uuid") + 1]))
    return out


def test_enable_partition_show_and_destroy_as_the_real_tool_does(node_factory):
    node = node_factory(gpus=2)
    node.expect_warning(r"ctl\.sock: in_use from uid 0")
    assert ok(node, "-i", "0", "-mig", "1") == f"Enabled MIG Mode for GPU {GPU0}\nAll done.\n"
    assert ok(node, "mig", "-lgip", "-i", "0") == REAL_LGIP
    assert ok(node, "mig", "-lgipp", "-i", "0") == REAL_LGIPP

    # One at a time, each with its full-size compute instance; ids as the model places them.
    created = ok(node, "mig", "-cgi", LAYOUT, "-C", "-i", "0").splitlines()
    devices = layout(node)
    assert [d[:2] for d in devices] == [(2, "3g.40gb"), (3, "2g.20gb"), (9, "1g.10gb"), (10, "1g.10gb")]
    ids = {"3g.40gb": (9, 2), "2g.20gb": (14, 1), "1g.10gb": (19, 0)}
    made = [int(m) for m in re.findall(r"GPU instance ID +(\d+) on", "\n".join(created[::2]))]
    assert made == [2, 3, 9, 10]
    for k, (gi, name) in enumerate(zip(made, LAYOUT.split(","))):
        gp, cp = ids[name]
        assert created[2 * k] == f"Successfully created GPU instance ID {gi:2} on GPU  0 using profile MIG {name} (ID {gp:2})"
        assert created[2 * k + 1] == (f"Successfully created compute instance ID  0 on GPU  0 GPU instance ID {gi:2} "
                                      f"using profile MIG {name} (ID {cp:2})")

    # -L: each MIG device under its GPU, in MIG device order, with the model's UUIDs.
    listed = ok(node, "-L").splitlines()
    assert re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", listed[0])
    assert listed[1:5] == [f"  MIG {p:<12}Device {m:2}: (UUID: {u})" for m, (_, p, u) in enumerate(devices)]
    assert listed[5].startswith("GPU 1: ") and len(listed) == 6

    # The default table: "On" in the ECC cell, N/A utilization, and the MIG devices table (580's).
    table = ok(node).splitlines()
    assert all(len(line) == 91 for line in table[1:] if line)
    row = table.index(next(l for l in table if l.startswith("|   0  NVIDIA H100")))
    assert table[row].endswith(f"|   {GPU0} Off |                   On |")
    assert re.search(r"\|     N/A      Default \|$", table[row + 1]) and table[row + 2].endswith("|              Enabled |")
    assert re.search(r"\|      0%      Default \|$", table[row + 5])  # GPU 1 is not in MIG mode
    top = table.index("| MIG devices:                                                                            |")
    assert table[top - 1].startswith("+-----") and table[top - 2] == ""
    assert table[top + 2] == "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |"
    assert table[top + 5] == "|==================+==================================+===========+=======================|"
    assert table[top + 6:top + 9] == [
        "|  0    2   0   0  |              26MiB / 40448MiB    | 60      0 |  3   0    3    0    3 |",
        "|                  |               0MiB / 24740MiB    |           |                       |",
        "+------------------+----------------------------------+-----------+-----------------------+",
    ]
    rows = [l for l in table[top:] if re.match(r"\|  0 +\d+ +\d+ +\d+  \|", l)]
    assert [tuple(int(x) for x in r[1:17].split()) for r in rows] == [(0, 2, 0, 0), (0, 3, 0, 1), (0, 9, 0, 2),
                                                                      (0, 10, 0, 3)]
    assert "9984MiB    | 16      0 |  1   0    1    0    1 |" in rows[2]
    assert table[top + 17] == "+------------------+----------------------------------+-----------+-----------------------+"
    assert table[top + 18] == "" and table[top + 19].startswith("+-----") and "Processes:" in table[top + 20]

    # -q: the mode, one "MIG Device" block each (the labels of a real -q), utilization N/A.
    text = ok(node, "-q", "-i", "0")
    assert re.search(r"    MIG Mode\n        Current +: Enabled\n        Pending +: Enabled\n    MIG Device\n"
                     r"        Index +: 0\n        GPU Instance ID +: 2\n        Compute Instance ID +: 0\n"
                     r"        Device Attributes\n            Shared\n                Multiprocessor count +: 60\n", text)
    assert text.count("    MIG Device\n") == 4
    # (the node's 580 says "FB Memory Usage", as a real 580.173.02 H200 does; "Shared" from 590)
    assert "        FB Memory Usage\n            Total                                      : 40448 MiB\n" in text
    assert "        BAR1 Memory\n            Total                                      : 24740 MiB\n" in text
    assert text.count("        ECC Errors\n            Volatile\n                SRAM Uncorrectable  ") == 4
    assert "    Remapped Rows                                      : N/A\n" in text
    assert re.search(r"    Utilization\n        GPU +: N/A\n        Memory +: N/A\n", text)

    # -q -x: <mig_devices>, parsed.
    root = ET.fromstring(ok(node, "-q", "-x"))
    gpus = root.findall("gpu")
    assert [g.findtext("mig_mode/current_mig") for g in gpus] == ["Enabled", "Disabled"]
    migs = gpus[0].findall("mig_devices/mig_device")
    assert [(m.findtext("index"), m.findtext("gpu_instance_id"), m.findtext("compute_instance_id"),
             m.findtext("device_attributes/shared/multiprocessor_count"), m.findtext("fb_memory_usage/total"))
            for m in migs] == [("0", "2", "0", "60", "40448 MiB"), ("1", "3", "0", "32", "20096 MiB"),
                               ("2", "9", "0", "16", "9984 MiB"), ("3", "10", "0", "16", "9984 MiB")]
    assert gpus[1].findtext("mig_devices").strip() == "None"
    assert gpus[0].findtext("utilization/gpu_util") == "N/A"

    query = ok(node, "--query-gpu=index,mig.mode.current,mig.mode.pending,utilization.gpu", "--format=csv,noheader")
    assert query == "0, Enabled, Enabled, [N/A]\n1, Disabled, Disabled, 0 %\n"

    # The listings: by profile, then id, as the real tool orders them.
    assert ok(node, "mig", "-lgi") == (
        "+---------------------------------------------------------+\n"
        "| GPU instances:                                          |\n"
        "| GPU   Name               Profile  Instance   Placement  |\n"
        "|                            ID       ID       Start:Size |\n"
        "|=========================================================|\n"
        "|   0  MIG 1g.10gb           19        9          2:1     |\n"
        "+---------------------------------------------------------+\n"
        "|   0  MIG 1g.10gb           19       10          3:1     |\n"
        "+---------------------------------------------------------+\n"
        "|   0  MIG 2g.20gb           14        3          0:2     |\n"
        "+---------------------------------------------------------+\n"
        "|   0  MIG 3g.40gb            9        2          4:4     |\n"
        "+---------------------------------------------------------+\n")
    lci = ok(node, "mig", "-lci", "-i", "0").splitlines()
    assert lci[:6] == ["+--------------------------------------------------------------------+",
                       "| Compute instances:                                                 |",
                       "| GPU     GPU       Name             Profile   Instance   Placement  |",
                       "|       Instance                       ID        ID       Start:Size |",
                       "|         ID                                                         |",
                       "|====================================================================|"]
    assert lci[6::2] == ["|   0      9       MIG 1g.10gb          0         0          0:1     |",
                         "|   0     10       MIG 1g.10gb          0         0          0:1     |",
                         "|   0      3       MIG 2g.20gb          1         0          0:2     |",
                         "|   0      2       MIG 3g.40gb          2         0          0:4     |"]
    lcip = ok(node, "mig", "-lcip", "-gi", "2", "-i", "0").splitlines()
    assert lcip[6:8] == ["|   0      2       MIG 1c.3g.40gb       0      0/3           16        3     0     0   |",
                         "|                                                                      3     3         |"]
    assert lcip[12] == "|   0      2       MIG 3g.40gb          2*     0/1           60        3     0     0   |"

    # NVLink queries are refused in MIG mode (a real H100 at 590); the other GPU keeps its links.
    assert ok(node, "nvlink", "-s", "-i", "0").splitlines()[1:] == ["Nvlink queries are not supported for Devices in MIG mode"]
    assert ok(node, "nvlink", "-s", "-i", "1").splitlines()[1] == "\t Link 0: 26.562 GB/s"

    # Turning MIG off under instances is refused; destroying goes compute instances first.
    r = smi(node, "-i", "0", "-mig", "0")
    assert (r.returncode, r.stdout) == (19, f"Unable to disable MIG Mode for GPU {GPU0}: In use by another client\n"
                                            + TERMINATING)
    r = smi(node, "mig", "-dgi", "-i", "0")
    assert (r.returncode, r.stdout) == (19, "Unable to destroy GPU instance ID  9 from GPU  0: In use by another client\n"
                                            "Failed to destroy GPU instances: In use by another client\n")
    assert len(layout(node)) == 4
    assert ok(node, "mig", "-dci", "-gi", "3", "-ci", "0", "-i", "0") == \
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  3\n"
    assert ok(node, "mig", "-dci", "-i", "0") == "".join(
        f"Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID {g:2}\n" for g in (9, 10, 2))
    assert ok(node, "mig", "-dgi", "-i", "0") == "".join(
        f"Successfully destroyed GPU instance ID {g:2} from GPU  0\n" for g in (9, 10, 3, 2))
    r = smi(node, "mig", "-lgi")
    assert (r.returncode, r.stdout) == (6, "No GPU instances found: Not Found\n")
    r = smi(node, "mig", "-lci")
    assert (r.returncode, r.stdout) == (6, "No compute instances found: Not Found\n")
    assert "|  No MIG devices found                                                                   |" in ok(node)
    assert ok(node, "-i", "0", "-mig", "0") == f"Disabled MIG Mode for GPU {GPU0}\nAll done.\n"
    r = smi(node, "mig", "-lgi")
    assert (r.returncode, r.stdout) == (6, "No MIG-enabled devices found.\n")
    assert "MIG devices:" not in ok(node) and node.read("gpu0/mig").startswith("mode: disabled\npending: disabled\n")


def test_what_does_not_fit_is_refused_with_the_driver_s_error_after_the_ones_that_did(node_factory):
    node = node_factory(gpus=1)
    node.expect_warning(r"ctl\.sock: (insufficient_resources|invalid_argument) from uid 0")
    ok(node, "-mig", "1")
    # Over-full: seven 1g.10gb at most; the tool creates one at a time and stops at the first refusal.
    r = smi(node, "mig", "-cgi", ",".join(["19"] * 8))
    lines = r.stdout.splitlines()
    assert r.returncode == 23 and len(lines) == 9
    assert all(re.fullmatch(r"Successfully created GPU instance ID +\d+ on GPU  0 using profile MIG 1g\.10gb \(ID 19\)", l)
               for l in lines[:7])
    assert lines[7:] == ["Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources",
                         "Failed to create GPU instances: Insufficient Resources"]
    assert len(node.read("gpu0/mig").split("\ngi ")) == 8  # the seven stay
    ok(node, "mig", "-dgi")
    # A placement conflict: a compute slice is left after two 3g.40gb, but no memory slice.
    r = smi(node, "mig", "-cgi", "3g.40gb,3g.40gb,1g.10gb", "-C")
    assert r.returncode == 23 and r.stdout.count("Successfully created GPU instance") == 2
    assert r.stdout.endswith("Unable to create a GPU instance on GPU  0 using profile 1g.10gb: Insufficient Resources\n"
                             "Failed to create GPU instances: Insufficient Resources\n")
    before = node.read("gpu0/mig")
    assert before.count("\ngi ") == 2
    # No such profile: the profile as given, Invalid Argument; a compute instance that does not fit.
    r = smi(node, "mig", "-cgi", "MIG 5g.50gb")
    assert (r.returncode, r.stdout) == (2, "Unable to create a GPU instance on GPU  0 using profile MIG 5g.50gb: "
                                           "Invalid Argument\nFailed to create GPU instances: Invalid Argument\n")
    r = smi(node, "mig", "-cci", "1c.3g.40gb", "-gi", "1")
    assert (r.returncode, r.stdout) == (23, "Unable to create a compute instance on GPU  0 GPU instance ID  1 using "
                                            "profile 1c.3g.40gb: Insufficient Resources\n"
                                            "Failed to create compute instances: Insufficient Resources\n")
    assert node.read("gpu0/mig") == before
    # Malformed: the real tool's usage error.
    for args in (("mig",), ("mig", "-lgi", "-lci"), ("mig", "-cgi"), ("mig", "-lgi", "-C"), ("mig", "-gi", "x", "-lgi"),
                 ("-mig", "2"), ("-mig", "1", "-pm", "1")):
        r = smi(node, *args)
        assert (r.returncode, r.stdout) == (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' "
                                               "for help.\n"), args


def test_a_busy_gpu_s_mode_waits_for_a_reset_with_the_driver_s_warning(node_factory):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    from test_compute_modes import Cuda

    node = node_factory(gpus=2)
    holder = Cuda(mount_env(node))
    try:
        assert holder("create", 1)[0] == 0
        r = smi(node, "-i", "1", "-mig", "1")
        assert (r.returncode, r.stdout) == (0, (
            f"Warning: MIG mode is in pending enable state for GPU {GPU1}:In use by another client\n"
            f"{GPU1} is currently being used by one or more other processes (e.g. CUDA application or a monitoring "
            "application such as another instance of nvidia-smi). Please first kill all processes using the device "
            "and retry the command or reboot the system to make MIG mode effective.\nAll done.\n"))
        assert ok(node, "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader", "-i", "1") == \
            "Disabled, Enabled\n"
        r = smi(node, "mig", "-lgi", "-i", "1")
        assert (r.returncode, r.stdout) == (6, "No MIG-enabled devices found.\n")
    finally:
        holder.stop()


def test_a_board_without_mig_refuses_and_moves_on(node_factory):
    node = node_factory("l40s", gpus=1)
    bus = ok(node, "--query-gpu=pci.bus_id", "--format=csv,noheader").strip()
    assert ok(node, "-mig", "1") == (f"Unable to enable MIG Mode for GPU {bus}: Not Supported\n"
                                     "Treating as warning and moving on.\nAll done.\n")
    for args in (("mig", "-lgip"), ("mig", "-cgi", "1g.10gb", "-C"), ("mig", "-lgi")):
        r = smi(node, *args)
        assert (r.returncode, r.stdout) == (6, "No MIG-supported devices found.\n"), args
    assert ok(node, "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader") == "[N/A], [N/A]\n"
    text = ok(node, "-q")
    assert re.search(r"    MIG Mode\n        Current +: N/A\n        Pending +: N/A\n", text) and "MIG Device" not in text
    assert "MIG devices:" not in ok(node) and node.read("gpu0/mig") == "mode: not supported\n"


@pytest.fixture
def open_node():
    """A mounted 2 x H100 node under a directory every user may enter (pytest's tmp_path is 0700)."""
    yield from world_readable_node("h100", 2)


def test_nobody_gets_the_permission_error_and_nothing_changes(open_node):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    node = open_node
    node.expect_warning(r"ctl\.sock: no_permission from uid 65534")
    ok(node, "-i", "0", "-mig", "1")
    ok(node, "mig", "-cgi", "3g.40gb", "-C", "-i", "0")
    before = [node.read("gpu0/mig"), node.read("gpu1/mig")]
    cases = [
        (("-i", "1", "-mig", "1"), 4, f"Unable to enable MIG Mode for GPU {GPU1}: Insufficient Permissions\n"
                                      + TERMINATING),
        (("mig", "-cgi", "1g.10gb", "-i", "0"), 4, "Unable to create a GPU instance on GPU  0 using profile 1g.10gb: "
                                                   "Insufficient Permissions\n"
                                                   "Failed to create GPU instances: Insufficient Permissions\n"),
        (("mig", "-dci", "-i", "0"), 4, "Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID  2: "
                                        "Insufficient Permissions\n"
                                        "Failed to destroy compute instances: Insufficient Permissions\n"),
    ]
    for args, code, message in cases:
        r = smi(node, *args, user=True)
        assert (r.returncode, r.stdout) == (code, message), args
    assert [node.read("gpu0/mig"), node.read("gpu1/mig")] == before
    # Reading is for everyone, as /proc/driver/nvidia/capabilities/mig/monitor is.
    r = smi(node, "mig", "-lgi", user=True)
    assert r.returncode == 0 and "|   0  MIG 3g.40gb            9        2          4:4     |" in r.stdout


def test_a_process_on_a_mig_device_shows_its_gpu_and_compute_instance(tmp_path, smi_path):
    """The processes table's GI and CI columns, from CUDA's accounting as the model published it."""
    import os

    node = Published(tmp_path, "h100", 1)
    for line in ("gpu=0 mig enable", f"gpu=0 mig create {LAYOUT}"):
        node.apply(parse_line(line).event)
    me = os.getpid()
    node.apply(SetProcesses(0, ((me, 1 << 30),), instances=((me, 9, 0),)))
    r = subprocess.run([str(smi_path)], env=consumer_env(node.path), capture_output=True, text=True, timeout=10)
    # Without a daemon to answer (a state file alone), a change is the unexpected error, exit 255.
    no_daemon = subprocess.run([str(smi_path), "-mig", "0"], env=consumer_env(node.path), capture_output=True,
                               text=True, timeout=10)
    node.close()
    assert (no_daemon.returncode, no_daemon.stdout) == (255, f"Unable to disable MIG Mode for GPU {GPU0}: Unknown "
                                                             "Error\n" + TERMINATING)
    rows = [l for l in r.stdout.splitlines() if re.match(rf"\|    0 +\d+ +\d+ +{me} ", l)]
    assert len(rows) == 1 and re.fullmatch(rf"\|    0    9    0 {me:16}      C   .{{36}}   1024MiB \|", rows[0])
    assert "|  0    9   0   2  |            1033MiB /  9984MiB    | 16      0 |" in r.stdout  # 1 GiB and 9 MiB idle


@pytest.fixture(scope="module")
def smi_path(tmp_path_factory):
    from helpers_nvml import nvml_path
    from helpers_smi import smi_binary

    nvml_path()
    return smi_binary(tmp_path_factory)


def test_nothing_is_read_from_a_record_a_stuck_writer_left_torn(tmp_path, smi_path):
    """As libnvml does: a daemon killed between the two seq increments leaves seq odd and a record
    half-written (here GPU 0's MIG device count). nvidia-smi's own reads of the state (MIG
    devices, a lost GPU's bus id) wait the one bounded time and then take nothing from it, never
    a torn value; NVML answers UNKNOWN meanwhile. A finished write brings both back."""
    node = Published(tmp_path, "h100", 2)
    for line in ("gpu=0 mig enable", f"gpu=0 mig create {LAYOUT}"):
        node.apply(parse_line(line).event)

    def listing() -> str:
        r = subprocess.run([str(smi_path), "-L"], env=consumer_env(node.path), capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == 0, r.stderr
        return r.stdout

    try:
        assert listing().count("  MIG ") == 4
        st = node.publisher._st
        st.seq += 1  # as if the writer died mid-publish
        st.gpus[0].mig_device_count = 1  # half of what it was writing
        torn = listing()
        st.seq += 1  # the writer finished
        finished = listing()
    finally:
        node.close()
    assert "  MIG " not in torn, torn
    assert finished.count("  MIG ") == 1 and "MIG 3g.40gb     Device  0:" in finished, finished
