"""NVIDIA's GPU feature discovery (k8s-device-plugin's gpu-feature-discovery, the version
scripts/go-tools.txt pins), unmodified, labelling a mounted node once (`--oneshot`, labels to a
file, no NodeFeature API) under `mokka run`, with MIG off, `mixed` and `single`.

The MIG numbers asserted are a real H100 80GB HBM3's: NVIDIA's MIG user guide lists its profiles
(1g.10gb: 16 SMs, 9.75 GiB = 9984 MiB, 1 copy engine, 1 NVDEC, 1 NVJPG; 1g.20gb: 26 SMs, 19.62 GiB;
2g.20gb: 32 SMs; 3g.40gb: 60 SMs, 39.50 GiB; 7g.80gb: 132 SMs, 79.25 GiB, 8 copy engines, 1 OFA), and GFD copies what
NVML says about each MIG device into its labels."""
from __future__ import annotations

import subprocess

import pytest

from conftest import mokka_cmd
from helpers_go import go_tool

pytestmark = pytest.mark.level("tools")

H100 = "NVIDIA-H100-80GB-HBM3"


def labels(node, tmp_path, strategy: str = "none") -> dict[str, str]:
    out = tmp_path / f"gfd-{strategy}.txt"
    cmd = [*mokka_cmd(), "run", "--root", str(node.mnt), "--", str(go_tool("gpu-feature-discovery")),
           "--oneshot", "--no-timestamp", "--use-node-feature-api=false", "--fail-on-init-error",
           "--mig-strategy", strategy, "--output-file", str(out)]
    r = subprocess.run(cmd, env=node.env, capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if line)


def mig(node, gpu: int, *args: str) -> None:
    r = node.cli("inject", "--root", str(node.mnt), str(gpu), "mig", *args)
    assert r.returncode == 0, r.stderr


def mig_labels(got: dict[str, str], profile: str) -> dict[str, str]:
    prefix = f"nvidia.com/mig-{profile}."
    return {k[len(prefix):]: v for k, v in got.items() if k.startswith(prefix)}


def test_whole_gpus(node_factory, tmp_path):
    node = node_factory("h100", gpus=4)
    got = labels(node, tmp_path)
    want = {
        "nvidia.com/gpu.product": H100,
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.machine": "DGXH100",  # /sys/class/dmi/id/product_name of the hgx-8 composition
    }
    assert {k: got.get(k) for k in want} == want
    driver = node.read("proc/driver/nvidia/version")
    assert got["nvidia.com/cuda.driver-version.full"] in driver
    assert not [k for k in got if k.startswith("nvidia.com/mig-")]


def test_l40s_is_not_mig_capable(node_factory, tmp_path):
    node = node_factory("l40s", gpus=2)
    got = labels(node, tmp_path, "mixed")
    assert got["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert got["nvidia.com/mig.capable"] == "false"
    assert got["nvidia.com/gpu.family"] == "ada-lovelace"
    assert got["nvidia.com/gpu.machine"] == "pcie-4"  # a composition without a system: block names itself


def test_mixed_labels_each_profile_as_a_real_h100(node_factory, tmp_path):
    node = node_factory("h100", gpus=3)
    mig(node, 0, "enable")
    mig(node, 0, "create", "3g.40gb,2g.20gb,1g.10gb,1g.10gb")
    mig(node, 1, "enable")
    mig(node, 1, "create", "1g.20gb,1g.10gb")
    got = labels(node, tmp_path, "mixed")
    assert got["nvidia.com/mig.strategy"] == "mixed"
    assert got["nvidia.com/gpu.count"] == "3"  # under mixed GFD counts the boards, MIG or not
    real = {  # profile: (count, memory MiB, SMs, GI/CI slices, copy, decoder, jpeg)
        "1g.10gb": ("3", "9984", "16", "1", "1", "1", "1"),
        "1g.20gb": ("1", "20096", "26", "1", "1", "1", "1"),
        "2g.20gb": ("1", "20096", "32", "2", "2", "2", "2"),
        "3g.40gb": ("1", "40448", "60", "3", "3", "3", "3"),
    }
    for profile, (count, memory, sms, slices, copy, dec, jpeg) in real.items():
        assert mig_labels(got, profile) == {
            "count": count, "memory": memory, "multiprocessors": sms,
            "slices.gi": slices, "slices.ci": slices,
            "engines.copy": copy, "engines.decoder": dec, "engines.encoder": "0",
            "engines.jpeg": jpeg, "engines.ofa": "0",
            "product": f"{H100}-MIG-{profile}", "replicas": "1", "sharing-strategy": "none",
        }, profile
    assert not mig_labels(got, "7g.80gb")


def test_single_with_one_profile_labels_the_mig_devices_as_gpus(node_factory, tmp_path):
    node = node_factory("h100", gpus=2)
    for g in (0, 1):
        mig(node, g, "enable")
        mig(node, g, "create", "7g.80gb")
    got = labels(node, tmp_path, "single")
    want = {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": f"{H100}-MIG-7g.80gb",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "81152",
        "nvidia.com/gpu.multiprocessors": "132",
        "nvidia.com/gpu.slices.gi": "7",
        "nvidia.com/gpu.slices.ci": "7",
        "nvidia.com/gpu.engines.copy": "8",
        "nvidia.com/gpu.engines.decoder": "7",
        "nvidia.com/gpu.engines.jpeg": "7",
        "nvidia.com/gpu.engines.ofa": "1",
    }
    assert {k: got.get(k) for k in want} == want


@pytest.mark.parametrize("second", ["1g.10gb,1g.10gb", None])
def test_single_with_mixed_sizes_or_mig_off_somewhere_is_mig_invalid(node_factory, tmp_path, second):
    node = node_factory("h100", gpus=2)
    mig(node, 0, "enable")
    mig(node, 0, "create", "3g.40gb,3g.40gb")
    if second:
        mig(node, 1, "enable")
        mig(node, 1, "create", second)
    got = labels(node, tmp_path, "single")
    assert got["nvidia.com/gpu.product"] == f"{H100}-MIG-INVALID"
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/gpu.memory"]) == ("0", "0")
