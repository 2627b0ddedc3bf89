"""NVIDIA's k8s-device-plugin (the version scripts/go-tools.txt pins), unmodified, on a mounted node,
driven through this repository's kubelet stand-in (tools/kubelet-standin: the v1beta1 Registration
service, ListAndWatch and Allocate, nothing else of a kubelet).

Both run under `mokka run` (the node's /proc/driver/nvidia, /dev/nvidia* and /sys in a private mount
namespace, NVML from the mount's driver root): for MIG the plugin reads each instance's capability
file under /proc/driver/nvidia/capabilities, as on a real node. The plugin's socket directory is
/var/lib/kubelet/device-plugins, which it does not let one change: each run binds a directory of
the test's own there, inside that namespace."""
from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import mokka_cmd
from helpers_go import go_tool, node_env, node_info

pytestmark = pytest.mark.level("tools")

GPU = "nvidia.com/gpu"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


class Kubelet:
    """kubelet-standin running `nvidia-device-plugin ARGS` against `node`; its events in order."""

    def __init__(self, node, tmp: Path, *args: str) -> None:
        sockets = tmp / "device-plugins"
        sockets.mkdir(parents=True)
        self.log = tmp / "device-plugin.log"
        inner = (f"mkdir -p {PLUGIN_DIR} && mount --bind {sockets} {PLUGIN_DIR} && "
                 f"exec {go_tool('kubelet-standin')} -- {go_tool('nvidia-device-plugin')} "
                 f"--driver-root {node.mnt}/driver {' '.join(args)}")
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "sh", "-c", inner],
                                         env=node.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True, cwd="/")
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "eof"})

    def next(self, want: str, timeout: float = 30, resource: str | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self.events.get(timeout=max(left, 0.01))
            except queue.Empty:
                pytest.fail(f"no {want!r} event in {timeout} s; plugin log:\n{self.log.read_text()[-3000:]}")
            self.seen.append(ev)
            if ev["event"] == "eof" or (ev["event"] == "plugin-exited" and want != "plugin-exited"):
                pytest.fail(f"{ev['event']} waiting for {want!r}; log:\n{self.log.read_text()[-3000:]}")
            if want in (ev["event"], "*") and (resource is None or ev.get("resource") == resource):
                return ev

    def quiet(self, seconds: float) -> list[dict]:
        """The events that arrive within `seconds`."""
        out = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                out.append(self.events.get(timeout=left))
        self.seen.extend(out)
        return out

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def registered(self, n: int = 1, timeout: float = 60) -> dict[str, dict]:
        """The first `n` registrations and each resource's first device list: resource -> health by ID."""
        names: list[str] = []
        lists: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while len(names) < n or any(name not in lists for name in names):
            ev = self.next("*", deadline - time.monotonic())
            if ev["event"] == "registered":
                names.append(ev["resource"])
            elif ev["event"] == "devices":
                lists.setdefault(ev["resource"], health(ev))
        return {name: lists[name] for name in names}

    def allocate(self, resource: str, *ids: str) -> dict:
        self.send(f"allocate {resource} {','.join(ids)}")
        ev = self.next("allocate", resource=resource)
        assert "error" not in ev, ev
        return ev["response"]["containerResponses"][0]

    def watching(self, timeout: float = 30) -> None:
        """Until the plugin's health checker has its NVML event set (it logs the Xids it ignores,
        then creates the set and registers each GPU): an Xid before that is one no set was made
        to see (a new event set does not replay history), on a real node as here."""
        deadline = time.monotonic() + timeout
        while "Ignoring the following XIDs for health checks" not in self.log.read_text():
            if time.monotonic() > deadline:
                pytest.fail(f"the health checker never started; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        time.sleep(0.5)  # the set is created and the GPUs registered right after that line

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.send("stop")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def health(ev: dict) -> dict[str, str]:
    return {d["ID"]: d["health"] for d in ev["list"].get("devices", [])}


@pytest.fixture
def kubelet(tmp_path):
    made: list[Kubelet] = []

    def start(node, *args: str) -> Kubelet:
        k = Kubelet(node, tmp_path / f"k{len(made)}", *args)
        made.append(k)
        return k

    yield start
    for k in made:
        k.close()


def uuids(node, n: int) -> list[str]:
    return [node_info(node, i)["uuid"] for i in range(n)]


def mig(node, gpu: int, *args: str) -> None:
    r = node.cli("inject", "--root", str(node.mnt), str(gpu), "mig", *args)
    assert r.returncode == 0, r.stderr


def xid(node, gpu: int, code: int) -> None:
    assert node.write(f"gpu{gpu}/inject_xid", f"{code}\n".encode()) == 0


def wait_health(k: Kubelet, resource: str, device: str, want: str, timeout: float = 10) -> tuple[dict, float]:
    """The first device list of `resource` in which `device` is `want`, and how long it took."""
    start = time.monotonic()
    while True:
        ev = k.next("devices", timeout - (time.monotonic() - start), resource)
        h = health(ev)
        if h.get(device) == want:
            return h, time.monotonic() - start


def test_whole_gpus_are_advertised_healthy_and_allocate_by_uuid(node_factory, kubelet):
    node = node_factory("h100", gpus=8)
    k = kubelet(node, "--device-id-strategy", "uuid", "--pass-device-specs")
    listed = k.registered()[GPU]
    ids = uuids(node, 8)
    assert listed == {u: "Healthy" for u in ids}
    resp = k.allocate(GPU, ids[2], ids[5])
    assert resp["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{ids[2]},{ids[5]}"
    # Device specs: the GPUs' own device nodes (under the driver root's dev/) and the control node.
    paths = {d["hostPath"]: d["containerPath"] for d in resp["devices"]}
    dev = f"{node.mnt}/driver/dev"
    for i in (2, 5):
        assert paths[f"{dev}/nvidia{node_info(node, i)['minor']}"] == f"/dev/nvidia{node_info(node, i)['minor']}"
    assert paths[f"{dev}/nvidiactl"] == "/dev/nvidiactl"
    assert not any(p.endswith(("/nvidia0", "/nvidia1", "/nvidia3")) for p in paths)


def test_index_strategy_and_an_unknown_device_is_refused(node_factory, kubelet):
    node = node_factory("h100", gpus=4)
    k = kubelet(node, "--device-id-strategy", "index")
    listed = k.registered()[GPU]
    assert sorted(listed) == sorted(uuids(node, 4))
    assert k.allocate(GPU, uuids(node, 4)[3])["envs"]["NVIDIA_VISIBLE_DEVICES"] == "3"
    k.send(f"allocate {GPU} GPU-00000000-0000-0000-0000-000000000000")
    assert "unknown device" in k.next("allocate")["error"]


@pytest.mark.parametrize("code", [79, 48])
def test_a_critical_xid_makes_its_gpu_unhealthy_at_once(node_factory, kubelet, code):
    node = node_factory("h100", gpus=4)
    k = kubelet(node)
    ids = uuids(node, 4)
    assert set(k.registered()[GPU].values()) == {"Healthy"}
    k.watching()
    xid(node, 2, code)
    h, took = wait_health(k, GPU, ids[2], "Unhealthy")
    assert {u: s for u, s in h.items() if u != ids[2]} == {u: "Healthy" for u in ids if u != ids[2]}
    assert took < 5, took  # the plugin waits on NVML events in 5 s slices: the event, not a poll


@pytest.mark.parametrize("args", [b"dbe 1\n", b"dbe 1 dram contained\n"])
def test_an_uncorrectable_ecc_error_makes_its_gpu_unhealthy(node_factory, kubelet, args):
    """inject_ecc dbe comes with its Xids (95, or 94 contained, and the remapper's 63), as on a real
    H100: the plugin, which acts on Xids and not on the DBE event, takes the GPU out at once."""
    node = node_factory("h100", gpus=2)
    k = kubelet(node)
    ids = uuids(node, 2)
    assert set(k.registered()[GPU].values()) == {"Healthy"}
    k.watching()
    assert node.write("gpu1/inject_ecc", args) == 0
    h, took = wait_health(k, GPU, ids[1], "Unhealthy")
    assert h[ids[0]] == "Healthy" and took < 5, (h, took)


def test_xid_13_is_ignored_and_a_reset_does_not_heal_until_the_plugin_restarts(node_factory, kubelet):
    node = node_factory("h100", gpus=4)
    k = kubelet(node)
    ids = uuids(node, 4)
    k.registered()
    k.watching()
    xid(node, 1, 13)  # a graphics engine exception: an application's fault, in the plugin's skip list
    xid(node, 3, 79)
    h, _ = wait_health(k, GPU, ids[3], "Unhealthy")
    assert h[ids[1]] == "Healthy"
    assert not [e for e in k.quiet(1) if e["event"] == "devices"]  # Xid 13 sent no update of its own

    # A reset brings the GPU back on every surface, but the plugin never marks a device healthy
    # again: it stays Unhealthy in the kubelet's view until the plugin restarts.
    assert node.write("gpu3/reset", b"1\n") == 0
    assert "health: healthy" in node.read("gpu3/info")
    later = [health(e) for e in k.quiet(6) if e["event"] == "devices"]
    assert all(h[ids[3]] == "Unhealthy" for h in later)
    k.send("restart")
    k.next("plugin-exited")
    assert k.registered()[GPU] == {u: "Healthy" for u in ids}


def mig_mixed_layout(node) -> None:
    """GPU 0: 3g.40gb + 2g.20gb + two 1g.10gb; GPU 1: seven 1g.10gb; GPUs 2, 3 MIG off."""
    mig(node, 0, "enable")
    mig(node, 0, "create", "3g.40gb,2g.20gb,1g.10gb,1g.10gb")
    mig(node, 1, "enable")
    mig(node, 1, "create", ",".join(["1g.10gb"] * 7))


def mig_uuids(node, gpu: int) -> list[tuple[str, str]]:
    """(profile, MIG UUID) of each MIG device on `gpu`, from NVML as the consumers see it."""
    code = f"""
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex({gpu})
out = []
for i in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
    try:
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
    except n.NVMLError_NotFound:
        continue
    name = n.nvmlDeviceGetName(m)
    out.append([name, n.nvmlDeviceGetUUID(m)])
print(json.dumps(out))
"""
    import sys

    r = subprocess.run([sys.executable, "-c", code], env=node_env(node), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [(name.rsplit(" ", 1)[-1], u) for name, u in json.loads(r.stdout)]


def test_mig_mixed_advertises_one_resource_per_profile(node_factory, kubelet):
    node = node_factory("h100", gpus=4)
    mig_mixed_layout(node)
    k = kubelet(node, "--mig-strategy", "mixed", "--device-id-strategy", "uuid")
    got = k.registered(4)
    ids = uuids(node, 4)
    assert got[GPU] == {ids[2]: "Healthy", ids[3]: "Healthy"}
    by_profile: dict[str, set] = {}
    for profile, u in mig_uuids(node, 0) + mig_uuids(node, 1):
        by_profile.setdefault(f"nvidia.com/mig-{profile}", set()).add(u)
    assert sorted(got) == sorted([GPU, *by_profile])
    assert {r: set(got[r]) for r in by_profile} == by_profile
    assert len(by_profile["nvidia.com/mig-1g.10gb"]) == 9
    one = sorted(by_profile["nvidia.com/mig-2g.20gb"])[0]
    assert k.allocate("nvidia.com/mig-2g.20gb", one)["envs"]["NVIDIA_VISIBLE_DEVICES"] == one


def test_mig_single_advertises_mig_devices_as_gpus(node_factory, kubelet):
    node = node_factory("h100", gpus=2)
    for g in (0, 1):
        mig(node, g, "enable")
        mig(node, g, "create", "3g.40gb,3g.40gb")
    k = kubelet(node, "--mig-strategy", "single", "--device-id-strategy", "uuid")
    got = k.registered()
    want = {u for g in (0, 1) for _, u in mig_uuids(node, g)}
    assert len(want) == 4 and set(got[GPU]) == want


def test_xid_79_on_a_mig_gpu_marks_one_device_per_profile_under_mixed(node_factory, kubelet):
    """Which MIG devices an Xid on their parent marks is the plugin's own bookkeeping, pinned here so
    a change shows (docs/consumers.md): each resource (one per MIG profile under `mixed`) keeps one
    device per parent UUID (internal/rm/health.go, parentToDeviceMap: the last one it registered
    wins), and an Xid 79 event, which carries no GPU or compute instance, marks that one. So of
    two 1g.10gb devices on the lost GPU one goes Unhealthy and one stays Healthy."""
    node = node_factory("h100", gpus=2)
    mig(node, 0, "enable")
    mig(node, 0, "create", "3g.40gb,2g.20gb,1g.10gb,1g.10gb")
    k = kubelet(node, "--mig-strategy", "mixed", "--device-id-strategy", "uuid")
    got = k.registered(4)
    k.watching()
    profiles = dict((u, p) for p, u in mig_uuids(node, 0))
    xid(node, 0, 79)
    latest = dict(got)
    for e in k.quiet(4):
        if e["event"] == "devices":
            latest[e["resource"]] = health(e)
    unhealthy = sorted(profiles[u] for h in latest.values() for u, s in h.items() if s == "Unhealthy")
    assert unhealthy == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert sorted(latest["nvidia.com/mig-1g.10gb"].values()) == ["Healthy", "Unhealthy"]
    assert latest[GPU] == {node_info(node, 1)["uuid"]: "Healthy"}
