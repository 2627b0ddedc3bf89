"""NVIDIA's container toolkit (`nvidia-ctk`, the version scripts/go-tools.txt pins), unmodified:
`nvidia-ctk cdi generate --mode nvml` for the mount's driver root, under `mokka run`, with and
without MIG. The spec must name each GPU by index and UUID with its own device node, each MIG
device as `GPU:MIG` and by its MIG- UUID with the capability device nodes of its GPU and compute
instance (/dev/nvidia-caps/nvidia-capN, N the minor the node publishes), and mount the driver
root's NVML, libcuda and nvidia-smi."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from conftest import mokka_cmd
from helpers_go import go_tool, node_info

pytestmark = pytest.mark.level("tools")


def generate(node, tmp_path, strategy: str) -> dict:
    out = tmp_path / f"nvidia-{strategy}.yaml"
    cmd = [*mokka_cmd(), "run", "--root", str(node.mnt), "--", str(go_tool("nvidia-ctk")), "cdi", "generate",
           "--mode", "nvml", "--driver-root", f"{node.mnt}/driver", "--device-name-strategy", strategy,
           "--nvidia-cdi-hook-path", str(go_tool("nvidia-cdi-hook")), "--output", str(out)]
    r = subprocess.run(cmd, env=node.env, capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return yaml.safe_load(out.read_text())


def devices(spec: dict) -> dict[str, list[str]]:
    """Device name -> the paths of its device nodes."""
    return {d["name"]: sorted(n["path"] for n in d["containerEdits"].get("deviceNodes", []))
            for d in spec["devices"]}


def mig_instances(node, gpu: int) -> list[dict]:
    """Each MIG device of `gpu` from the node's MIG file: gi/ci minors and UUID, in GI id order."""
    out = []
    gi_minor = None
    for line in node.read(f"gpu{gpu}/mig").splitlines():
        f = line.split()
        if line.startswith("gi "):
            gi_minor = f[f.index("minor") + 1]
        elif line.startswith("  ci "):
            out.append({"gi_minor": gi_minor, "ci_minor": f[f.index("minor") + 1], "uuid": f[f.index("uuid") + 1]})
    return out


@pytest.mark.parametrize("strategy", ["index", "uuid"])
def test_whole_gpus(node_factory, tmp_path, strategy):
    node = node_factory("h100", gpus=4)
    spec = generate(node, tmp_path, strategy)
    assert spec["kind"] == "nvidia.com/gpu"
    got = devices(spec)
    names = [str(i) if strategy == "index" else node_info(node, i)["uuid"] for i in range(4)]
    assert sorted(got) == sorted([*names, "all"])
    for i, name in enumerate(names):
        assert got[name] == [f"/dev/nvidia{node_info(node, i)['minor']}"]
    assert got["all"] == sorted(f"/dev/nvidia{i}" for i in range(4))
    common = spec["containerEdits"]
    nodes = {n["path"]: n.get("hostPath", n["path"]) for n in common["deviceNodes"]}
    assert nodes["/dev/nvidiactl"] == f"{node.mnt}/driver/dev/nvidiactl"
    mounts = {m["hostPath"] for m in common["mounts"]}
    version = node.read("proc/driver/nvidia/version").split("  ")[1]  # "NVRM version: ...  580.105.08  Release"
    lib = f"{node.mnt}/driver/usr/lib64"
    assert {f"{lib}/libnvidia-ml.so.{version}", f"{lib}/libcuda.so.{version}",
            f"{node.mnt}/driver/usr/bin/nvidia-smi"} <= mounts


def test_mig_devices_carry_their_capability_nodes(node_factory, tmp_path):
    node = node_factory("h100", gpus=2)
    for args in (("enable",), ("create", "3g.40gb,2g.20gb,1g.10gb")):
        assert node.cli("inject", "--root", str(node.mnt), "0", "mig", *args).returncode == 0
    migs = mig_instances(node, 0)
    assert len(migs) == 3

    by_index = devices(generate(node, tmp_path, "index"))
    by_uuid = devices(generate(node, tmp_path, "uuid"))
    # A MIG-enabled GPU is no device of its own (nvcdi skips it): only its MIG devices are.
    assert sorted(by_index) == sorted(["1", "0:0", "0:1", "0:2", "all"])
    assert by_index["1"] == ["/dev/nvidia1"]
    for i, m in enumerate(migs):
        want = sorted(["/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{m['gi_minor']}",
                       f"/dev/nvidia-caps/nvidia-cap{m['ci_minor']}"])
        assert by_index[f"0:{i}"] == want, (i, m)
        assert by_uuid[m["uuid"]] == want, (i, m)
    assert node_info(node, 1)["uuid"] in by_uuid
