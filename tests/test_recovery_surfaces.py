"""The recovery lifecycle on a mounted H100 node, through every surface that shows it: NVML's field
and events (pynvml, in a waiting process of its own), our nvidia-smi -q at 590 (a branch that
prints `GPU Recovery Action`), /metrics and gpuN/info. An uncorrectable ECC error asks for a GPU
reset; nvidia-smi -r answers it; `lost 1` asks for a node reboot, which only node/reset answers
(docs/faults.md)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from helpers import free_port, mount_env, wait_for

pytestmark = pytest.mark.level("shims")

FIELD_RECOVERY = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
WORDS = {0: "None", 1: "Reset", 2: "Reboot"}  # nvidia-smi -q's words

# Waits on every supported event of GPU 1 and prints each as it comes, one JSON line, until stdin closes.
WAITER = """
import json, sys, threading, pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(1)
es = p.nvmlEventSetCreate()
p.nvmlDeviceRegisterEvents(h, p.nvmlDeviceGetSupportedEventTypes(h), es)
print(json.dumps({"supported": p.nvmlDeviceGetSupportedEventTypes(h)}), flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    try:
        e = p.nvmlEventSetWait(es, 200)
    except p.NVMLError_Timeout:
        continue
    print(json.dumps([e.eventType, e.eventData]), flush=True)
"""

FIELD = """
import json, pynvml as p
p.nvmlInit()
v = p.nvmlDeviceGetFieldValues(p.nvmlDeviceGetHandleByIndex(1), [230])[0]
print(json.dumps([v.nvmlReturn, v.value.ullVal]))
"""

XID, DBE, RECOVERY = 0x8, 0x2, 0x8000  # nvmlEventType* bits


def surfaces(node, url: str) -> dict:
    """GPU 1's recovery action on each surface."""
    env = mount_env(node)
    rc, value = json.loads(subprocess.run([sys.executable, "-c", FIELD], env=env, capture_output=True, text=True,
                                          timeout=30, check=True).stdout)
    assert rc == 0
    q = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "-q", "-i", "1"], env=env, capture_output=True,
                       text=True, timeout=30, check=True).stdout
    with urllib.request.urlopen(url, timeout=10) as r:
        metrics = r.read().decode()
    info = dict(line.split(": ", 1) for line in node.read("gpu1/info").splitlines())
    return {
        "nvml": value,
        "smi": re.search(r"^\s+GPU Recovery Action\s+: (.*)$", q, re.M)[1],
        "metrics": int(float(re.search(r'^DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION\{gpu="1".*\} (\S+)$', metrics, re.M)[1])),
        "info": info["recovery_action"],
    }


def expect(node, url: str, action: int, spelling: str) -> None:
    want = {"nvml": action, "smi": WORDS[action], "metrics": action, "info": spelling}
    assert surfaces(node, url) == want


def test_the_recovery_action_goes_gpu_reset_then_none_across_a_reset_on_every_surface(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2, mount=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    assert node.mount(("--driver-version", "590.48.01", "--metrics", f"127.0.0.1:{port}")).returncode == 0
    expect(node, url, 0, "none")
    waiter = subprocess.Popen([sys.executable, "-c", WAITER], env=mount_env(node), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(waiter.stdout.readline())["supported"] & RECOVERY
        assert node.write("gpu1/inject_ecc", b"dbe 1\n") == 0
        # the DBE, Xid 95, the action's change, Xid 63 (the row remapped), in that order, to a waiter
        events = [json.loads(waiter.stdout.readline()) for _ in range(4)]
        assert events == [[DBE, 0], [XID, 95], [RECOVERY, 0], [XID, 63]]
        expect(node, url, 1, "gpu_reset")
        r = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "-r", "-i", "1"], env=mount_env(node),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout
        assert json.loads(waiter.stdout.readline()) == [RECOVERY, 0]
        expect(node, url, 0, "none")

        # lost 1: Xid 79 to a waiter, as the driver's own; a node reboot asked, which nvidia-smi -r does not answer
        assert node.write("gpu1/lost", b"1\n") == 0
        assert [json.loads(waiter.stdout.readline()) for _ in range(2)] == [[XID, 79], [RECOVERY, 0]]
        assert node.write("gpu1/lost", b"0\n") == 0
        r = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "-r", "-i", "1"], env=mount_env(node),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout
        expect(node, url, 2, "node_reboot")
        assert node.write("node/reset", b"1\n") == 0
        assert wait_for(lambda: surfaces(node, url)["nvml"] == 0)
        expect(node, url, 0, "none")
    finally:
        waiter.stdin.close()
        waiter.wait(timeout=30)
        waiter.stdout.close()
