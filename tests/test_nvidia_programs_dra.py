"""NVIDIA's DRA kubelet plugin (sigs.k8s.io/dra-driver-nvidia-gpu's gpu-kubelet-plugin, the version
scripts/go-tools.txt pins), unmodified, on a mounted node under `mokka run`: the ResourceSlice it
publishes for the node's GPUs and MIG devices.

The plugin publishes through the API server: here a stand-in on 127.0.0.1 that answers the
ResourceSlice controller's watch-list (an initial-events-end bookmark, then an open stream) and
records each ResourceSlice it creates. Preparing a claim (and dynamic MIG, which the plugin does
at prepare time) needs the kubelet's DRA gRPC calls and a ResourceClaim from the API server: not
covered here (docs/consumers.md)."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from conftest import mokka_cmd
from helpers import wait_for
from helpers_go import go_tool, node_info

pytestmark = pytest.mark.level("tools")

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# The plugin's client sends ResourceSlices as Kubernetes protobuf: the "k8s\0" magic, then an
# Unknown envelope (raw = 2) holding the object. Field numbers from k8s.io/api's
# resource/v1/generated.proto: ResourceSlice {metadata 1, spec 2}; ObjectMeta {name 1,
# generateName 2}; ResourceSliceSpec {driver 1, pool 2, nodeName 3, devices 6}; ResourcePool
# {name 1, generation 2, resourceSliceCount 3}; Device {name 1, attributes 2, capacity 3} (maps:
# entries {key 1, value 2}); DeviceAttribute {int 2, bool 3, string 4, version 5}; DeviceCapacity
# {value 1}; Quantity {string 1}.


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes) -> dict[int, list]:
    out: dict[int, list] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(key >> 3, []).append(v)
    return out


def decode_slice(body: bytes) -> dict:
    assert body[:4] == b"k8s\0", body[:16]
    rs = _fields(_fields(body[4:])[2][0])

    def text(f: dict, n: int) -> str | None:
        return f[n][0].decode() if n in f else None

    meta, spec = _fields(rs[1][0]), _fields(rs[2][0])
    pool = _fields(spec[2][0]) if 2 in spec else {}
    devices = []
    for d in spec.get(6, []):
        df = _fields(d)
        attributes = {}
        for entry in df.get(2, []):
            e = _fields(entry)
            a = _fields(e[2][0])
            if 4 in a:
                value = {"string": text(a, 4)}
            elif 2 in a:
                value = {"int": a[2][0] - (1 << 64) if a[2][0] >= 1 << 63 else a[2][0]}
            elif 3 in a:
                value = {"bool": bool(a[3][0])}
            else:
                value = {"version": text(a, 5)}
            attributes[text(e, 1)] = value
        capacity = {}
        for entry in df.get(3, []):
            e = _fields(entry)
            capacity[text(e, 1)] = {"value": text(_fields(_fields(e[2][0])[1][0]), 1)}
        taints = []
        for entry in df.get(8, []):  # DeviceTaint {key 1, value 2, effect 3}
            t = _fields(entry)
            taints.append({"key": text(t, 1), "value": text(t, 2), "effect": text(t, 3)})
        devices.append({"name": text(df, 1), "attributes": attributes, "capacity": capacity, "taints": taints})
    return {"metadata": {"name": text(meta, 1), "generateName": text(meta, 2)},
            "spec": {"driver": text(spec, 1), "nodeName": text(spec, 3),
                     "pool": {"name": text(pool, 1), "generation": pool.get(2, [0])[0],
                              "resourceSliceCount": pool.get(3, [0])[0]},
                     "devices": devices}}


class ApiServer:
    """Just enough of an API server for the plugin's ResourceSlice controller: its Node (the slices'
    owner), a watch-list of no slices, and create."""

    def __init__(self) -> None:
        self.created: list[dict] = []
        self.requests: list[str] = []
        self.lock = threading.Condition()
        self.stop = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                q = parse_qs(url.query)
                api.requests.append(f"GET {url.path}")
                if url.path == "/api/v1/nodes/gpu-node-1":  # the slices' owner
                    self.reply(200, {"kind": "Node", "apiVersion": "v1", "metadata": {
                        "name": "gpu-node-1", "uid": "6f1c2a9e-0d7b-4c1e-9a51-3d1f8f0e2b71", "resourceVersion": "1"}})
                    return
                if url.path != SLICES:
                    self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                     "reason": "NotFound", "message": f"{url.path} not found"})
                    return
                if q.get("watch") != ["true"]:
                    self.reply(200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                                     "metadata": {"resourceVersion": "1"}, "items": []})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if q.get("sendInitialEvents") == ["true"]:
                    self.chunk({"type": "BOOKMARK", "object": {
                        "kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1",
                        "metadata": {"resourceVersion": "1",
                                     "annotations": {"k8s.io/initial-events-end": "true"}}}})
                while not api.stop.wait(0.2):
                    pass

            def chunk(self, obj: dict) -> None:
                data = json.dumps(obj).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_PUT(self) -> None:  # an update of a slice it made (the health monitor's taints)
                self.do_POST()

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                api.requests.append(f"{self.command} {url.path}")
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Type") == "application/vnd.kubernetes.protobuf":
                    body = decode_slice(raw)
                else:
                    body = json.loads(raw)
                with api.lock:
                    n = len(api.created)
                    meta = body.setdefault("metadata", {})
                    meta["name"] = meta.get("name") or (meta.get("generateName") or "slice-") + f"{n:05d}"
                    meta.update(uid=f"00000000-0000-0000-0000-{n:012d}", resourceVersion=str(2 + n),
                                creationTimestamp="2026-01-01T00:00:00Z")
                    api.created.append(body)
                    api.lock.notify_all()
                reply = {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1", "metadata": meta,
                         "spec": {k: v for k, v in body["spec"].items() if k != "devices"}}
                self.reply(201 if self.command == "POST" else 200, reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_created(self, timeout: float = 60) -> list[dict]:
        with self.lock:
            self.lock.wait_for(lambda: self.created, timeout)
            return list(self.created)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def published(tmp_path):
    """published(node) -> the devices of the ResourceSlice(s) the plugin created for `node`."""
    runs = []

    def run(node, *extra: str) -> list[dict]:
        api = ApiServer()
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": api.url}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {}}]}))
        for d in ("cdi", "plugins", "registry"):
            (tmp_path / d).mkdir(exist_ok=True)
        log = (tmp_path / "plugin.log").open("w")
        cmd = [*mokka_cmd(), "run", "--root", str(node.mnt), "--", str(go_tool("gpu-kubelet-plugin")),
               "--kubeconfig", str(kubeconfig), "--node-name", "gpu-node-1", "--image-name", "unused",
               "--cdi-root", str(tmp_path / "cdi"), "--nvidia-driver-root", f"{node.mnt}/driver",
               "--container-driver-root", f"{node.mnt}/driver",
               "--nvidia-cdi-hook-path", str(go_tool("nvidia-cdi-hook")),
               "--kubelet-plugins-directory-path", str(tmp_path / "plugins"),
               "--kubelet-registrar-directory-path", str(tmp_path / "registry"), *extra]
        proc = subprocess.Popen(cmd, env=node.env, stdout=log, stderr=subprocess.STDOUT, cwd="/")
        runs.append((proc, api, log))
        created = api.wait_created()
        assert created, "\n".join(api.requests) + (tmp_path / "plugin.log").read_text()[-3000:]
        time.sleep(0.5)  # the controller creates the node's slices together
        slices = [s for s in api.created if s["spec"].get("nodeName") == "gpu-node-1"]
        assert all(s["spec"]["driver"] == "gpu.nvidia.com" for s in slices)
        return [d for s in slices for d in s["spec"].get("devices", [])]

    run.runs = runs
    yield run
    for proc, api, log in runs:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        api.close()
        log.close()


def attrs(device: dict) -> dict:
    """A device's attributes as plain values ({"string": x} -> x), and its capacities."""
    out = {k: next(iter(v.values())) for k, v in device.get("attributes", {}).items()}
    out.update({f"capacity.{k}": v["value"] for k, v in device.get("capacity", {}).items()})
    return out


def test_whole_gpus_are_published_with_their_identity(node_factory, published):
    node = node_factory("h100", gpus=4)
    devices = {d["name"]: attrs(d) for d in published(node)}
    assert sorted(devices) == [f"gpu-{i}" for i in range(4)]
    for i in range(4):
        info = node_info(node, i)
        a = devices[f"gpu-{i}"]
        assert a["uuid"] == info["uuid"]
        assert a["productName"] == "NVIDIA H100 80GB HBM3"
        assert a["architecture"] == "Hopper"
        assert a["type"] == "gpu"
        assert a["cudaComputeCapability"] == "9.0.0"
        assert a["addressingMode"] == "HMM"
        assert a["resource.kubernetes.io/pciBusID"] == info["bus_id"][4:].lower()
        # the PCIe root complex the GPU hangs under, from the node's sysfs (the link's first hop)
        link = os.readlink(node.mnt / "sys/bus/pci/devices" / info["bus_id"][4:].lower())
        assert a["resource.kubernetes.io/pcieRoot"] == link.split("/devices/")[1].split("/")[0]
        assert a["capacity.memory"] == "81559Mi"
        # the driver's 580.105.08 as a semantic version (the plugin drops the leading zero)
        major, minor, patch = node.read("node/driver_version").strip().split(".")
        assert a["driverVersion"] == f"{major}.{minor}.{int(patch)}"


def test_mig_devices_carry_their_profile_and_placement(node_factory, published):
    node = node_factory("h100", gpus=2)
    for args in (("enable",), ("create", "3g.40gb,2g.20gb,1g.10gb")):
        assert node.cli("inject", "--root", str(node.mnt), "0", "mig", *args).returncode == 0
    devices = {d["name"]: attrs(d) for d in published(node)}
    migs = {name: a for name, a in devices.items() if a.get("type") == "mig"}
    # gpu-0-mig-<profile without dots>-<GI profile id>-<placement start>, as the node places them
    placed = {}
    for line in node.read("gpu0/mig").splitlines():
        f = line.split()
        if f[:1] == ["gi"]:
            placed[f[3]] = (int(f[f.index("id") + 1]), int(f[f.index("placement") + 1].split(":")[0]))
    want = {f"gpu-0-mig-{p.replace('.', '')}-{pid}-{start}": p for p, (pid, start) in placed.items()}
    assert sorted(migs) == sorted(want)
    for name, profile in want.items():
        a = migs[name]
        assert a["profile"] == profile
        assert a["parentUUID"] == node_info(node, 0)["uuid"]
        assert a["uuid"].startswith("MIG-")
    assert "gpu-1" in devices and "gpu-0" not in devices


def test_an_uncorrectable_ecc_error_taints_its_gpu_through_the_health_check(node_factory, published, tmp_path):
    """With NVMLDeviceHealthCheck on, the plugin waits on NVML's Xid events and taints the device in
    its ResourceSlice (gpu.nvidia.com/xid, NoSchedule, the Xid's number as the value): inject_ecc
    dbe on an H100 comes with its Xids (95, then the remapper's 63), so the GPU is tainted."""
    node = node_factory("h100", gpus=2)
    before = {d["name"]: d for d in published(node, "--feature-gates", "NVMLDeviceHealthCheck=true")}
    assert [d["taints"] for d in before.values()] == [[], []]
    api = [a for _, a, _ in published.runs][-1]
    seen = len(api.created)
    assert node.write("gpu1/inject_ecc", b"dbe 1\n") == 0

    def tainted() -> list[dict] | None:
        with api.lock:
            api.lock.wait_for(lambda: len(api.created) > seen, 0.5)
            for body in api.created[seen:]:
                for d in body["spec"].get("devices", []):
                    if d["name"] == "gpu-1" and d["taints"]:
                        return [{k: t[k] for k in ("key", "effect")} | {"value": t["value"]} for t in d["taints"]]
        return None

    taints = wait_for(tainted, timeout=30)
    assert taints, "\n".join(api.requests) + (tmp_path / "plugin.log").read_text()[-3000:]
    assert {t["key"]: t["effect"] for t in taints} == {"gpu.nvidia.com/xid": "NoSchedule"}
    assert taints[0]["value"] in ("95", "63")
    last = [d for body in api.created[seen:] for d in body["spec"].get("devices", []) if d["name"] == "gpu-0"]
    assert all(not d["taints"] for d in last)
