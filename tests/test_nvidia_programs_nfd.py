"""Node Feature Discovery's worker (the version scripts/go-tools.txt pins), unmodified, on a mounted
node under `mokka run`, once (`-oneshot -no-publish`, labels read from its log): its own `pci`
source finds the node's NVIDIA GPUs in the node's sysfs, and its `local` source reads the feature
file `mokka agent` writes (mokkafs/agent/node_files.py), from features.d as a node has it.

features.d is /etc/kubernetes/node-feature-discovery/features.d, which the worker does not let one
change: the test binds its own directory there, inside mokka run's mount namespace."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import mokka_cmd
from helpers_go import go_tool

pytestmark = pytest.mark.level("tools")

FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"


def nfd_labels(node, tmp_path) -> dict[str, str]:
    from mokkafs.agent.node_files import nfd_features

    features = tmp_path / "features.d"
    features.mkdir()
    gpus = len([p for p in node.mnt.iterdir() if re.fullmatch(r"gpu\d+", p.name)])
    (features / "mokkafs").write_text(nfd_features(node.read("node/profile").strip(), gpus,
                                                   node.read("node/driver_version").strip()))
    kubeconfig = tmp_path / "kubeconfig"  # required, never used with -no-publish
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))
    inner = (f"mkdir -p {FEATURES_D} && mount --bind {features} {FEATURES_D} && exec {go_tool('nfd-worker')} "
             f"-kubeconfig {kubeconfig} -oneshot -no-publish -no-owner-refs -v=1 "
             f"-feature-sources=pci,local -label-sources=pci,local")
    r = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "sh", "-c", inner],
                       env=dict(node.env, NODE_NAME="gpu-node-1"), capture_output=True, text=True, timeout=120,
                       cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    block = re.search(r'"feature discovery completed" labels=<\n(.*?)\n\s*>', r.stderr, re.S)
    assert block, r.stderr[-3000:]
    out = {}
    for line in block.group(1).splitlines():
        key, _, value = line.strip().partition(": ")
        out[key] = value.strip('"')
    return out


def test_nfd_finds_the_gpus_and_reads_the_agent_s_feature_file(node_factory, tmp_path):
    node = node_factory("h100", gpus=4)
    got = nfd_labels(node, tmp_path)
    # NFD's pci source: a 3D controller (class 0302) of vendor 10de, from the node's sysfs
    assert got["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    # the local source, from the agent's file (nfd-master adds feature.node.kubernetes.io/)
    assert got["pci-10de.present"] == "true"
    assert got["mokkafs.profile"] == "h100"
    assert got["mokkafs.gpus"] == "4"
    assert got["mokkafs.driver-version"] == node.read("node/driver_version").strip()
    assert got["nvidia.com/gpu.present"] == "true"


def test_nfd_on_an_l4_node(node_factory, tmp_path):
    node = node_factory("l4", gpus=1)
    got = nfd_labels(node, tmp_path)
    assert got["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    assert (got["mokkafs.profile"], got["mokkafs.gpus"]) == ("l4", "1")
