"""nvidia-smi's configuration commands (-pm, -c, -pl, -lgc, -rgc; docs/nvidia-smi.md) on a mounted
node (level 4): each prints the real tool's lines and exit code, and what it sets is what a second
process (pynvml) and `--query-gpu` report; a refused command, as root or as nobody, changes nothing."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import MountedNode
from helpers_smi import TEXT_H100, capture_section
from test_setters import DEFAULT_CONFIG, open_node, pynvml_env, run_py, script  # noqa: F401 (open_node: fixture)

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
                          env=pynvml_env(node), capture_output=True, text=True, timeout=30, cwd="/")


def query(node: MountedNode) -> list[str]:
    return smi(node, QUERY, "--format=csv,noheader").stdout.splitlines()


def test_each_command_prints_the_real_lines_and_every_process_sees_what_it_set(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = pynvml_env(node)
    idle = [[1, 0, 700000, 345]] * 2
    assert run_py(env, READ_BACK) == idle
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
        assert run_py(env, READ_BACK) == pynvml_sees, args
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
    before = (query(node), run_py(pynvml_env(node), READ_BACK), node.read("gpu1/config"))
    cases = [
        (("-pm", "0", "-i", "1"), f"Unable to set persistence mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-c", "3", "-i", "1"), f"Unable to set compute mode for GPU {GPU1}: Insufficient Permissions\n"),
        (("-pl", "500", "-i", "1"), f"Failed to set power management limit for GPU {GPU1}: Insufficient Permissions\n"),
        (("-lgc", "1500", "-i", "1"), f"The current user does not have permission to change clocks for GPU {GPU1}.\n"),
        (("-rgc",), f"The current user does not have permission to change clocks for GPU {GPU0}.\n"),
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
    assert (query(node), run_py(pynvml_env(node), READ_BACK), node.read("gpu1/config")) == before


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
    assert r.stdout.splitlines() == capture_section(TEXT_H100, "capabilities :: help (-h)")
    for option in ("-pm,  --persistence-mode=", "-c,   --compute-mode=", "-pl   --power-limit=",
                   "-lgc  --lock-gpu-clocks=", "-rgc  --reset-gpu-clocks"):
        assert option in r.stdout, option
