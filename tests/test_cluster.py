"""End to end on a real Kubernetes from parts (scripts/cluster.py): etcd, kube-apiserver,
controller-manager, scheduler, kube-proxy and a kubelet on containerd 2 + runc, images built here.

In order, as a user meets them (each step's failure names the step):
  1. the node is Ready and a plain pod runs and logs;
  2. the project's DaemonSet (deploy/overlays/h100, its image built here) rolls out and mounts an
     8 x H100 node on the host, with its CDI spec;
  3. NVIDIA's device plugin, as its chart renders it in CDI mode, makes nvidia.com/gpu: 8
     allocatable;
  4. a pod asking for one GPU runs and its nvidia-smi lists exactly that GPU;
  5. `kubectl annotate node ... mokkafs.io/inject='gpu=3 xid=79'` makes allocatable 7 and the
     MokkaGPUHealthy condition False, with an Event; `node reset=1` brings both back.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers_cluster import REPO, Cluster, StepFailed
from helpers_go import go_tool

pytestmark = pytest.mark.level("cluster")

CLUSTER_DIR = Path("/var/lib/mokka-cluster-test")
MOUNT = Path("/var/lib/mokkafs/root")
GPU = "nvidia.com/gpu"
FIXTURES = REPO / "tests" / "fixtures" / "cluster"


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the cluster tier runs as root (kubelet, containerd, networking)")
    c = Cluster.up(CLUSTER_DIR)
    try:
        yield c
    finally:
        c.down()


def _agent_objects(cluster: Cluster) -> list[dict]:
    """deploy/overlays/h100 as kubectl renders it, with the image built here."""
    text = cluster.kubectl("kustomize", str(REPO / "deploy" / "overlays" / "h100")).stdout
    objects = [o for o in yaml.safe_load_all(text) if o]
    for o in objects:
        if o["kind"] == "DaemonSet":
            for c in o["spec"]["template"]["spec"]["containers"]:
                c["image"] = cluster.images["debian"]
                c["imagePullPolicy"] = "Never"
    return objects


@pytest.fixture(scope="module")
def agent(cluster):
    objects = _agent_objects(cluster)
    cluster.apply(objects)
    cluster.rollout("daemonset", "mokkafs-agent", "mokkafs", timeout=180)
    cluster.step("the agent's mount on the host", lambda: (MOUNT / "node" / "gpu_count").read_text().strip() == "8",
                 timeout=60, show=lambda: cluster.kubectl("logs", "-n", "mokkafs", "ds/mokkafs-agent",
                                                          check=False).stdout[-3000:])
    yield objects
    cluster.delete(objects)


@pytest.fixture(scope="module")
def device_plugin(cluster, agent):
    text = (FIXTURES / "nvidia-device-plugin.yaml").read_text().replace("@HOOK@", str(go_tool("nvidia-cdi-hook")))
    cluster.apply(text)
    cluster.rollout("daemonset", "nvdp-nvidia-device-plugin", "nvidia-device-plugin", timeout=180)
    yield text
    cluster.delete(text)


def test_the_node_is_ready_and_a_pod_runs(cluster):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": "default"},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "hello", "image": cluster.images["busybox"], "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", "echo hello from $(hostname)"]}]}}
    cluster.apply([pod])
    try:
        cluster.wait_pod("hello", "Succeeded", timeout=120)
        assert cluster.logs("hello").strip() == "hello from hello"
    finally:
        cluster.delete([pod], wait=False)


def test_the_agent_daemonset_mounts_the_node(cluster, agent):
    assert (MOUNT / "node" / "gpu_count").read_text().strip() == "8"
    assert "NVIDIA H100" in (MOUNT / "gpu0" / "info").read_text()
    spec = yaml.safe_load(Path("/var/run/cdi/nvidia.yaml").read_text())
    assert spec["kind"].endswith("/gpu") and len(spec["devices"]) >= 8
    # The agent reports health as a Node condition from the start.
    cond = cluster.step("MokkaGPUHealthy on the Node", lambda: cluster.condition("MokkaGPUHealthy"), timeout=60)
    assert cond["status"] == "True"


def test_the_device_plugin_advertises_eight_gpus(cluster, device_plugin):
    cluster.step(f"{GPU}: 8 allocatable", lambda: cluster.allocatable(GPU) == 8, timeout=120,
                 show=lambda: cluster.kubectl("logs", "-n", "nvidia-device-plugin", "ds/nvdp-nvidia-device-plugin",
                                              check=False).stdout[-3000:])


def _gpu_pod(cluster: Cluster, name: str, command: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": name, "image": cluster.images["debian"], "imagePullPolicy": "Never",
                                     "command": command, "resources": {"limits": {GPU: "1"}}}]}}


def test_a_pod_given_one_gpu_sees_exactly_it(cluster, device_plugin):
    cluster.step(f"{GPU}: 8 allocatable", lambda: cluster.allocatable(GPU) == 8, timeout=120)
    pod = _gpu_pod(cluster, "nvidia-smi", ["nvidia-smi", "-L"])
    cluster.apply([pod])
    try:
        cluster.wait_pod("nvidia-smi", "Succeeded", timeout=120)
        lines = cluster.logs("nvidia-smi").strip().splitlines()
        assert len(lines) == 1, lines
        m = re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: (GPU-[0-9a-f-]+)\)", lines[0])
        assert m, lines
        node_uuids = [(MOUNT / f"gpu{i}" / "uuid").read_text().strip() for i in range(8)]
        assert m.group(1) in node_uuids
    finally:
        cluster.delete([pod], wait=False)


def test_an_xid_annotation_takes_a_gpu_out_and_a_reset_brings_it_back(cluster, device_plugin):
    cluster.step(f"{GPU}: 8 allocatable", lambda: cluster.allocatable(GPU) == 8, timeout=120)
    t0 = time.monotonic()
    cluster.kubectl("annotate", "node", cluster.node, "--overwrite", "mokkafs.io/inject=gpu=3 xid=79")
    cluster.step("gpu3 lost in the tree", lambda: (MOUNT / "gpu3" / "lost").read_text().strip() == "1", timeout=30)
    cluster.step(f"{GPU}: 7 allocatable after Xid 79", lambda: cluster.allocatable(GPU) == 7, timeout=60)
    took = time.monotonic() - t0
    cond = cluster.step("MokkaGPUHealthy False",
                        lambda: (c := cluster.condition("MokkaGPUHealthy")) and c["status"] == "False" and c,
                        timeout=30)
    assert "gpu3" in cond["message"] or "3" in cond["message"], cond
    reasons = {e["reason"] for e in cluster.events(cluster.node)}
    assert "InjectionApplied" in reasons, reasons
    print(f"annotation -> allocatable 7: {took:.1f} s")

    cluster.kubectl("annotate", "node", cluster.node, "--overwrite", "mokkafs.io/inject=node reset=1")
    cluster.step("MokkaGPUHealthy True after node reset",
                 lambda: (c := cluster.condition("MokkaGPUHealthy")) and c["status"] == "True", timeout=60)
    cluster.step(f"{GPU}: 8 allocatable after the reset", lambda: cluster.allocatable(GPU) == 8, timeout=90)
