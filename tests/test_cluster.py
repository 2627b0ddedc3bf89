"""End to end on a real Kubernetes from parts (scripts/cluster.py): etcd, kube-apiserver,
controller-manager, scheduler, kube-proxy and a kubelet on containerd 2 + runc, images built here.

In order, as a user meets them (each step's failure names the step):
  1. the node is Ready and a plain pod runs and logs;
  2. the project's DaemonSet (deploy/overlays/h100, its image built here) rolls out and mounts an
     8 x H100 node on the host, with its CDI spec;
  3. NVIDIA's device plugin, as its chart renders it in CDI mode, makes nvidia.com/gpu: 8
     allocatable;
  4. a pod asking for one GPU runs and sees exactly that GPU (nvidia-smi, NVML, CUDA), with a
     temperature pinned on the host showing inside;
  5. a ResourceClaim of class gpu.nvidia.com (NVIDIA's DRA driver) gets one GPU, seen the same way;
  6. `kubectl annotate node ... mokkafs.io/inject='gpu=3 xid=79'` makes allocatable 7, the DRA
     driver taints gpu-3 and MokkaGPUHealthy turns False, with an Event; `node reset=1` brings
     the condition back, and allocatable 8 once the device plugin restarts (it never marks a
     device healthy again, on any node);
  7. mig-parted splits GPU 0; the device plugin under the mixed strategy makes its MIG devices
     allocatable and a pod asking for a 1g.10gb sees exactly one;
  8. a claim for a MIG device through the DRA driver (DynamicMIG) creates it at prepare, the pod
     sees exactly it, and unprepare destroys it;
  9. NFD labels the Node from the agent's feature file, and GPU feature discovery, given the GPUs by
     the NVIDIA runtime class, labels it through NFD;
 10. a scenario from a ConfigMap runs to its end (the MokkaScenario condition);
 11. a new GPU count (a Node label) starts a new node cleanly when the agent restarts;
 12. on a GB200 node (a Node label), NVIDIA's compute-domain kubelet plugin starts, publishes its
     IMEX channel and daemon devices, and prepares a ComputeDomain daemon claim: the pod gets the
     node's fabric-imex-mgmt capability device, the fabric's clique id and the daemon's config.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers_cluster import REPO, Cluster, StepFailed
from mokkafs.cli.allocation import parse_mig
from helpers_go import go_cache, go_tool, mig_parted_cmd, module_source, parse_info, pinned

pytestmark = pytest.mark.level("cluster")

CLUSTER_DIR = Path("/var/lib/mokka-cluster-test")
MOUNT = Path("/var/lib/mokkafs/root")
GPU = "nvidia.com/gpu"
FIXTURES = REPO / "tests" / "fixtures" / "cluster"

# What a workload asks of the GPU it was given, through the shims the CDI spec brought (the same
# entry points pynvml and cuda-python call): one JSON line.
PROBE = """\
import ctypes, json
nv = ctypes.CDLL("libnvidia-ml.so.1")
out = {"nvmlInit": nv.nvmlInit_v2()}
n = ctypes.c_uint(); nv.nvmlDeviceGetCount_v2(ctypes.byref(n)); out["nvml_count"] = n.value
h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
buf = ctypes.create_string_buffer(96); nv.nvmlDeviceGetUUID(h, buf, 96); out["uuid"] = buf.value.decode()
m = ctypes.c_uint(); nv.nvmlDeviceGetMinorNumber(h, ctypes.byref(m)); out["minor"] = m.value
t = ctypes.c_uint(); out["temperature_rc"] = nv.nvmlDeviceGetTemperature(h, 0, ctypes.byref(t))
out["temperature"] = t.value
cu = ctypes.CDLL("libcuda.so.1"); out["cuInit"] = cu.cuInit(0)
c = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(c)); out["cuda_count"] = c.value
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the cluster tier runs as root (kubelet, containerd, networking)")
    c = Cluster.up(CLUSTER_DIR)
    try:
        yield c
    finally:
        c.down()


def _gpu_count() -> str:
    """node/gpu_count of the mount the agent made, as the host sees it."""
    return (MOUNT / "node" / "gpu_count").read_text().strip()


def _kustomized(cluster: Cluster, directory: Path, image: str) -> list[dict]:
    """A kustomization as kubectl renders it, every workload's container on `image`, built here."""
    objects = [o for o in yaml.safe_load_all(cluster.kubectl("kustomize", str(directory)).stdout) if o]
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                c["image"] = image
                c["imagePullPolicy"] = "Never"
    return objects


def _agent_objects(cluster: Cluster) -> list[dict]:
    """deploy/overlays/h100 with the image built here."""
    return _kustomized(cluster, REPO / "deploy" / "overlays" / "h100", cluster.images["debian"])


@pytest.fixture(scope="module")
def agent(cluster):
    objects = _agent_objects(cluster)
    cluster.apply(objects)
    cluster.rollout("daemonset", "mokkafs-agent", "mokkafs", timeout=180)
    cluster.step("the agent's mount on the host", lambda: _gpu_count() == "8",
                 timeout=60, show=lambda: cluster.kubectl("logs", "-n", "mokkafs", "ds/mokkafs-agent",
                                                          check=False).stdout[-3000:])
    yield objects
    cluster.delete(objects)


def _rendered_chart(cluster: Cluster, fixture: str, daemonset: str, namespace: str):
    """A checked-in rendering of one of NVIDIA's charts, with this machine's hook path, applied and
    rolled out; deleted when the module's tests are done."""
    text = (FIXTURES / fixture).read_text().replace("@HOOK@", str(go_tool("nvidia-cdi-hook")))
    cluster.apply(text)
    cluster.rollout("daemonset", daemonset, namespace, timeout=180)
    yield text
    cluster.delete(text)


@pytest.fixture(scope="module")
def device_plugin(cluster, agent):
    yield from _rendered_chart(cluster, "nvidia-device-plugin.yaml", "nvdp-nvidia-device-plugin", "nvidia-device-plugin")


@pytest.fixture(scope="module")
def dra_driver(cluster, agent):
    yield from _rendered_chart(cluster, "dra-driver-gpu.yaml", "nvidia-dra-driver-gpu-kubelet-plugin",
                               "nvidia-dra-driver-gpu")


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
    assert _gpu_count() == "8"
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


def _workload(cluster: Cluster, name: str, **gpus) -> list[dict]:
    """A pod that lists its GPUs with nvidia-smi, probes NVML and CUDA, then waits to be asked again
    (kubectl exec); `gpus` are its container's resources (limits or claims) and pod-level claims."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-probe", "namespace": "default"},
          "data": {"probe.py": PROBE}}
    container = {"name": name, "image": cluster.images["debian"], "imagePullPolicy": "Never",
                 "command": ["sh", "-c", "nvidia-smi -L && python3 /probe/probe.py && exec sleep 600"],
                 "resources": gpus["resources"], "volumeMounts": [{"name": "probe", "mountPath": "/probe"}]}
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container],
            "volumes": [{"name": "probe", "configMap": {"name": f"{name}-probe"}}]}
    if "claims" in gpus:
        spec["resourceClaims"] = gpus["claims"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}
    return [cm, pod]


def _sees_exactly(cluster: Cluster, name: str, uuid: str | None = None) -> dict:
    """The running workload `name` sees one GPU (nvidia-smi, NVML, CUDA), the node's GPU of that
    minor and UUID; a temperature pinned on the host shows inside at once (NVML, nvidia-smi)."""
    cluster.wait_pod(name, "Running", timeout=150)
    lines = cluster.step(f"{name}'s nvidia-smi and probe output", lambda: (
        out := cluster.logs(name).strip().splitlines()) and len(out) >= 2 and out, timeout=60)
    m = re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: (GPU-[0-9a-f-]+)\)", lines[0])
    assert m and len(lines) == 2, lines
    seen = json.loads(lines[1])
    node_uuids = [parse_info((MOUNT / f"gpu{i}" / "info").read_text())["uuid"] for i in range(8)]
    assert seen["nvmlInit"] == 0 and seen["nvml_count"] == 1 and seen["cuInit"] == 0 and seen["cuda_count"] == 1, seen
    assert seen["uuid"] == m.group(1) == node_uuids[seen["minor"]], (seen, node_uuids)
    if uuid is not None:
        assert seen["uuid"] == uuid
    gpu = MOUNT / f"gpu{seen['minor']}"

    def probe() -> dict:
        return json.loads(cluster.kubectl("exec", name, "--", "python3", "/probe/probe.py").stdout)

    (gpu / "temperature").write_text("91\n")
    try:
        assert probe()["temperature"] == 91
        smi = cluster.kubectl("exec", name, "--", "nvidia-smi", "--query-gpu=index,temperature.gpu",
                              "--format=csv,noheader").stdout.split()
        assert smi == ["0,", "91"], smi
    finally:
        (gpu / "temperature").write_text("auto\n")
    return seen


def test_a_pod_given_one_gpu_sees_exactly_it(cluster, device_plugin):
    cluster.step(f"{GPU}: 8 allocatable", lambda: cluster.allocatable(GPU) == 8, timeout=120)
    objects = _workload(cluster, "one-gpu", resources={"limits": {GPU: "1"}})
    cluster.apply(objects)
    try:
        _sees_exactly(cluster, "one-gpu")
    finally:
        cluster.delete(objects, wait=False)


def _slice_devices(cluster: Cluster) -> list[dict]:
    slices = cluster.get("resourceslices")["items"]
    return [d for s in slices if s["spec"].get("driver") == "gpu.nvidia.com" and s["spec"].get("nodeName") == cluster.node
            for d in s["spec"].get("devices", [])]


def test_a_resource_claim_gets_one_gpu_through_the_dra_driver(cluster, dra_driver):
    devices = cluster.step("the DRA driver's ResourceSlice with 8 GPUs",
                           lambda: (d := _slice_devices(cluster)) and len([x for x in d if x["attributes"]["type"]["string"] == "gpu"]) == 8 and d,
                           timeout=120, show=lambda: cluster.kubectl("logs", "-n", "nvidia-dra-driver-gpu",
                                                                     "ds/nvidia-dra-driver-gpu-kubelet-plugin", "--tail=40",
                                                                     check=False).stdout)
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in devices}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
    objects = [template, *_workload(cluster, "dra-gpu", resources={"claims": [{"name": "gpu"}]},
                                    claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])]
    cluster.apply(objects)
    try:
        # The claim made from the template lives as long as the pod: read it while the pod runs.
        cluster.wait_pod("dra-gpu", "Running", timeout=150)
        claim_name = cluster.pod("dra-gpu")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        results = cluster.get("resourceclaim", claim_name, "-n", "default")["status"]["allocation"]["devices"]["results"]
        assert [r["driver"] for r in results] == ["gpu.nvidia.com"]
        _sees_exactly(cluster, "dra-gpu", uuid=uuids[results[0]["device"]])
    finally:
        cluster.delete(objects[1:], wait=True)
        cluster.delete(objects[:1], wait=False)


def test_an_xid_annotation_takes_a_gpu_out_and_a_reset_brings_it_back(cluster, device_plugin, dra_driver):
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
    taints = cluster.step("the DRA driver's taint on gpu-3",
                          lambda: [t for d in _slice_devices(cluster) if d["name"] == "gpu-3" for t in d.get("taints", [])],
                          timeout=60)
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    reasons = {e["reason"] for e in cluster.events(cluster.node)}
    assert "InjectionApplied" in reasons, reasons
    print(f"annotation -> allocatable 7: {took:.1f} s")

    cluster.kubectl("annotate", "node", cluster.node, "--overwrite", "mokkafs.io/inject=node reset=1")
    cluster.step("MokkaGPUHealthy True after node reset",
                 lambda: (c := cluster.condition("MokkaGPUHealthy")) and c["status"] == "True", timeout=60)
    # NVIDIA's device plugin never marks a device healthy again (it sets Healthy only when it
    # builds its device list): on a real node too, the GPU comes back to allocatable when the
    # plugin restarts after the repair.
    assert cluster.allocatable(GPU) == 7
    cluster.restart_pods("nvidia-device-plugin", "nvidia-device-plugin")
    cluster.step(f"{GPU}: 8 allocatable after the reset and a plugin restart", lambda: cluster.allocatable(GPU) == 8,
                 timeout=120)


# mig-parted's config for the MIG step: GPU 0 split as a mixed layout, the others whole.
MIG_CONFIG = {"version": "v1", "mig-configs": {
    "mixed-gpu0": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "3g.40gb": 1}},
                   {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}],
    "all-disabled": [{"devices": "all", "mig-enabled": False}],
}}


def _mig_parted(tmp_path: Path, config: str) -> None:
    """NVIDIA's mig-parted applies `config` on the host, as NVIDIA's MIG manager does on a node
    (helpers_go.mig_parted_cmd)."""
    path = tmp_path / "mig-config.yaml"
    path.write_text(yaml.safe_dump(MIG_CONFIG))
    r = subprocess.run(mig_parted_cmd(MOUNT, "apply", "-f", str(path), "-c", config),
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, (config, r.stdout[-2000:], r.stderr[-3000:])


def _device_plugin_mixed(text: str) -> str:
    """The device plugin's rendering as NVIDIA's chart renders it with `migStrategy: mixed`: its
    templates add MIG_STRATEGY, NVIDIA_MIG_MONITOR_DEVICES=all and, for MIG, CAP_SYS_ADMIN in place
    of dropping every capability. It reads /proc/driver/nvidia-caps/mig-minors, which every
    container of this node has from containerd's base spec (scripts/cluster.py), as every
    container of a real node has it from the kernel."""
    objects = [o for o in yaml.safe_load_all(text) if o]
    for o in objects:
        if o["kind"] == "DaemonSet":
            (c,) = o["spec"]["template"]["spec"]["containers"]
            c["env"] = [{"name": "MIG_STRATEGY", "value": "mixed"}, *c["env"],
                        {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]
            c["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    return yaml.safe_dump_all(objects)


def test_a_mig_layout_from_mig_parted_is_allocatable_under_mixed_and_a_pod_gets_one(cluster, device_plugin, tmp_path):
    """mig-parted splits GPU 0 (two 1g.10gb, one 3g.40gb); NVIDIA's device plugin, restarted under
    the mixed strategy as a MIG manager restarts it, advertises nvidia.com/mig-1g.10gb: 2,
    nvidia.com/mig-3g.40gb: 1 and nvidia.com/gpu: 7; a pod asking for one 1g.10gb sees exactly
    one MIG device of GPU 0 (nvidia-smi -L, NVML, CUDA)."""
    _mig_parted(tmp_path, "mixed-gpu0")
    mixed = _device_plugin_mixed(device_plugin)
    try:
        cluster.apply(mixed)
        cluster.restart_pods("nvidia-device-plugin", "nvidia-device-plugin")
        cluster.rollout("daemonset", "nvdp-nvidia-device-plugin", "nvidia-device-plugin", timeout=180)
        want = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1, GPU: 7}
        cluster.step(f"allocatable {want}", lambda: all(cluster.allocatable(r) == n for r, n in want.items()),
                     timeout=120, show=lambda: cluster.kubectl("logs", "-n", "nvidia-device-plugin",
                                                               "ds/nvdp-nvidia-device-plugin", "--tail=30",
                                                               check=False).stdout)
        migs = {d.uuid for d in parse_mig((MOUNT / "gpu0" / "mig").read_text())}
        assert len(migs) == 3, migs
        objects = _workload(cluster, "one-mig", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
        cluster.apply(objects)
        try:
            cluster.wait_pod("one-mig", "Running", timeout=150)
            lines = cluster.step("one-mig's nvidia-smi and probe output", lambda: (
                out := cluster.logs("one-mig").strip().splitlines()) and len(out) >= 3 and out, timeout=60)
            gpu0 = parse_info((MOUNT / "gpu0" / "info").read_text())["uuid"]
            assert lines[0] == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu0})", lines
            m = re.fullmatch(r"\s+MIG 1g\.10gb\s+Device\s+0: \(UUID: (MIG-[0-9a-f-]+)\)", lines[1])
            assert m and len(lines) == 3, lines
            assert m.group(1) in migs, (m.group(1), migs)
            seen = json.loads(lines[2])
            assert seen["nvml_count"] == 1 and seen["uuid"] == gpu0 and seen["cuInit"] == 0 and seen["cuda_count"] == 1, seen
        finally:
            cluster.delete(objects, wait=False)
    finally:
        _mig_parted(tmp_path, "all-disabled")
        cluster.apply(device_plugin)
        cluster.restart_pods("nvidia-device-plugin", "nvidia-device-plugin")
        cluster.step(f"{GPU}: 8 allocatable again", lambda: cluster.allocatable(GPU) == 8, timeout=120)


def test_a_claim_for_a_mig_device_makes_it_at_prepare_through_the_dra_driver(cluster, dra_driver, tmp_path):
    """NVIDIA's DRA driver with the DynamicMIG feature gate (its chart's featureGates; exclusive of
    the NVML health check the other steps use) publishes each H100 whole and as MIG partitions;
    a claim for a 1g.10gb of class mig.nvidia.com makes the plugin, in its privileged pod, create
    that MIG device through NVML at prepare (its commands reach the node over the node's socket,
    docs/setters.md), the pod sees exactly it, and unprepare after the pod's end destroys it."""
    dynamic = dra_driver.replace('"NVMLDeviceHealthCheck=true,"', '"DynamicMIG=true,"')
    assert dynamic != dra_driver
    plugin = ("ds/nvidia-dra-driver-gpu-kubelet-plugin", "-n", "nvidia-dra-driver-gpu")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-mig", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}}]}}}}
    objects = [template, *_workload(cluster, "dra-mig", resources={"claims": [{"name": "mig"}]},
                                    claims=[{"name": "mig", "resourceClaimTemplateName": "one-mig"}])]
    try:
        cluster.apply(dynamic)
        cluster.restart_pods("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-kubelet-plugin", check=False)
        cluster.rollout("daemonset", "nvidia-dra-driver-gpu-kubelet-plugin", "nvidia-dra-driver-gpu", timeout=180)
        cluster.step("MIG partitions in the DRA driver's ResourceSlice",
                     lambda: [d for d in _slice_devices(cluster) if d["attributes"]["type"]["string"] == "mig"],
                     timeout=120, show=lambda: cluster.kubectl("logs", *plugin, "--tail=40", check=False).stdout)
        cluster.apply(objects)
        try:
            cluster.wait_pod("dra-mig", "Running", timeout=150)
        except StepFailed as e:
            raise StepFailed(f"{e}\nthe plugin's log:\n"
                             + cluster.kubectl("logs", *plugin, "--tail=40", check=False).stdout) from None
        lines = cluster.step("dra-mig's nvidia-smi and probe output", lambda: (
            out := cluster.logs("dra-mig").strip().splitlines()) and len(out) >= 3 and out, timeout=60)
        made = {i: parse_mig((MOUNT / f"gpu{i}" / "mig").read_text()) for i in range(8)}
        (gpu,) = [i for i, m in made.items() if m]
        (mig,) = made[gpu]
        m = re.fullmatch(r"\s+MIG 1g\.10gb\s+Device\s+0: \(UUID: (MIG-[0-9a-f-]+)\)", lines[1])
        assert m and m.group(1) == mig.uuid and len(lines) == 3, (lines, made)
        seen = json.loads(lines[2])
        assert seen["nvml_count"] == 1 and seen["cuda_count"] == 1, seen
        assert seen["uuid"] == parse_info((MOUNT / f"gpu{gpu}" / "info").read_text())["uuid"], seen
        cluster.delete(objects[1:], wait=True)
        cluster.step(f"the MIG device on gpu{gpu} destroyed at unprepare",
                     lambda: not parse_mig((MOUNT / f"gpu{gpu}" / "mig").read_text()), timeout=60,
                     show=lambda: cluster.kubectl("logs", *plugin, "--tail=40", check=False).stdout)
    finally:
        cluster.delete(objects, wait=False)
        cluster.apply(dra_driver)
        cluster.restart_pods("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu-kubelet-plugin", check=False)
        _mig_parted(tmp_path, "all-disabled")  # the plugin leaves MIG mode on where it turned it on


def _nfd_objects(cluster: Cluster) -> list[dict]:
    """Node Feature Discovery as its own docs install it (`kubectl apply -k
    deployment/overlays/default`, here from the module scripts/go-tools.txt pins, in the Go module
    cache), with the image built here and the master's extraLabelNs nvidia.com, as NVIDIA's charts
    configure it so that GPU feature discovery's labels reach the Node."""
    version = pinned()["nfd-worker"].rsplit("@", 1)[1]
    overlay = go_cache() / "pkg" / "mod" / f"sigs.k8s.io/node-feature-discovery@{version}" / "deployment" / "overlays" / "default"
    objects = _kustomized(cluster, overlay, cluster.images["nfd"])
    for o in objects:
        if o["kind"] == "ConfigMap" and "nfd-master.conf" in o.get("data", {}):
            o["data"]["nfd-master.conf"] = 'extraLabelNs: ["nvidia.com"]\n'
    return objects


def test_gpu_feature_discovery_and_nfd_label_the_node(cluster, agent):
    """NFD (worker, master) turns the agent's feature file into Node labels; GFD, given the node's
    GPUs by the NVIDIA runtime class, publishes its labels as a NodeFeature, which NFD's master
    puts on the Node too."""
    nfd = _nfd_objects(cluster)
    gfd = (FIXTURES / "gpu-feature-discovery.yaml").read_text()
    cluster.apply(nfd)
    try:
        cluster.rollout("deployment", "nfd-master", "node-feature-discovery", timeout=180)
        cluster.rollout("daemonset", "nfd-worker", "node-feature-discovery", timeout=180)
        labels = cluster.step("NFD's labels from the agent's feature file", lambda: (
            lb := cluster.node_obj()["metadata"].get("labels", {})).get("feature.node.kubernetes.io/mokkafs.profile") and lb,
            timeout=120, show=lambda: str(cluster.node_obj()["metadata"].get("labels")))
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert labels["feature.node.kubernetes.io/mokkafs.profile"] == "h100"
        cluster.apply(gfd)
        cluster.rollout("daemonset", "nvdp-gpu-feature-discovery", "gpu-feature-discovery", timeout=180)
        labels = cluster.step("GFD's labels on the Node", lambda: (
            lb := cluster.node_obj()["metadata"].get("labels", {})).get("nvidia.com/gpu.count") == "8" and lb,
            timeout=120, show=lambda: cluster.kubectl("logs", "-n", "gpu-feature-discovery", "ds/nvdp-gpu-feature-discovery",
                                                      check=False).stdout[-3000:])
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", labels
        assert labels["nvidia.com/gpu.memory"] == "81559", labels
    finally:
        cluster.delete(gfd, wait=False)
        cluster.delete(nfd, wait=False)


SCENARIO = """\
name: flap-once
description: one GPU's temperature pinned, then released
steps:
  - at: 0s
    gpu: 1
    command: temperature 91
  - at: 1s
    gpu: 1
    command: temperature auto
"""


def test_a_scenario_from_a_configmap_runs(cluster, agent):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stories", "namespace": "mokkafs"},
          "data": {"flap.yaml": SCENARIO}}
    cluster.apply([cm])
    try:
        cluster.kubectl("annotate", "node", cluster.node, "--overwrite",
                        "mokkafs.io/scenario=configmap=stories/flap.yaml")
        started = cluster.step("a ScenarioStarted Event",
                               lambda: [e for e in cluster.events(cluster.node) if e["reason"] == "ScenarioStarted"],
                               timeout=60,
                               show=lambda: str([(e["reason"], e["message"]) for e in cluster.events(cluster.node)]))
        assert "flap-once" in started[-1]["message"]
        cond = cluster.step("MokkaScenario ScenarioFinished",
                            lambda: (c := cluster.condition("MokkaScenario")) and c["reason"] == "ScenarioFinished" and c,
                            timeout=90, show=lambda: str(cluster.condition("MokkaScenario")))
        assert cond["status"] == "False" and "flap-once finished" in cond["message"]
    finally:
        cluster.delete([cm], wait=False)


def _restart_agent(cluster: Cluster) -> None:
    cluster.restart_pods("mokkafs", "mokkafs-agent")
    cluster.rollout("daemonset", "mokkafs-agent", "mokkafs", timeout=120)


def test_a_new_gpu_count_starts_a_new_node_cleanly(cluster, agent):
    """Relabelling the Node and restarting the agent mounts the new node, with one Event, where the
    restarted agent used to refuse the surviving state directory and crash-loop. Last: it changes the node."""
    cluster.kubectl("label", "node", cluster.node, "--overwrite", "mokkafs.io/gpus=4")
    try:
        _restart_agent(cluster)
        cluster.step("the host's mount shows 4 GPUs",
                     lambda: _gpu_count() == "4", timeout=60)
        changed = [e for e in cluster.events(cluster.node) if e["reason"] == "SimulatedNodeChanged"]
        assert len(changed) == 1 and "4 x h100" in changed[0]["message"], changed
        pods = cluster.get("pods", "-n", "mokkafs")["items"]
        assert [p["status"]["containerStatuses"][0]["restartCount"] for p in pods] == [0]
    finally:
        cluster.kubectl("label", "node", cluster.node, "mokkafs.io/gpus-", check=False)
        _restart_agent(cluster)
    cluster.step("the host's mount shows 8 GPUs again",
                 lambda: _gpu_count() == "8", timeout=60)


def _compute_domain_slice(cluster: Cluster) -> list[str]:
    return sorted(d["name"] for s in cluster.get("resourceslices")["items"]
                  if s["spec"].get("driver") == "compute-domain.nvidia.com" and s["spec"].get("nodeName") == cluster.node
                  for d in s["spec"].get("devices", []))


def _host_fabric() -> set[str]:
    """The clique ids the node's GPUs report, as `<cluster UUID>.<clique id>`, from the host's view
    (nvidia-smi under `mokka run` on the mount): a set, which one clique makes one element."""
    from conftest import mokka_cmd

    r = subprocess.run([*mokka_cmd(), "run", "--root", str(MOUNT), "--", "nvidia-smi",
                        "--query-gpu=fabric.clusterUuid,fabric.cliqueId", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {".".join(f.strip() for f in line.split(",")) for line in r.stdout.splitlines()}


def test_the_compute_domain_plugin_prepares_an_imex_daemon_claim_on_a_gb200_node(cluster, agent, dra_driver):
    """NVIDIA's compute-domain kubelet plugin, unmodified, on a GB200 node: at start it finds the
    fabric clique through NVML (refusing to start on a fabric that is not attached) and the IMEX
    channels' major in /proc/devices; a claim of class compute-domain-daemon.nvidia.com for a
    ComputeDomain is prepared with the node's fabric-imex-mgmt capability device (its minor from
    /proc/driver/nvidia/capabilities/fabric-imex-mgmt, which the plugin reads in its own pod), the
    clique id and the IMEX daemon's config template; unprepare removes the claim's CDI spec."""
    source = module_source("compute-domain-kubelet-plugin")  # the pinned DRA driver's own tree
    crds = source / "deployments/helm/dra-driver-nvidia-gpu/crds"
    crd_text = "\n---\n".join(p.read_text() for p in sorted(crds.glob("*.yaml")))
    plugin = (FIXTURES / "dra-driver-compute-domain.yaml").read_text().replace("@HOOK@", str(go_tool("nvidia-cdi-hook")))
    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
              "metadata": {"name": "imex", "namespace": "default"},
              "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}}}
    template = (source / "templates/compute-domain-daemon-config.tmpl.cfg").read_bytes()
    cluster.kubectl("label", "node", cluster.node, "--overwrite", "mokkafs.io/profile=gb200")
    objects: list[dict] = []
    try:
        _restart_agent(cluster)
        cluster.step("the host's mount is a GB200 node",
                     lambda: "NVIDIA GB200" in (MOUNT / "gpu0" / "info").read_text(), timeout=60)
        cluster.apply(crd_text)
        cluster.kubectl("wait", "--for=condition=established", "crd/computedomains.resource.nvidia.com", timeout=60)
        cluster.apply(plugin)
        cluster.rollout("daemonset", "nvidia-dra-driver-gpu-compute-domain-kubelet-plugin", "nvidia-dra-driver-gpu",
                        timeout=180)
        cluster.step("the compute-domain plugin's ResourceSlice",
                     lambda: _compute_domain_slice(cluster) == ["channel-0", "daemon-0"], timeout=120,
                     show=lambda: cluster.kubectl("logs", "-n", "nvidia-dra-driver-gpu",
                                                  "ds/nvidia-dra-driver-gpu-compute-domain-kubelet-plugin",
                                                  "--tail=40", check=False).stdout)
        cluster.apply([domain])
        uid = cluster.get("computedomain", "imex", "-n", "default")["metadata"]["uid"]
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "imex-daemon", "namespace": "default"},
                 "spec": {"devices": {
                     "requests": [{"name": "daemon", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"}}],
                     "config": [{"requests": ["daemon"], "opaque": {"driver": "compute-domain.nvidia.com", "parameters": {
                         "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig",
                         "domainID": uid}}}]}}}
        show = "env | grep -E '^(CLIQUE_ID|COMPUTE_DOMAIN_UUID)=' | sort; stat -c 'dev %t:%T' /dev/nvidia-caps/nvidia-cap4323; " \
               "sha256sum /imexd/imexd.cfg.tmpl | cut -d' ' -f1; exec sleep 600"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "imex-daemon", "namespace": "default"},
               "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                        "resourceClaims": [{"name": "daemon", "resourceClaimName": "imex-daemon"}],
                        "containers": [{"name": "daemon", "image": cluster.images["debian"], "imagePullPolicy": "Never",
                                        "command": ["bash", "-c", show], "resources": {"claims": [{"name": "daemon"}]}}]}}
        objects = [claim, pod]
        cluster.apply(objects)
        cluster.wait_pod("imex-daemon", "Running", timeout=150)
        lines = cluster.step("the daemon pod's output", lambda: (
            out := cluster.logs("imex-daemon").strip().splitlines()) and len(out) >= 4 and out, timeout=60)
        # What the node says, read on the host: the nvidia-caps major, fabric-imex-mgmt's minor.
        major = next(int(f[0]) for f in map(str.split, (MOUNT / "proc/devices").read_text().splitlines())
                     if f[1:] == ["nvidia-caps"])
        minor = next(int(line.split(":")[1]) for line in
                     (MOUNT / "proc/driver/nvidia/capabilities/fabric-imex-mgmt").read_text().splitlines()
                     if line.startswith("DeviceFileMinor:"))
        assert lines == [*(f"CLIQUE_ID={clique}" for clique in _host_fabric()), f"COMPUTE_DOMAIN_UUID={uid}",
                         f"dev {major:x}:{minor:x}", hashlib.sha256(template).hexdigest()], lines
        spec_file = [p for p in Path("/var/run/cdi").glob("k8s.compute-domain.nvidia.com-claim_*")]
        assert len(spec_file) == 1, spec_file
        cluster.delete(objects, wait=True)
        objects = []
        cluster.step("unprepare removes the claim's CDI spec",
                     lambda: not list(Path("/var/run/cdi").glob("k8s.compute-domain.nvidia.com-claim_*")), timeout=60)
    finally:
        if objects:
            cluster.delete(objects, wait=True)
        if cluster.kubectl("get", "crd", "computedomains.resource.nvidia.com", check=False).returncode == 0:
            cluster.delete([domain], wait=True)
        cluster.delete(plugin)
        cluster.kubectl("label", "node", cluster.node, "mokkafs.io/profile-", check=False)
        _restart_agent(cluster)
    cluster.step("the host's mount is the H100 node again",
                 lambda: _gpu_count() == "8" and "NVIDIA H100" in (MOUNT / "gpu0" / "info").read_text(), timeout=60)
