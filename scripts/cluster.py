#!/usr/bin/env python3
"""A single-node Kubernetes cluster from parts, for the cluster tier (tests/cluster/).

    scripts/cluster.py up   [--dir DIR]     start it; prints the cluster's JSON description
    scripts/cluster.py down [--dir DIR]     stop it and remove everything it made
    scripts/cluster.py env  [--dir DIR]     KUBECONFIG=... for a shell

The parts are real and unmodified: etcd (Debian's), kube-apiserver, kube-controller-manager,
kube-scheduler, kube-proxy and the kubelet (Kubernetes built from the module proxy), containerd 2
with CDI (built from the module proxy), Debian's runc and CNI plugins. scripts/install_go_tools.sh
puts the Go-built ones in the cache; every image a pod runs is built here (scripts/oci_image.py)
and imported, since no registry is reachable.

Where it lives: DIR (default /var/lib/mokka-cluster) holds certificates, configuration, logs and
every component's data. Two places are fixed by Kubernetes and cleaned on `down`: the kubelet's
root /var/lib/kubelet (NVIDIA's device plugin finds the kubelet's socket under it), and the
address 10.99.0.1/32 added to `lo`, on which the API server and the kubelet listen (the
`kubernetes` Service's endpoint must not be a 127.x address, and pods reach the host's own
addresses through their bridge; nothing off this machine can reach lo). Two kubelet settings this
machine needs are set in kubelet_config() and explained there.

One cluster at a time: `up` refuses while DIR/cluster.json names live processes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from oci_image import NVIDIA_PROGRAMS  # noqa: E402
CACHE = Path(os.environ.get("MOKKA_CACHE", Path.home() / ".cache" / "mokkafs"))
GO_BIN = CACHE / "go" / "bin"

NODE = "mokka-node-0"
HOST_IP = "10.99.0.1"  # on lo; see the module docstring
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR
POD_CIDR = "10.244.0.0/24"
BRIDGE = "mokkacni0"
KUBELET_ROOT = Path("/var/lib/kubelet")
# What pods mount with Bidirectional propagation: the project's DaemonSet (deploy/base/daemonset.yaml)
# and the DRA kubelet plugin (the kubelet's plugins directory).
SHARED_PATHS = (Path("/var/lib/mokkafs"), KUBELET_ROOT)
# Files the cluster's pods leave on the host (relative to /), removed on `down`.
HOST_FILES = ("var/run/cdi/nvidia.yaml", "var/run/cdi/k8s.device-plugin.nvidia.com-*.json",
              "etc/kubernetes/node-feature-discovery/features.d/mokkafs",
              "etc/kubernetes/node-feature-discovery/features.d/gfd")
PORTS = {"etcd": 23790, "etcd-peer": 23800, "apiserver": 6443, "kubelet": 10250,
         "kubelet-healthz": 10248, "proxy-healthz": 10256, "proxy-metrics": 10249,
         "cm": 10257, "sched": 10259}
IMAGES = ("pause", "busybox", "debian", "nvidia", "nfd")
PAUSE_IMAGE = "mokkafs.local/pause:1"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "containerd", "kubelet", "kube-proxy")


class ClusterError(Exception):
    pass


def log(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ClusterError(f"{' '.join(cmd[:4])} exited {proc.returncode}: " + " | ".join(tail))
    return proc


def tool(name: str) -> str:
    """A Go-built program from the cache, or Debian's."""
    path = GO_BIN / name
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is not installed (scripts/install_go_tools.sh, scripts/setup.sh)")
    return found


# -- certificates -----------------------------------------------------------------------------

# name: (CN, O, SANs). Each component authenticates as Kubernetes' own identity for it, so the
# API server's RBAC and Node authorizer see what they see on a kubeadm cluster.
CERTS = {
    "apiserver": ("kube-apiserver", None,
                  [f"IP:{HOST_IP}", "IP:127.0.0.1", f"IP:{SERVICE_IP}", "DNS:kubernetes",
                   "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                   "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost"]),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters", []),
    "admin": ("kubernetes-admin", "system:masters", []),
    "controller-manager": ("system:kube-controller-manager", None, []),
    "scheduler": ("system:kube-scheduler", None, []),
    "kube-proxy": ("system:kube-proxy", None, []),
    "kubelet-client": (f"system:node:{NODE}", "system:nodes", []),
    "kubelet-serving": (NODE, None, [f"IP:{HOST_IP}", "IP:127.0.0.1", f"DNS:{NODE}"]),
}


def make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    openssl = "openssl"
    run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
         "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"), "-subj", "/CN=mokka-cluster-ca"])
    for name, (cn, org, sans) in CERTS.items():
        subj = f"/CN={cn}" + (f"/O={org}" if org else "")
        ext = pki / f"{name}.ext"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment",
                 "extendedKeyUsage=" + ("serverAuth" if sans else "clientAuth")]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        run([openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / f"{name}.key"),
             "-out", str(pki / f"{name}.csr"), "-subj", subj])
        run([openssl, "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
             "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "30",
             "-extfile", str(ext), "-out", str(pki / f"{name}.crt")])
    # The service-account token signing key.
    run([openssl, "genrsa", "-out", str(pki / "sa.key"), "2048"])
    run([openssl, "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])
    for key in pki.glob("*.key"):
        key.chmod(0o600)


def kubeconfig(path: Path, pki: Path, user: str) -> None:
    server = f"https://{HOST_IP}:{PORTS['apiserver']}"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "mokka",
        "clusters": [{"name": "mokka", "cluster": {"server": server,
                                                   "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate": str(pki / f"{user}.crt"),
                                          "client-key": str(pki / f"{user}.key")}}],
        "contexts": [{"name": "mokka", "context": {"cluster": "mokka", "user": user}}],
    }, indent=1))


# -- configuration ----------------------------------------------------------------------------


def kubelet_config(d: Path) -> dict:
    pki = d / "pki"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": HOST_IP,
        "port": PORTS["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": PORTS["kubelet-healthz"],
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{d / 'containerd' / 'containerd.sock'}",
        "cgroupDriver": "cgroupfs",
        # This machine's cgroups are v1 only; kubelet 1.35+ refuses to start on v1 unless told
        # that this is known (cgroup v1 is deprecated there, not gone).
        "failCgroupV1": False,
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        "podCIDR": POD_CIDR,
        "staticPodPath": "",
        "serializeImagePulls": False,
        # A test machine's disk runs fuller than a production node's: evict only when it is
        # almost out, never because images fill a shared disk.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "featureGates": {},
    }


def containerd_config(d: Path) -> str:
    """containerd's own default configuration, with this cluster's paths and three changes."""
    text = run([tool("containerd"), "config", "default"]).stdout
    c = d / "containerd"
    repl = {
        "root = '/var/lib/containerd'": f"root = '{c / 'root'}'",
        "state = '/run/containerd'": f"state = '{c / 'state'}'",
        "address = '/run/containerd/containerd.sock'": f"address = '{c / 'containerd.sock'}'",
        "enable_cdi = false": "enable_cdi = true",
        # Root on this machine may not lower a process's oom_score_adj (it runs in a sandbox
        # that raised its own); containerd's default copies the kubelet's value down to the
        # shim and fails every pod sandbox with EACCES. Restricting keeps it at least the
        # caller's, as Kubernetes' own docs advise for rootless and nested nodes.
        "restrict_oom_score_adj = false": "restrict_oom_score_adj = true",
        "sandbox = 'registry.k8s.io/pause:": f"sandbox = '{PAUSE_IMAGE}' # was: 'registry.k8s.io/pause:",
        "conf_dir = '/etc/cni/net.d'": f"conf_dir = '{d / 'cni'}'",
        "bin_dir = '/opt/cni/bin'": "bin_dir = '/usr/lib/cni'",
        "bin_dirs = ['/opt/cni/bin']": "bin_dirs = ['/usr/lib/cni']",
        "BinaryName = ''": f"BinaryName = '{shutil.which('runc') or '/usr/sbin/runc'}'",
    }
    for old, new in repl.items():
        if old in text:
            text = text.replace(old, new)
    for must in ("enable_cdi = true", "restrict_oom_score_adj = true", PAUSE_IMAGE, str(d / "cni")):
        if must not in text:
            raise ClusterError(f"containerd's default configuration changed: could not set {must!r}")
    # Every container starts from a base spec whose createContainer hook binds the node's
    # proc/driver over its /proc/driver, as a real node's kernel shows /proc/driver/nvidia in every
    # container's procfs (base_spec below).
    base = f"base_runtime_spec = '{c / 'base-spec.json'}'"
    text = text.replace("base_runtime_spec = ''", base)
    if base not in text:
        raise ClusterError("containerd's default configuration changed: could not set base_runtime_spec")
    # The `nvidia` runtime handler (a RuntimeClass names it), as NVIDIA's container toolkit sets it
    # up on a GPU node: its runtime in CDI mode turns NVIDIA_VISIBLE_DEVICES=all into the CDI device
    # nvidia.com/gpu=all (the agent's spec) and runs runc. Its configuration file is named by
    # NVIDIA_CTK_CONFIG_FILE_PATH in containerd's environment, which the shims inherit.
    text += f"""
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
  runtime_type = 'io.containerd.runc.v2'
  {base}
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
    BinaryName = '{tool("nvidia-container-runtime")}'
"""
    return text


def base_spec() -> str:
    """containerd's default OCI spec (`ctr oci spec`) with one createContainer hook: mokka-cdi-hook
    binds the agent's mount's proc/driver and proc/devices over the container's, where a real
    node's kernel shows /proc/driver/nvidia, nvidia-caps and the driver's majors to every container
    (NVIDIA's device plugin and DRA plugin read MIG's capability files there, at those absolute
    paths). `--if-present`: before
    the agent has mounted the node (its own pod among the first), a container starts without them,
    as on a node whose driver is not loaded yet (docs/containers.md)."""
    from mokkafs.agent.watch import DEFAULT_MOUNTPOINT
    from mokkafs.render import native

    hook = native.LIB_DIR.parent / "bin" / native.CDI_HOOK
    if not hook.is_file():
        raise ClusterError(f"{hook} is missing: pip install -e . builds it")
    spec = json.loads(run([tool("ctr"), "oci", "spec"]).stdout)
    spec.setdefault("hooks", {})["createContainer"] = [
        {"path": str(hook), "args": [native.CDI_HOOK, "proc", "--if-present", f"{DEFAULT_MOUNTPOINT}/proc"]}]
    return json.dumps(spec, indent=1)


def nvidia_runtime_config(d: Path) -> str:
    """The NVIDIA container runtime's config.toml: CDI mode over runc, the node's spec directories."""
    return f"""[nvidia-container-runtime]
mode = "cdi"
runtimes = ["{shutil.which('runc') or '/usr/sbin/runc'}"]
debug = "{d / 'logs' / 'nvidia-container-runtime.log'}"
log-level = "info"

[nvidia-container-runtime.modes.cdi]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
annotation-prefixes = ["cdi.k8s.io/"]
"""


def cni_config() -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "mokka",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def proxy_config(d: Path) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "clientConnection": {"kubeconfig": str(d / "kube-proxy.kubeconfig")},
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{PORTS['proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{PORTS['proxy-metrics']}",
        # Leave the host's conntrack sysctls alone (read-only in a sandbox, and not ours).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }


# -- processes --------------------------------------------------------------------------------


def start(d: Path, name: str, cmd: list[str], env: dict | None = None) -> int:
    logf = (d / "logs" / f"{name}.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    pids = _read_json(d / "pids.json", {})
    pids[name] = proc.pid
    (d / "pids.json").write_text(json.dumps(pids))
    return proc.pid


def _read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait(what: str, check, timeout: float, d: Path, component: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        if component:
            pid = _read_json(d / "pids.json", {}).get(component)
            if pid and not alive(pid):
                raise ClusterError(f"{component} exited while waiting for {what}: "
                                   + _log_tail(d, component))
        time.sleep(0.2)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (": " + _log_tail(d, component) if component else ""))


def _log_tail(d: Path, component: str, lines: int = 4) -> str:
    try:
        text = (d / "logs" / f"{component}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:])


def api_get(d: Path, path: str, timeout: float = 5.0):
    ctx = ssl.create_default_context(cafile=str(d / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(d / "pki" / "admin.crt"), str(d / "pki" / "admin.key"))
    url = f"https://{HOST_IP}:{PORTS['apiserver']}{path}"
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def node_ready(d: Path) -> bool:
    node = api_get(d, f"/api/v1/nodes/{NODE}")
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))


# -- up ---------------------------------------------------------------------------------------


def up(d: Path) -> dict:
    if os.geteuid() != 0:
        raise ClusterError("needs root (the kubelet, containerd and the network)")
    state = _read_json(d / "pids.json", {})
    if any(alive(pid) for pid in state.values()):
        raise ClusterError(f"a cluster is running from {d}: scripts/cluster.py down --dir {d}")
    down(d, quiet=True)
    t0 = time.monotonic()
    for sub in ("logs", "pki", "etcd", "containerd", "cni", "images"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    bins = {name: tool(name) for name in ("kube-apiserver", "kube-controller-manager",
                                          "kube-scheduler", "kube-proxy", "kubelet", "kubectl",
                                          "containerd", "containerd-shim-runc-v2", "ctr", "etcd",
                                          "runc", "nvidia-container-runtime")}
    if run(["ip", "-4", "addr", "show", "dev", "lo"]).stdout.find(f" {HOST_IP}/") < 0:
        run(["ip", "addr", "add", f"{HOST_IP}/32", "dev", "lo"])
    # Bidirectional mount propagation (the agent's mount reaching the host and the pods) needs
    # its hostPath on a shared mount; systemd makes / shared on a real node, this machine's / is
    # private. The one path the DaemonSet needs becomes a shared bind of itself.
    for shared in SHARED_PATHS:
        shared.mkdir(parents=True, exist_ok=True)
        if run(["mountpoint", "-q", str(shared)], check=False).returncode != 0:
            run(["mount", "--bind", str(shared), str(shared)])
        run(["mount", "--make-rshared", str(shared)])
    make_pki(d / "pki")
    pki = d / "pki"
    for user, file in (("admin", "admin"), ("controller-manager", "controller-manager"),
                       ("scheduler", "scheduler"), ("kube-proxy", "kube-proxy"),
                       ("kubelet-client", "kubelet")):
        kubeconfig(d / f"{file}.kubeconfig", pki, user)

    start(d, "etcd", [bins["etcd"], "--name", "mokka", "--data-dir", str(d / "etcd"),
                      "--listen-client-urls", f"http://127.0.0.1:{PORTS['etcd']}",
                      "--advertise-client-urls", f"http://127.0.0.1:{PORTS['etcd']}",
                      "--listen-peer-urls", f"http://127.0.0.1:{PORTS['etcd-peer']}",
                      "--initial-advertise-peer-urls", f"http://127.0.0.1:{PORTS['etcd-peer']}",
                      "--initial-cluster", f"mokka=http://127.0.0.1:{PORTS['etcd-peer']}",
                      "--quota-backend-bytes", str(2 << 30), "--log-level", "warn"])
    wait("etcd", lambda: urllib.request.urlopen(f"http://127.0.0.1:{PORTS['etcd']}/health",
                                                timeout=2).status == 200, 30, d, "etcd")
    start(d, "kube-apiserver", [
        bins["kube-apiserver"],
        f"--etcd-servers=http://127.0.0.1:{PORTS['etcd']}",
        f"--bind-address={HOST_IP}", f"--advertise-address={HOST_IP}",
        f"--secure-port={PORTS['apiserver']}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        # DRA (resource.k8s.io/v1) is on by default since 1.34; nothing to enable.
        "--profiling=false", "--v=1"])
    wait("the API server", lambda: api_get(d, "/readyz") == "ok", 90, d, "kube-apiserver")
    start(d, "kube-controller-manager", [
        bins["kube-controller-manager"], f"--kubeconfig={d / 'controller-manager.kubeconfig'}",
        f"--authentication-kubeconfig={d / 'controller-manager.kubeconfig'}",
        f"--authorization-kubeconfig={d / 'controller-manager.kubeconfig'}",
        "--bind-address=127.0.0.1", f"--secure-port={PORTS['cm']}",
        "--leader-elect=false", "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--controllers=*,-cloud-node-lifecycle", "--v=1"])
    start(d, "kube-scheduler", [
        bins["kube-scheduler"], f"--kubeconfig={d / 'scheduler.kubeconfig'}",
        f"--authentication-kubeconfig={d / 'scheduler.kubeconfig'}",
        f"--authorization-kubeconfig={d / 'scheduler.kubeconfig'}",
        "--bind-address=127.0.0.1", f"--secure-port={PORTS['sched']}", "--leader-elect=false",
        "--v=1"])

    (d / "cni" / "10-mokka.conflist").write_text(json.dumps(cni_config(), indent=1))
    (d / "containerd" / "config.toml").write_text(containerd_config(d))
    (d / "containerd" / "base-spec.json").write_text(base_spec())
    path_env = {"PATH": f"{GO_BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
    (d / "nvidia-container-runtime.toml").write_text(nvidia_runtime_config(d))
    start(d, "containerd", [bins["containerd"], "--config", str(d / "containerd" / "config.toml")],
          env={**path_env, "NVIDIA_CTK_CONFIG_FILE_PATH": str(d / "nvidia-container-runtime.toml")})
    sock = d / "containerd" / "containerd.sock"
    wait("containerd", lambda: run([bins["ctr"], "-a", str(sock), "version"]).returncode == 0,
         30, d, "containerd")
    import_images(d, bins["ctr"])

    (d / "kubelet.yaml").write_text(json.dumps(kubelet_config(d), indent=1))
    KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
    start(d, "kubelet", [bins["kubelet"], f"--kubeconfig={d / 'kubelet.kubeconfig'}",
                         f"--config={d / 'kubelet.yaml'}", f"--hostname-override={NODE}",
                         f"--node-ip={HOST_IP}", f"--root-dir={KUBELET_ROOT}", "--v=1"],
          env=path_env)
    (d / "kube-proxy.yaml").write_text(json.dumps(proxy_config(d), indent=1))
    start(d, "kube-proxy", [bins["kube-proxy"], f"--config={d / 'kube-proxy.yaml'}",
                            f"--hostname-override={NODE}", "--v=1"])
    wait(f"node {NODE} Ready", lambda: node_ready(d), 120, d, "kubelet")
    desc = describe(d)
    desc["up_seconds"] = round(time.monotonic() - t0, 1)
    (d / "cluster.json").write_text(json.dumps(desc, indent=1))
    return desc


def import_images(d: Path, ctr: str) -> None:
    """Build (or reuse) each image's archive and import it into containerd's k8s.io namespace."""
    sock = d / "containerd" / "containerd.sock"
    cache = CACHE / "images"
    cache.mkdir(parents=True, exist_ok=True)
    for image in IMAGES:
        archive = cache / f"{image}.tar"
        stamp = _image_stamp(image)
        stamp_file = cache / f"{image}.stamp"
        if not archive.exists() or not stamp_file.exists() or stamp_file.read_text() != stamp:
            log(f"building image {image}")
            run([sys.executable, str(REPO / "scripts" / "oci_image.py"), image, str(archive)])
            stamp_file.write_text(stamp)
        run([ctr, "-a", str(sock), "-n", "k8s.io", "images", "import", "--no-unpack=false",
             "--platform", "linux/amd64", str(archive)])


def _image_stamp(image: str) -> str:
    """What an image is made of, so a changed input rebuilds it."""
    h = hashlib.sha256()
    h.update((REPO / "scripts" / "oci_image.py").read_bytes())
    if image == "pause":
        h.update((REPO / "tools" / "pause" / "pause.c").read_bytes())
    elif image in ("nvidia", "nfd"):
        for program in NVIDIA_PROGRAMS:
            stamp = CACHE / "go" / "stamps" / program
            h.update(stamp.read_bytes() if stamp.exists() else b"-")
    elif image == "debian":
        out = run(["git", "-C", str(REPO), "ls-files", "-s", "mokkafs", "shims", "setup.py",
                   "pyproject.toml"], check=False).stdout
        h.update(out.encode())
        diff = run(["git", "-C", str(REPO), "diff", "HEAD", "--", "mokkafs", "shims"],
                   check=False).stdout
        h.update(diff.encode())
    return h.hexdigest()


def describe(d: Path) -> dict:
    return {
        "dir": str(d),
        "node": NODE,
        "host_ip": HOST_IP,
        "server": f"https://{HOST_IP}:{PORTS['apiserver']}",
        "kubeconfig": str(d / "admin.kubeconfig"),
        "kubectl": tool("kubectl"),
        "ctr": tool("ctr"),
        "containerd_socket": str(d / "containerd" / "containerd.sock"),
        "kubelet_root": str(KUBELET_ROOT),
        "images": {image: f"mokkafs.local/{image}:1" for image in IMAGES},
        "pids": _read_json(d / "pids.json", {}),
        "logs": str(d / "logs"),
    }


# -- down -------------------------------------------------------------------------------------


def down(d: Path, quiet: bool = False) -> None:
    """Stop every process and remove every trace; safe to run twice or after a crash."""
    pids = _read_json(d / "pids.json", {})
    # The kubelet first, so it restarts nothing; containers next; the control plane last.
    order = ["kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager"]
    for name in order:
        _stop(pids.get(name))
    sock = d / "containerd" / "containerd.sock"
    ctr = GO_BIN / "ctr"
    if sock.exists() and ctr.exists():
        _kill_containers(str(ctr), sock)
    for name in ("containerd", "kube-apiserver", "etcd"):
        _stop(pids.get(name))
    # Shims whose containerd is gone, and anything else still under this cluster's state.
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim-runc-v2" in cmd and str(d) in cmd:
            _stop(int(proc.name))
    _unmount_under([KUBELET_ROOT, d, *SHARED_PATHS])
    _remove_cgroups()
    _remove_network()
    for p in (KUBELET_ROOT, d, *SHARED_PATHS):
        shutil.rmtree(p, ignore_errors=True)
    for p in (Path("/var/lib/cni/networks/mokka"), Path("/var/lib/cni/results"), Path("/run/nvidia/mps")):
        shutil.rmtree(p, ignore_errors=True)
    # What the pods wrote on the host: the agent's CDI spec and NFD feature file, the device
    # plugin's CDI specs (a pod killed here had no chance to remove them).
    for pattern in HOST_FILES:
        for p in Path("/").glob(pattern):
            p.unlink(missing_ok=True)
    if not quiet:
        log("down: stopped and removed")


def _stop(pid: int | None, grace: float = 5.0) -> None:
    if not pid or not alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass


def _kill_containers(ctr: str, sock: Path) -> None:
    base = [ctr, "-a", str(sock), "-n", "k8s.io", "--timeout", "5s"]
    tasks = run(base + ["tasks", "ls", "-q"], check=False).stdout.split()
    for task in tasks:
        run(base + ["tasks", "kill", "-s", "SIGKILL", task], check=False)
    time.sleep(0.5)
    for task in tasks:
        run(base + ["tasks", "delete", "-f", task], check=False)
    for c in run(base + ["containers", "ls", "-q"], check=False).stdout.split():
        run(base + ["containers", "delete", c], check=False)


def _unmount_under(roots: list[Path]) -> None:
    for _ in range(3):
        try:
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        except OSError:
            return
        mounts = [m.replace("\\040", " ") for m in mounts]
        mine = [m for m in mounts if any(m == str(r) or m.startswith(str(r) + "/") for r in roots)]
        if not mine:
            return
        for m in sorted(mine, key=len, reverse=True):
            run(["umount", "-l", m], check=False)


def _remove_cgroups() -> None:
    """The kubelet's cgroups (kubepods and its children), deepest first, in every hierarchy."""
    base = Path("/sys/fs/cgroup")
    for hierarchy in base.iterdir() if base.is_dir() else []:
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                      reverse=True)
        for p in dirs + [top]:
            try:
                p.rmdir()
            except OSError:
                pass


def _remove_network() -> None:
    run(["ip", "link", "del", BRIDGE], check=False)
    run(["ip", "addr", "del", f"{HOST_IP}/32", "dev", "lo"], check=False)
    for ns in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = ns.split()[0] if ns.split() else ""
        if name.startswith("cni-"):
            run(["ip", "netns", "delete", name], check=False)
    # kube-proxy's and the CNI plugins' chains: flushed and deleted, the rest of the host's left.
    for table in ("nat", "filter", "mangle"):
        rules = run(["iptables-save", "-t", table], check=False).stdout.splitlines()
        chains = [line[1:].split()[0] for line in rules if line.startswith(":")]
        ours = [c for c in chains if c.startswith(("KUBE-", "CNI-"))]
        for line in rules:
            if line.startswith("-A ") and any(f"-j {c}" in line for c in ours) \
                    and line.split()[1] not in ours:
                run(["iptables", "-t", table, "-D"] + shlex.split(line)[1:], check=False)
        for c in ours:
            run(["iptables", "-t", table, "-F", c], check=False)
        for c in ours:
            run(["iptables", "-t", table, "-X", c], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("up", "down", "env"))
    ap.add_argument("--dir", type=Path, default=Path("/var/lib/mokka-cluster"))
    args = ap.parse_args(argv)
    d = args.dir.resolve()
    try:
        if args.command == "up":
            desc = up(d)
            print(json.dumps(desc, indent=1))
        elif args.command == "down":
            down(d)
        else:
            print(f"export KUBECONFIG={d / 'admin.kubeconfig'}")
            print(f"export PATH={GO_BIN}:$PATH")
    except ClusterError as e:
        log(str(e))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
