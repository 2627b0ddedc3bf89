"""nvidia-smi's configuration commands (-pm, -c, -pl, -lgc, -rgc; docs/nvidia-smi.md) on a mounted
node (level 4): each prints the real tool's lines and exit code, and what it sets is what a second
process (pynvml) and `--query-gpu` report; a refused command, as root or as nobody, changes nothing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import MountedNode
from helpers_smi import TEXT_H100, capture_section
from helpers import mount_env, run_py_json, wait_until
from test_setters import NVML_NOT_SUPPORTED, DEFAULT_CONFIG, open_node, script  # noqa: F401 (open_node: fixture)

pytestmark = pytest.mark.level("shims")

GPU0, GPU1 = "00000000:18:00.0", "00000000:1E:00.0"  # an H100 node's first two bus ids
TERMINATING = "Terminating early due to previous errors.\n"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# What a second process reads of both GPUs: persistence, compute mode, power limit (mW), SM clock (MHz).
READ_BACK = script("""
    def row(i):
        h = n.nvmlDeviceGetHandleByIndex(i)
        return config(i)[:3] + [n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)]
    print(json.dumps([row(0), row(1)]))
""")
QUERY = "--query-gpu=persistence_mode,compute_mode,power.limit,clocks.sm"


def smi(node: MountedNode, *args: str, user: bool = False) -> subprocess.CompletedProcess:
    """Our nvidia-smi from the mount's driver root, as a consumer runs it (as nobody if `user`)."""
    return subprocess.run([*(NOBODY if user else []), str(node.mnt / "driver/usr/bin/nvidia-smi"), *args],
                          env=mount_env(node), capture_output=True, text=True, timeout=30, cwd="/")


def query(node: MountedNode) -> list[str]:
    return smi(node, QUERY, "--format=csv,noheader").stdout.splitlines()


def test_each_command_prints_the_real_lines_and_every_process_sees_what_it_set(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    idle = [[1, 0, 700000, 345]] * 2
    assert run_py_json(env, READ_BACK) == idle
    steps = [
        (("-pm", "0", "-i", "1"), f"Disabled persistence mode for GPU {GPU1}.\n",
         [[1, 0, 700000, 345], [0, 0, 700000, 345]], ["Enabled, Default, 700.00 W, 345 MHz",
                                                      "Disabled, Default, 700.00 W, 345 MHz"]),
        # Without -i: every GPU, each with its own line; one already so says so and is not written.
        (("--persistence-mode=ENABLED",), f"Persistence mode is already Enabled for GPU {GPU0}.\n"
                                          f"Enabled persistence mode for GPU {GPU1}.\n", idle, None),
        (("-c", "EXCLUSIVE_PROCESS", "-i", "0"), f"Set compute mode to EXCLUSIVE_PROCESS for GPU {GPU0}.\n",
         [[1, 3, 700000, 345], [1, 0, 700000, 345]], ["Enabled, Exclusive_Process, 700.00 W, 345 MHz",
                                                      "Enabled, Default, 700.00 W, 345 MHz"]),
        (("--compute-mode=0", "--id=" + GPU0), f"Set compute mode to DEFAULT for GPU {GPU0}.\n", idle, None),
        (("-pl", "500", "-i", "1"), f"Power limit for GPU {GPU1} was set to 500.00 W from 700.00 W.\n",
         [[1, 0, 700000, 345], [1, 0, 500000, 345]], ["Enabled, Default, 700.00 W, 345 MHz",
                                                      "Enabled, Default, 500.00 W, 345 MHz"]),
        (("--power-limit=450.5",), f"Power limit for GPU {GPU0} was set to 450.50 W from 700.00 W.\n"
                                   f"Power limit for GPU {GPU1} was set to 450.50 W from 500.00 W.\n",
         [[1, 0, 450500, 345]] * 2, ["Enabled, Default, 450.50 W, 345 MHz"] * 2),
        # An idle GPU runs at its idle clock; a lock holds it at the lock's floor.
        (("-lgc", "1200,1500", "-i", "1"), f'GPU clocks set to "(gpuClkMin 1200, gpuClkMax 1500)" for GPU {GPU1}\n',
         [[1, 0, 450500, 345], [1, 0, 450500, 1200]], ["Enabled, Default, 450.50 W, 345 MHz",
                                                       "Enabled, Default, 450.50 W, 1200 MHz"]),
        (("--reset-gpu-clocks",), "", [[1, 0, 450500, 345]] * 2, None),
    ]
    for args, lines, pynvml_sees, smi_sees in steps:
        r = smi(node, *args)
        assert (r.returncode, r.stdout, r.stderr) == (0, lines + "All done.\n", ""), args
        assert run_py_json(env, READ_BACK) == pynvml_sees, args
        if smi_sees:
            assert query(node) == smi_sees, args
    assert node.read("gpu1/config") == DEFAULT_CONFIG.replace("power_limit: 700", "power_limit: 450.5 (default 700)")
    assert "mokka: gpu1 locked_clocks 1200 1500\n" in node.read("gpu1/events")


def test_a_value_the_board_refuses_is_the_real_message_a_non_zero_exit_and_no_change(node_factory):
    node = node_factory(gpus=2)
    node.expect_warning(r"ctl\.sock: (invalid_argument|not_supported) from uid 0")
    before = query(node)
    cases = [
        # The tool checks the range itself and names the board's limits.
        (("-pl", "100", "-i", "1"), f"Provided power limit 100.00 W is not a valid power limit which should be "
                                    f"between 200.00 W and 700.00 W for GPU {GPU1}\n", 2),
        (("-pl", "700.001"), f"Provided power limit 700.00 W is not a valid power limit which should be between "
                             f"200.00 W and 700.00 W for GPU {GPU0}\n", 2),
        (("-lgc", "100,1500", "-i", "1"), f"Failed to lock GPU clocks for GPU {GPU1}: Invalid Argument\n", 2),
        (("-lgc", "1500,1400"), f"Failed to lock GPU clocks for GPU {GPU0}: Invalid Argument\n", 2),
        (("-c", "1", "-i", "0"), f"Unable to set compute mode for GPU {GPU0}: Not Supported\n", 3),
    ]
    for args, message, code in cases:
        r = smi(node, *args)
        assert (r.returncode, r.stdout) == (code, message + TERMINATING), args
    assert query(node) == before
    assert node.read("gpu0/config") == node.read("gpu1/config") == DEFAULT_CONFIG


def test_nobody_gets_the_permission_messages_exit_4_and_nothing_changes(open_node):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    node = open_node
    node.expect_warning(r"ctl\.sock: no_permission from uid 65534")
    before = (query(node), run_py_json(mount_env(node), READ_BACK), node.read("gpu1/config"))
    cases = [
        (("-pm", "0", "-i", "1"), f"Unable to set persistence mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-c", "3", "-i", "1"), f"Unable to set compute mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-pl", "500", "-i", "1"), f"Failed to set power management limit for GPU {GPU1}: Insufficient Permissions\n"),
        (("-lgc", "1500", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-rgc",), f"The current user does not have permission to change clocks for GPU {GPU0}.\n"),
        (("-ac", "2619,1500", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-rac", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-lmc", "2619", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-rmc", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-e", "0", "-i", "1"), f"Unable to set the ECC mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-p", "0", "-i", "1"), f"Unable to reset ECC error count for GPU {GPU1}: Insufficient Permissions\n"),
        (("-am", "1", "-i", "1"), f"Unable to set accounting mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-caa", "-i", "1"), f"Unable to clear accounted PIDs for GPU {GPU1}: Insufficient Permissions\n"),
        (("-r", "-i", "1"), f"Unable to reset GPU {GPU1}: Insufficient Permissions\n"),
    ]
    for args, message in cases:
        r = smi(node, *args, user=True)
        assert (r.returncode, r.stdout) == (4, message + TERMINATING), args
    # Asking for what the GPU already has writes nothing, so it needs no permission (as the real tool).
    r = smi(node, "-pm", "1", "-i", "1", user=True)
    assert (r.returncode, r.stdout) == (0, f"Persistence mode is already Enabled for GPU {GPU1}.\nAll done.\n")
    # A value out of range is found before any write: the range message, for nobody too.
    r = smi(node, "-pl", "100", "-i", "1", user=True)
    assert r.returncode == 2 and r.stdout.startswith("Provided power limit 100.00 W is not a valid power limit")
    assert (query(node), run_py_json(mount_env(node), READ_BACK), node.read("gpu1/config")) == before


def test_a_malformed_configuration_command_is_the_invalid_combination_message(node_factory):
    node = node_factory(gpus=1)
    for args in [("-pm", "2"), ("-pm",), ("-c", "TURBO"), ("-c", "4"), ("-pl", "abc"), ("-pl", "-5"), ("-pl", ""),
                 ("-lgc", "1500,"), ("-lgc", "a,b"), ("-pm", "1", "-pl", "300"), ("-pm", "1", "-q"),
                 ("-pl", "300", "--query-gpu=index"), ("-rgc", "-lgc", "1500"), ("dmon", "-pm", "1")]:
        r = smi(node, *args)
        assert (r.returncode, r.stdout) == (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' "
                                               "for help.\n"), args
    assert node.read("gpu0/config") == DEFAULT_CONFIG


def test_the_help_text_lists_the_configuration_commands(node_factory):
    node = node_factory(gpus=1)
    r = smi(node, "-h")
    assert r.stdout.splitlines()[1:] == capture_section(TEXT_H100, "capabilities :: help (-h)")[1:]
    for option in ("-pm,  --persistence-mode=", "-c,   --compute-mode=", "-pl   --power-limit=",
                   "-lgc  --lock-gpu-clocks=", "-rgc  --reset-gpu-clocks"):
        assert option in r.stdout, option


ECC_READ = script("""
    h = n.nvmlDeviceGetHandleByIndex(1)
    try:
        errors = n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
    except n.NVMLError as e:
        errors = e.value
    print(json.dumps([n.nvmlDeviceGetEccMode(h), errors]))
""")


HOLD_GPU1 = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 1) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30)) == 0
print("ready", flush=True)
sys.stdin.read()
"""

# NVML's reset, as NVIDIA's nvidia-smi -r calls it: export-table entry 168 on GPUs 1 and 0.
NVML_RESET = """
import ctypes as C, json
nvml = C.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
p = C.c_void_p()
assert nvml.nvmlInternalGetExportTable(C.byref(p), bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")) == 0
words = (C.c_void_p * (C.c_uint64.from_address(p.value).value // 8)).from_address(p.value)
reset = C.CFUNCTYPE(C.c_int, C.c_uint, C.POINTER(C.c_void_p), C.POINTER(C.c_int))(words[168])
h1, h0 = C.c_void_p(), C.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(1, C.byref(h1)) == 0 and nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h0)) == 0
results = (C.c_int * 2)(-1, -1)
first = reset(2, (C.c_void_p * 2)(h1.value, h0.value), results)
print(json.dumps([first, list(results)]))
"""


# What the driver's refusal prints (real runs of nvidia-smi -r; NVIDIA's 470-550 binaries on our NVML).
IN_USE_TEXT = (
    "The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n1 device is currently being "
    "used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X "
    "server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes "
    "using this device and all compute applications running in the system.\n"
)


def test_a_gpu_in_use_is_refused_by_nvidia_smi_r_and_nvml_but_not_by_the_reset_file(node_factory):
    """One check, the node's (`reset idle`): our nvidia-smi -r and NVML's reset (what NVIDIA's
    nvidia-smi -r calls) both get IN_USE for a GPU with a CUDA process on it and print or return
    the driver's answer, and a set of GPUs with one busy is not reset at all; the fault-
    injection reset file still resets it."""
    node = node_factory(gpus=2, mount=False)
    node.mount(("--driver-version", "550.163.01"))  # the export table's branches: 470 to 550
    node.expect_warning(r"ctl\.sock: in_use from uid 0 pid \d+: 'node reset idle [0-9,]+'")
    node.expect_warning(r"ctl\.sock: in_use from uid 0: and \d+ more like it")
    env = mount_env(node)
    events = node.state_dir / "events.log"

    def resets(i: int) -> int:
        return events.read_text().count(f"mokka: gpu{i} reset")

    holder = subprocess.Popen([sys.executable, "-c", HOLD_GPU1], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while str(holder.pid) not in smi(node, "--query-compute-apps=pid", "--format=csv,noheader").stdout:
            assert time.monotonic() < deadline, "the CUDA process never showed"
            time.sleep(0.05)
        r = smi(node, "-r", "-i", "0,1")
        assert (r.returncode, r.stdout) == (255, IN_USE_TEXT.format(bus=GPU1))
        assert (resets(1), resets(0)) == (0, 0)  # GPU 0 is idle, and not reset either
        # UNKNOWN, IN_USE for GPU 1, SUCCESS for GPU 0: what NVIDIA's nvidia-smi prints as above
        assert run_py_json(env, NVML_RESET) == [999, [19, 0]]
        assert (resets(1), resets(0)) == (0, 0)
        assert node.write("gpu1/reset", b"1\n") == 0  # the fault-clearing reset: whatever runs
        assert resets(1) == 1
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    deadline = time.monotonic() + 10
    while (r := smi(node, "-r", "-i", "1")).returncode == 255 and time.monotonic() < deadline:
        time.sleep(0.1)  # until the daemon has seen the process go
    assert (r.returncode, r.stdout) == (0, f"GPU {GPU1} was successfully reset.\nAll done.\n")
    assert resets(1) == 2


def test_two_busy_gpus_of_three_are_named_and_none_of_the_three_is_reset(node_factory):
    """The plural of the driver's refusal, as NVIDIA's binaries print it ("2 devices are ...
    these devices"), each busy GPU on its own line in index order, the idle one neither listed nor reset."""
    node = node_factory(gpus=3)
    node.expect_warning(r"ctl\.sock: in_use from uid 0 pid \d+: 'node reset idle 0,1,2'")
    env = mount_env(node)
    holders = [subprocess.Popen([sys.executable, "-c", HOLD_GPU1.replace("0, 1)", f"0, {g})")], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for g in (0, 2)]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["ready", "ready"]
        deadline = time.monotonic() + 10
        while len(smi(node, "--query-compute-apps=pid", "--format=csv,noheader").stdout.split()) < 2:
            assert time.monotonic() < deadline, "the CUDA processes never showed"
            time.sleep(0.05)
        r = smi(node, "-r")
        buses = smi(node, "--query-gpu=pci.bus_id", "--format=csv,noheader").stdout.split()
        assert (r.returncode, r.stdout) == (255, (
            f"The following GPUs could not be reset:\n  GPU {buses[0]}: In use by another client\n"
            f"  GPU {buses[2]}: In use by another client\n\n2 devices are currently being used by one or more other "
            "processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, or a "
            "monitoring application such as another instance of nvidia-smi). Please first kill all processes using "
            "these devices and all compute applications running in the system.\n"))
        assert "reset" not in (node.state_dir / "events.log").read_text()
    finally:
        for h in holders:
            h.stdin.close()
            h.wait(timeout=30)
            h.stdout.close()


def test_ecc_mode_is_pending_until_nvidia_smi_r_resets_the_gpu(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    assert node.write("gpu1/inject_ecc", b"sbe 4\n") == 0
    r = smi(node, "-e", "0", "-i", "1")
    assert (r.returncode, r.stdout) == (0, f"Disabled ECC support for GPU {GPU1}.\nAll done.\nReboot required.\n")
    assert run_py_json(env, ECC_READ) == [[1, 0], 4]  # pending: ECC still on, its counters still there
    mode = "--query-gpu=ecc.mode.current,ecc.mode.pending"
    assert smi(node, mode, "--format=csv,noheader").stdout.splitlines() == ["Enabled, Enabled", "Enabled, Disabled"]
    assert "ecc_mode: 0 (default 1) (current 1 until a reset)\n" in node.read("gpu1/config")
    q = smi(node, "-q", "-i", "1", "-d", "ECC").stdout
    assert re.search(r"^    ECC Mode\n        Current +: Enabled\n        Pending +: Disabled$", q, re.M), q
    r = smi(node, "-r", "-i", "1")
    assert (r.returncode, r.stdout) == (0, f"GPU {GPU1} was successfully reset.\nAll done.\n")
    assert run_py_json(env, ECC_READ) == [[0, 0], NVML_NOT_SUPPORTED]  # off: no counters
    assert smi(node, mode, "--format=csv,noheader").stdout.splitlines() == ["Enabled, Enabled", "Disabled, Disabled"]
    assert "<current_ecc>Disabled</current_ecc>" in smi(node, "-q", "-x", "-i", "1").stdout
    # Clearing counts needs ECC on: refused on gpu1 now; on gpu0 it zeroes the chosen scope.
    node.expect_warning(r"ctl\.sock: not_supported from uid 0 pid \d+: 'gpu=1 clear_ecc volatile'")
    r = smi(node, "-p", "0", "-i", "1")
    assert (r.returncode, r.stdout) == (3, f"Unable to reset ECC error count for GPU {GPU1}: Not Supported\n"
                                           + TERMINATING)
    assert node.write("gpu0/inject_ecc", b"dbe 2\n") == 0
    r = smi(node, "-p", "1", "-i", "0")
    assert (r.returncode, r.stdout) == (0, f"Reset aggregate ECC errors to zero for GPU {GPU0}.\nAll done.\n")
    totals = "--query-gpu=ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total"
    assert smi(node, "-i", "0", totals, "--format=csv,noheader").stdout == "2, 0\n"
    r = smi(node, "--reset-ecc-errors=0", "-i", "0")
    assert (r.returncode, r.stdout) == (0, f"Reset volatile ECC errors to zero for GPU {GPU0}.\nAll done.\n")
    assert smi(node, "-i", "0", totals, "--format=csv,noheader").stdout == "0, 0\n"
    # ECC mode lives on the board: a node reset (a driver reload) keeps it.
    assert node.write("node/reset", b"1\n") == 0
    assert run_py_json(env, ECC_READ)[0] == [0, 0]


def test_applications_and_memory_clocks_through_nvidia_smi(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    node.expect_warning(r"ctl\.sock: invalid_argument from uid 0")
    assert node.write("gpu1/utilization", b"90 40\n") == 0
    r = smi(node, "-ac", "2619,1500", "-i", "1")
    assert (r.returncode, r.stdout) == (0, f'Applications clocks set to "(MEM 2619, SM 1500)" for GPU {GPU1}\nAll done.\n')
    read = script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        print(json.dumps([n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_GRAPHICS),
                          n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_MEM),
                          n.nvmlDeviceGetDefaultApplicationsClock(h, n.NVML_CLOCK_GRAPHICS),
                          n.nvmlDeviceGetClock(h, n.NVML_CLOCK_SM, n.NVML_CLOCK_ID_APP_CLOCK_TARGET),
                          n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                          n.nvmlDeviceGetCurrentClocksEventReasons(h) & 0x2]))
    """)
    assert run_py_json(mount_env(node), read) == [1500, 2619, 1980, 1500, 1500, 2]
    # Only the pairs -q -d SUPPORTED_CLOCKS lists: not a memory clock the board lacks, not a
    # graphics clock between the list's 15 MHz steps; the board's second memory clock is one.
    for mem, sm in ((1000, 1500), (2619, 1501)):
        r = smi(node, "-ac", f"{mem},{sm}", "-i", "1")
        assert (r.returncode, r.stdout) == (2, f'Specified clock combination "(MEM {mem}, SM {sm})" is not supported '
                                               f"for GPU {GPU1}. Run 'nvidia-smi -q -d SUPPORTED_CLOCKS' to see list "
                                               f"of supported clock combinations\n" + TERMINATING)
    assert "1593 MHz" in smi(node, "-q", "-d", "SUPPORTED_CLOCKS", "-i", "1").stdout
    r = smi(node, "-ac", "1593,1980", "-i", "1")
    assert (r.returncode, r.stdout) == (0, f'Applications clocks set to "(MEM 1593, SM 1980)" for GPU {GPU1}\nAll done.\n')
    r = smi(node, "-rac", "-i", "1")
    assert (r.returncode, r.stdout) == (0, "All done.\n")
    assert run_py_json(mount_env(node), read) == [1980, 2619, 1980, 1980, 1980, 0]
    r = smi(node, "-lmc", "2619", "-i", "1")
    assert (r.returncode, r.stdout) == (0, f'Memory clocks set to "(memClkMin 2619, memClkMax 2619)" for GPU '
                                           f"{GPU1}\nAll done.\n")
    assert "locked_memory_clocks: 2619 2619 (default 1593 2619)\n" in node.read("gpu1/config")
    r = smi(node, "-lmc", "1000,2619", "-i", "1")
    assert (r.returncode, r.stdout) == (2, f"Failed to lock memory clocks for GPU {GPU1}: Invalid Argument\n"
                                        + TERMINATING)
    assert smi(node, "-rmc").stdout == "All done.\n"


def test_boards_without_auto_boost_or_operation_modes_warn_and_go_on(node_factory):
    node = node_factory(gpus=1)
    r = smi(node, "--auto-boost-default=0")
    assert (r.returncode, r.stdout) == (0, f"Enabling/disabling default auto boosted clocks is not supported for GPU: "
                                           f"{GPU0}.\nTreating as warning and moving on.\nAll done.\n")
    r = smi(node, "--gom=COMPUTE")
    assert (r.returncode, r.stdout) == (0, f"Setting GPU operation mode is not supported for GPU {GPU0}.\nTreating as "
                                           "warning and moving on.\nAll done.\n")
    for args in [("--auto-boost-default=2",), ("--gom=3",), ("-e", "on"), ("-p", "2"), ("-am",), ("-ac", "2619"),
                 ("-ac", "tdp,tdp"), ("-caa=1",), ("-r", "-q")]:
        r = smi(node, *args)
        assert (r.returncode, r.stdout) == (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' "
                                               "for help.\n"), args
    assert node.read("gpu0/config") == DEFAULT_CONFIG


def test_accounting_reports_a_finished_cuda_process_pid_time_and_max_memory(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    from test_compute_modes import Cuda

    node = node_factory(gpus=2)
    env = mount_env(node)
    before = Cuda(mount_env(node))  # running before accounting is switched on: never accounted
    try:
        assert before("create", 0) == [0, "CUDA_SUCCESS"]
        r = smi(node, "-am", "1", "-i", "0")
        assert (r.returncode, r.stdout) == (0, f"Enabled Accounting Mode for GPU {GPU0}.\nAll done.\n")
        assert node.write("gpu0/utilization", b"60 30\n") == 0
        job = Cuda(mount_env(node))
        assert job("create", 0) == [0, "CUDA_SUCCESS"]
        for _ in range(3):
            assert job("alloc", 0) == [0, "CUDA_SUCCESS"]  # 3 MiB at its peak
        pid = job.proc.pid
        # The daemon folds the process table every ~100 ms: the peak it records is the most it saw.
        used = script(f"print(json.dumps([p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses("
                      f"n.nvmlDeviceGetHandleByIndex(0)) if p.pid == {pid}]))")
        wait_until(lambda: run_py_json(env, used) == [3 << 20], "the job's 3 MiB to be folded in")
        job.stop()
    finally:
        before.stop()
    stats = script(f"""
        h = n.nvmlDeviceGetHandleByIndex(0)
        pids = n.nvmlDeviceGetAccountingPids(h)
        s = n.nvmlDeviceGetAccountingStats(h, {pid}) if {pid} in pids else None
        print(json.dumps(dict(mode=n.nvmlDeviceGetAccountingMode(h), size=n.nvmlDeviceGetAccountingBufferSize(h),
                              pids=pids, stats=s and [s.isRunning, s.maxMemoryUsage, s.time, s.startTime,
                                                      s.gpuUtilization])))
    """)
    wait_until(lambda: (run_py_json(env, stats)["stats"] or [1])[0] == 0, "the job's record to say it exited")
    out = run_py_json(env, stats)
    assert (out["mode"], out["size"], out["pids"]) == (1, 4000, [pid])  # `before` is not accounted
    running, max_memory, time_ms, start_us, util = out["stats"]
    assert (running, max_memory, util) == (0, 3 << 20, 60)
    assert 0 < time_ms < 60_000 and abs(start_us / 1e6 - time.time()) < 60
    r = smi(node, "--query-accounted-apps=pid,gpu_utilization,max_memory_usage,time", "--format=csv", "-i", "0")
    assert r.stdout.splitlines() == ["pid, gpu_utilization [%], max_memory_usage [MiB], time [ms]",
                                     f"{pid}, 60 %, 3 MiB, {time_ms} ms"], r.stdout
    assert smi(node, "--query-accounted-apps=pid", "--format=csv,noheader", "-i", "1").stdout == ""  # mode off
    assert smi(node, "--query-gpu=accounting.mode,accounting.buffer_size", "--format=csv,noheader").stdout == \
        "Enabled, 4000\nDisabled, 4000\n"
    assert re.search(r"^    Accounting Mode +: Enabled$", smi(node, "-q", "-i", "0").stdout, re.M)
    r = smi(node, "-caa", "-i", "0")
    assert (r.returncode, r.stdout) == (0, f"Cleared Accounted PIDs for GPU {GPU0}.\nAll done.\n")
    assert run_py_json(env, stats)["pids"] == []
    assert "accounting: 1 (default 0)\n" in node.read("gpu0/config")
