"""A fake Kubernetes API server for the agent's tests: Nodes (one, or a pool: `add_node`) and
ConfigMaps, on 127.0.0.1 only, answering the few calls `mokka agent` makes (GET/PATCH a Node and
its status, list+watch by field selector, POST Events, GET, POST (create) and PUT (replace) a
ConfigMap) with the API server's real response shapes, plus knobs to make it conflict (409), end
a watch early, expire a watch (410 Gone), or forbid a namespace's ConfigMaps (403).

Why a fake remains beside the real API server of the cluster tier (tests/test_cluster.py, which
runs the agent's DaemonSet, its annotations, conditions, Events, ConfigMap scenarios and a
relabelled node against kube-apiserver 1.36): these are the cases a real server cannot be made to
show on demand. A write conflict at a chosen moment (409 on the agent's status PATCH), a watch that
the server ends early or expires (410 Gone, the agent's relist), a namespace whose ConfigMaps are
forbidden (403), a pool of nodes watched by one agent, and the agent's own unit tests, which run
in every tier without a cluster (level daemon: no kubelet, no containerd, no root networking)."""
from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    out = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _uid(name: str) -> str:
    """The first node keeps the uid the tests have always seen; others get one of their own."""
    if name == "gpu-node-1":
        return "6f1c2a9e-0d7b-4c1e-9a51-3d1f8f0e2b71"
    return "6f1c2a9e-0d7b-4c1e-9a51-" + format(abs(hash(name)) % 16**12, "012x")


def _selected(q: dict, name: str) -> bool:
    """The only field selector the agent uses: `metadata.name=NAME` (none: every node)."""
    selector = q.get("fieldSelector")
    return selector is None or selector == f"metadata.name={name}"


class FakeCluster:
    def __init__(self, node_name: str = "gpu-node-1", labels: dict | None = None) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.nodes: dict[str, dict] = {}
        self.first = node_name
        self.configmaps: dict[tuple[str, str], dict] = {}  # (namespace, name) -> data
        self.configmap_writes: list[tuple[str, str, str]] = []  # (POST/PUT, namespace, name) the agent made
        self.history: list[dict] = []  # one snapshot per resourceVersion, of the node it changed
        self.events: list[dict] = []
        self.patches: list[tuple[str, str, dict]] = []  # (path, content type, body)
        self.requests: list[tuple[str, str]] = []
        self.conflicts = 0  # the next N node patches meet a concurrent writer first (409)
        self.end_watches = 0  # the next N watches end at once, as an API server restart does
        self.expire_watches = 0  # the next N watches answer 410 Gone
        self.forbidden: set[str] = set()  # namespaces whose ConfigMaps the agent may not write (403)
        self.server: ThreadingHTTPServer | None = None
        self.add_node(node_name, labels)

    @property
    def node(self) -> dict:
        """The first node (a one-node cluster's only one)."""
        return self.nodes[self.first]

    def add_node(self, node_name: str, labels: dict | None = None) -> None:
        self.rv += 1
        self.nodes[node_name] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": node_name,
                "uid": _uid(node_name),
                "resourceVersion": str(self.rv),
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"kubernetes.io/hostname": node_name, **(labels or {})},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": "2026-12-01T10:00:00Z",
                        "lastTransitionTime": "2026-12-01T10:00:00Z",
                    }
                ]
            },
        }
        self.history.append(copy.deepcopy(self.nodes[node_name]))

    # -- changes, as another writer (a user with kubectl, the kubelet) makes them ---------------

    def _bump(self, name: str) -> None:
        self.rv += 1
        self.nodes[name]["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append(copy.deepcopy(self.nodes[name]))
        self.lock.notify_all()

    def annotate(self, key: str, value: str | None, node: str | None = None) -> None:
        """`kubectl annotate node NODE --overwrite KEY=VALUE` (None: `KEY-`)."""
        with self.lock:
            name = node or self.first
            ann = self.nodes[name]["metadata"].setdefault("annotations", {})
            if value is None:
                ann.pop(key, None)
            else:
                ann[key] = value
            self._bump(name)

    def annotate_all(self, key: str, value: str) -> None:
        """`kubectl annotate nodes -l ... KEY=VALUE`: one patch per node, in name order."""
        for name in sorted(self.nodes):
            self.annotate(key, value, name)

    def set_configmap(self, namespace: str, name: str, data: dict[str, str]) -> None:
        with self.lock:
            self.rv += 1
            self.configmaps[(namespace, name)] = {
                "kind": "ConfigMap",
                "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv),
                             "uid": f"cm-{self.rv}", "creationTimestamp": "2026-12-01T10:00:00Z"},
                "data": dict(data),
            }  # fmt: skip

    def heartbeat(self, node: str | None = None) -> None:
        with self.lock:
            name = node or self.first
            self.nodes[name]["status"]["conditions"][0]["lastHeartbeatTime"] = f"2026-12-01T10:{self.rv % 60:02d}:00Z"
            self._bump(name)

    def snapshot(self, node: str | None = None) -> dict:
        with self.lock:
            return copy.deepcopy(self.nodes[node or self.first])

    def condition(self, type_: str, node: str | None = None) -> dict | None:
        with self.lock:
            conds = self.nodes[node or self.first]["status"]["conditions"]
            return next((copy.deepcopy(c) for c in conds if c["type"] == type_), None)

    # -- serving -------------------------------------------------------------------------------

    def start(self) -> str:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                cluster.requests.append(("GET", self.path))
                parts = url.path.split("/")
                if url.path.startswith("/api/v1/nodes/") and len(parts) == 5:
                    if parts[4] in cluster.nodes:
                        return self._send(200, cluster.snapshot(parts[4]))
                    return self._send(404, status(404, "NotFound", f'nodes "{parts[4]}" not found',
                                                  {"name": parts[4], "kind": "nodes"}))  # fmt: skip
                if url.path == "/api/v1/nodes" and q.get("watch") == "true":
                    return self._watch(q)
                if url.path == "/api/v1/nodes":
                    with cluster.lock:
                        items = [copy.deepcopy(n) for name, n in sorted(cluster.nodes.items()) if _selected(q, name)]
                    return self._send(200, {"kind": "NodeList", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(cluster.rv)}, "items": items})  # fmt: skip
                if len(parts) == 7 and parts[:3] == ["", "api", "v1"] and parts[3] == "namespaces" and parts[5] == "configmaps":
                    with cluster.lock:
                        cm = copy.deepcopy(cluster.configmaps.get((parts[4], parts[6])))
                    if cm is None:
                        return self._send(404, status(404, "NotFound", f'configmaps "{parts[6]}" not found',
                                                      {"name": parts[6], "kind": "configmaps"}))  # fmt: skip
                    return self._send(200, cm)
                self._send(404, status(404, "NotFound", f"the server could not find {url.path}"))

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, q: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                since = int(q.get("resourceVersion") or cluster.rv)
                timeout = float(q.get("timeoutSeconds") or 5)
                with cluster.lock:
                    if cluster.expire_watches:
                        cluster.expire_watches -= 1
                        err = status(410, "Expired", f"too old resource version: {since} ({cluster.rv})")
                        self._chunk(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
                        self._chunk(b"")
                        return
                    if cluster.end_watches:
                        cluster.end_watches -= 1
                        self._chunk(b"")
                        return
                    deadline = timeout
                    while True:
                        for snap in cluster.history:
                            rv = int(snap["metadata"]["resourceVersion"])
                            if rv > since and _selected(q, snap["metadata"]["name"]):
                                self._chunk(json.dumps({"type": "MODIFIED", "object": snap}).encode() + b"\n")
                                since = rv
                        if deadline <= 0:
                            break
                        cluster.lock.wait(0.1)
                        deadline -= 0.1
                self._chunk(b"")

            def do_PATCH(self) -> None:
                url = urlsplit(self.path)
                body = self._body()
                ctype = self.headers.get("Content-Type", "")
                cluster.requests.append(("PATCH", self.path))
                parts = url.path.split("/")
                name = parts[4] if url.path.startswith("/api/v1/nodes/") else ""
                with cluster.lock:
                    cluster.patches.append((url.path, ctype, copy.deepcopy(body)))  # as sent: conditions below are merged by reference
                    if name not in cluster.nodes:
                        return self._send(404, status(404, "NotFound", url.path))
                    if url.path == f"/api/v1/nodes/{name}":
                        if ctype != "application/merge-patch+json":
                            return self._send(415, status(415, "UnsupportedMediaType", ctype))
                        node = cluster.nodes[name]
                        if cluster.conflicts:
                            cluster.conflicts -= 1
                            node["metadata"]["annotations"]["other-writer"] = str(cluster.rv)
                            cluster._bump(name)
                        want = (body.get("metadata") or {}).get("resourceVersion")
                        if want is not None and want != node["metadata"]["resourceVersion"]:
                            return self._send(409, status(
                                409, "Conflict",
                                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                                "please apply your changes to the latest version and try again",
                                {"name": name, "kind": "nodes"}))  # fmt: skip
                        patched = merge_patch(node, body)
                        patched["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
                        cluster.nodes[name] = patched
                        cluster._bump(name)
                        return self._send(200, copy.deepcopy(patched))
                    if url.path == f"/api/v1/nodes/{name}/status":
                        if ctype != "application/strategic-merge-patch+json":
                            return self._send(415, status(415, "UnsupportedMediaType", ctype))
                        conds = cluster.nodes[name]["status"]["conditions"]
                        for c in (body.get("status") or {}).get("conditions") or []:
                            old = next((o for o in conds if o["type"] == c["type"]), None)
                            if old is None:
                                conds.append(c)
                            else:
                                old.update(c)
                        cluster._bump(name)
                        return self._send(200, copy.deepcopy(cluster.nodes[name]))
                self._send(404, status(404, "NotFound", url.path))

            def _configmap_write(self, method: str, parts: list[str], body: dict) -> None:
                """POST .../configmaps (create: 409 AlreadyExists) and PUT .../configmaps/NAME
                (replace: 409 Conflict on a stale resourceVersion), as the API server answers."""
                ns = parts[4]
                name = parts[6] if method == "PUT" else (body.get("metadata") or {}).get("name", "")
                if ns in cluster.forbidden:
                    return self._send(403, status(
                        403, "Forbidden", f'configmaps is forbidden: User "system:serviceaccount:mokkafs:mokkafs-agent" '
                        f'cannot {"create" if method == "POST" else "update"} resource "configmaps" in API group "" '
                        f'in the namespace "{ns}"', {"kind": "configmaps"}))  # fmt: skip
                with cluster.lock:
                    old = cluster.configmaps.get((ns, name))
                    if method == "POST" and old is not None:
                        return self._send(409, status(409, "AlreadyExists", f'configmaps "{name}" already exists',
                                                      {"name": name, "kind": "configmaps"}))  # fmt: skip
                    if method == "PUT":
                        if old is None:
                            return self._send(404, status(404, "NotFound", f'configmaps "{name}" not found'))
                        if (body.get("metadata") or {}).get("resourceVersion") != old["metadata"]["resourceVersion"]:
                            return self._send(409, status(
                                409, "Conflict", f'Operation cannot be fulfilled on configmaps "{name}": the object '
                                "has been modified; please apply your changes to the latest version and try again",
                                {"name": name, "kind": "configmaps"}))  # fmt: skip
                    cluster.rv += 1
                    meta = {**body.get("metadata", {}), "namespace": ns, "resourceVersion": str(cluster.rv),
                            "uid": (old or {}).get("metadata", {}).get("uid", f"cm-{cluster.rv}"),
                            "creationTimestamp": "2026-12-01T10:00:00Z"}  # fmt: skip
                    cm = {"kind": "ConfigMap", "apiVersion": "v1", **body, "metadata": meta}
                    cluster.configmaps[(ns, name)] = cm
                    cluster.configmap_writes.append((method, ns, name))
                    return self._send(201 if method == "POST" else 200, copy.deepcopy(cm))

            def do_PUT(self) -> None:
                url = urlsplit(self.path)
                body = self._body()
                cluster.requests.append(("PUT", self.path))
                parts = url.path.split("/")
                if len(parts) == 7 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "configmaps":
                    return self._configmap_write("PUT", parts, body)
                self._send(404, status(404, "NotFound", url.path))

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                body = self._body()
                cluster.requests.append(("POST", self.path))
                parts = url.path.split("/")
                if len(parts) == 6 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "configmaps":
                    return self._configmap_write("POST", parts, body)
                if url.path.startswith("/api/v1/namespaces/") and url.path.endswith("/events"):
                    with cluster.lock:
                        body.setdefault("metadata", {})["uid"] = f"ev-{len(cluster.events)}"
                        body["metadata"]["resourceVersion"] = str(cluster.rv)
                        cluster.events.append(body)
                    return self._send(201, body)
                self._send(404, status(404, "NotFound", url.path))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
