"""`mokka agent`: the node's Kubernetes side. It mounts the simulated node, writes the CDI spec and
the NFD feature file, applies fault injections written as Node annotations, and reports GPU
health as a Node condition and Events. Decisions are pure functions; API calls are at the edge.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import yaml

from mokkafs.model import Event, InvalidCommand, Node, NodeConfig, commands, compose
from mokkafs.profiles import GpuProfile, ProfileError, load_profile

log = logging.getLogger(__name__)

ANNOTATION_INJECT = "mokkafs.io/inject"
ANNOTATION_APPLIED = "mokkafs.io/applied"
ANNOTATION_REJECTED = "mokkafs.io/rejected"
LABEL_PROFILE = "mokkafs.io/profile"
LABEL_GPUS = "mokkafs.io/gpus"
CONDITION_TYPE = "MokkaGPUHealthy"
COMPONENT = "mokkafs-agent"

DEFAULT_MOUNTPOINT = "/var/lib/mokkafs/root"
DEFAULT_STATE_DIR = "/var/lib/mokkafs/state"
DEFAULT_CDI_SPEC = "/var/run/cdi/nvidia.yaml"
DEFAULT_NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/mokkafs"

MAX_ANNOTATION = 1024  # bytes; an injection is a few short commands, not a script
MAX_COMMANDS = 16
MAX_GPUS = 64
CONFLICT_RETRIES = 5

# ---------------------------------------------------------------------------------------------
# The injection grammar (docs/kubernetes.md):
#
#   value    := command (";" command)*          one optional trailing newline
#   command  := target " " key "=" word (" " word)*
#   target   := "gpu=" INDEX | "node"
#
# This is the annotation's spelling of the command vocabulary (model/commands.py): `key` is a
# verb (xid, ecc, temperature, ..., reset; the node takes only `reset=1`) and the text after "="
# its arguments, exactly what is written to the verb's control file, so `gpu=1 ecc=dbe 2` writes
# "dbe 2" to gpu1/inject_ecc. Before anything is written, every command is parsed by the
# vocabulary, and the events they make are applied, in order, to a scratch Node composed like
# the mounted one (check_injection), so the model's own validation sees the node's limits
# (NVLinks, clocks, memory) and the state the earlier commands leave: a bad annotation changes
# nothing.

TARGETS = ("gpu", "node")  # InfiniBand ports are not (yet) reachable from an annotation


@dataclass(frozen=True)
class Command:
    """One control-file write, `payload` to `<mount>/<path>`: the vocabulary's `command`, and
    the annotation's `text` it was read from."""

    command: commands.Command
    text: str = field(compare=False)

    @property
    def path(self) -> str:
        return self.command.path

    @property
    def payload(self) -> bytes:
        return self.command.payload

    @property
    def event(self) -> Event:
        return self.command.event


def parse_command(text: str, gpu_count: int) -> Command:
    words = text.split(" ")
    if len(words) < 2 or "=" not in words[1]:
        raise InvalidCommand(f"{text!r}: expected 'gpu=N KEY=VALUE' or 'node reset=1'")
    (key, first) = words[1].split("=", 1)
    try:
        target = commands.parse_target(words[0], kinds=TARGETS, gpus=gpu_count)
        keys = commands.VERBS[target.kind]
        if key not in keys:
            raise InvalidCommand(f"unknown key {key!r}; known: {', '.join(sorted(keys))}")
        return Command(commands.command(target, key, " ".join([first, *words[2:]])), text)
    except InvalidCommand as e:
        raise InvalidCommand(f"{text!r}: {e}") from None


def check_injection(commands: tuple[Command, ...], config: NodeConfig) -> None:
    """Raise InvalidCommand, naming the command, unless every command fits the node `config`
    describes. The events are applied in order to a scratch Node (never the daemon's), with the
    model's own validation (Node.apply validates first), so each command is checked against the
    profile's limits and against the state the commands before it leave. The scratch node
    starts fresh: the live state's faults are not known here, and the model's checks do not
    depend on them; a refusal that does is the daemon's, at write time (Agent.act)."""
    scratch = Node(config, 0.0)
    for command in commands:
        try:
            scratch.apply(command.event, 0.0)
        except InvalidCommand as e:
            raise InvalidCommand(f"{command.text!r}: {e}") from None


def parse_injection(value: str, config: NodeConfig) -> tuple[Command, ...]:
    """The whole annotation, strictly: every command parses and fits the node `config`
    describes, or the annotation is rejected and nothing is written."""
    if len(value.encode("utf-8", "replace")) > MAX_ANNOTATION:
        raise InvalidCommand(f"annotation longer than {MAX_ANNOTATION} bytes")
    if value.endswith("\n"):
        value = value[:-1]
    if not re.fullmatch(r"[ -~]+", value):
        raise InvalidCommand("empty annotation, or not printable ASCII on one line")
    pieces = value.split(";")
    if len(pieces) > MAX_COMMANDS:
        raise InvalidCommand(f"more than {MAX_COMMANDS} commands")
    commands = []
    for piece in pieces:
        text = piece.strip()
        if not text:
            raise InvalidCommand("empty command (a stray ';'?)")
        if "  " in text:
            raise InvalidCommand(f"{text!r}: stray whitespace")
        commands.append(parse_command(text, config.gpus))
    check_injection(tuple(commands), config)
    return tuple(commands)


# ---------------------------------------------------------------------------------------------
# Reconcile decisions: (node object, GPU count) -> what to do. No I/O.


@dataclass(frozen=True)
class Apply:
    value: str
    commands: tuple[Command, ...]
    resource_version: str


@dataclass(frozen=True)
class Reject:
    value: str
    reason: str
    resource_version: str


def decide(node: dict, config: NodeConfig | ProfileError) -> Apply | Reject | None:
    """`config`: the mounted node's composition, or why it could not be had (a profile this
    install cannot load); then an annotation is rejected, as its limits cannot be checked."""
    meta = node.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_INJECT)
    if value is None:
        return None
    rv = meta.get("resourceVersion", "")
    if not isinstance(value, str):
        return Reject(str(value), "annotation value is not a string", rv)
    if isinstance(config, ProfileError):
        return Reject(value, f"cannot check it against the node's limits: {config}", rv)
    try:
        return Apply(value, parse_injection(value, config), rv)
    except InvalidCommand as e:
        return Reject(value, str(e), rv)


def partial_failure(action: Apply, failed: int, error: str) -> str:
    """What an Event says when the daemon refused `action.commands[failed]` after the checks
    passed (the node changed in between): which commands were applied and which were not."""
    done, rest = action.commands[:failed], action.commands[failed:]
    quoted = lambda cs: ", ".join(repr(c.text) for c in cs) or "none"  # noqa: E731
    refused = action.commands[failed]
    return (
        f"{refused.path} refused {refused.text!r}: {error}; "
        f"applied: {quoted(done)}; not applied: {quoted(rest)}"
    )


def failure_patch(action: Apply, failed: int, message: str, now: str) -> dict:
    """The merge patch that corrects the claim's record after a partial failure: `applied` names
    only the commands written (or goes), `rejected` says what was not and why."""
    done = "; ".join(c.text for c in action.commands[:failed])
    return {
        "metadata": {
            "annotations": {
                ANNOTATION_APPLIED: f"{now} {done}" if done else None,
                ANNOTATION_REJECTED: f"{now} {action.value}: {message}",
            }
        }
    }


def claim_patch(action: Apply | Reject, now: str) -> dict:
    """The merge patch that takes the annotation off the node (so it is acted on once) and
    records the outcome. `resourceVersion` makes it conditional: a node changed since we read it
    answers 409, and we decide again from a fresh read."""
    if isinstance(action, Apply):
        record = {ANNOTATION_APPLIED: f"{now} {action.value}", ANNOTATION_REJECTED: None}
    else:
        record = {ANNOTATION_REJECTED: f"{now} {action.value}: {action.reason}"}
    return {
        "metadata": {
            "resourceVersion": action.resource_version,
            "annotations": {ANNOTATION_INJECT: None, **record},
        }
    }


@dataclass(frozen=True)
class GpuHealth:
    index: int
    health: str  # healthy | degraded | unhealthy | lost (Node.health)
    faults: str


def parse_info(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def health_condition(gpus: list[GpuHealth], previous: dict | None, now: str) -> dict | None:
    """The MokkaGPUHealthy condition for these readings, or None when `previous` already says
    it (no write, no churn). Lost or unhealthy GPUs make it False; degraded ones are named."""
    bad = [g for g in gpus if g.health in ("lost", "unhealthy")]
    noted = [g for g in gpus if g.health != "healthy"]
    status = "False" if bad else "True"
    reason = "GPUsUnhealthy" if bad else ("GPUsDegraded" if noted else "GPUsHealthy")
    if noted:
        message = "; ".join(f"gpu{g.index} {g.health} ({g.faults})" for g in noted)
    else:
        message = f"all {len(gpus)} GPUs healthy"
    if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == (
        status,
        reason,
        message,
    ):
        return None
    transition = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition or now,
    }


def current_condition(node: dict) -> dict | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION_TYPE:
            return c
    return None


def node_event(node: dict, event_type: str, reason: str, message: str, now: str, seq: int) -> dict:
    """A core/v1 Event about the Node, as the kubelet writes them (namespace `default`), so
    `kubectl describe node` shows it."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.mokkafs.{int(time.time() * 1000):x}.{seq}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid", name)},
        "type": event_type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT, "host": name},
        "reportingComponent": COMPONENT,
        "reportingInstance": name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def node_settings(node: dict, env_profile: str | None, env_gpus: str | None) -> tuple[str, int | None]:
    """Profile and GPU count: the Node's labels win over the ConfigMap (environment)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    profile = labels.get(LABEL_PROFILE) or env_profile or "h100"
    gpus_text = labels.get(LABEL_GPUS) or env_gpus or ""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", profile):
        raise ValueError(f"bad profile {profile!r} (label {LABEL_PROFILE} or MOKKA_PROFILE)")
    if gpus_text == "":
        return profile, None
    if not re.fullmatch(r"[1-9][0-9]{0,1}", gpus_text) or int(gpus_text) > MAX_GPUS:
        raise ValueError(f"bad GPU count {gpus_text!r} (label {LABEL_GPUS} or MOKKA_GPUS): 1..{MAX_GPUS}")
    return profile, int(gpus_text)


# ---------------------------------------------------------------------------------------------
# Files for the node's other consumers: a CDI spec for container runtimes, an NFD feature file.

CDI_VERSION = "0.5.0"  # what nvidia-ctk writes when device nodes carry a hostPath


@dataclass(frozen=True)
class GpuDevice:
    index: int
    minor: int
    uuid: str


class _IndentedDumper(yaml.SafeDumper):
    """Sequences indented under their key, as Go's yaml.v3 (and so nvidia-ctk) writes them
    (nvidia-ctk indents by 4; this by 2, the same document)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data):  # devices share their edits; a spec has no YAML anchors
        return True


def _lib_dir(machine: str) -> str:
    return {"aarch64": "/usr/lib/aarch64-linux-gnu", "arm64": "/usr/lib/aarch64-linux-gnu"}.get(
        machine, "/usr/lib/x86_64-linux-gnu"
    )


CDI_STATE_DIR = "/run/mokka"  # where a CDI container sees the state directory (read-only)


def cdi_spec(mount: str, state_file: str, gpus: list[GpuDevice], driver_files: list[str], machine: str) -> str:
    """nvidia.com/gpu devices named by index and UUID (nvidia-ctk's default `index,uuid`
    strategy) and `all`. Device nodes come from the mount's dev/ (the runtime reads type, major
    and minor from hostPath); the driver files present in `<mount>/driver` and the state file's
    directory are bind-mounted, so `nvidia-smi`, NVML and CUDA work in the container without the
    NVIDIA runtime. The directory, not the file: CUDA processes reach the process table and its
    descriptor socket beside the state file, and survive the daemon replacing either."""
    dev = f"{mount}/dev"

    def node(name: str) -> dict:
        return {"path": f"/dev/{name}", "hostPath": f"{dev}/{name}"}

    devices = []
    for g in gpus:
        edits = {"deviceNodes": [node(f"nvidia{g.minor}")]}
        devices.append({"name": str(g.index), "containerEdits": edits})
        devices.append({"name": g.uuid, "containerEdits": edits})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(f"nvidia{g.minor}") for g in gpus]}})
    state_dir, state_name = os.path.split(state_file)
    mounts = [{"hostPath": state_dir, "containerPath": CDI_STATE_DIR, "options": ["ro", "nosuid", "nodev", "bind"]}]
    for rel in driver_files:  # e.g. usr/lib64/libnvidia-ml.so.1, usr/bin/nvidia-smi
        name = rel.rsplit("/", 1)[-1]
        target = f"/usr/bin/{name}" if "/bin/" in f"/{rel}" else f"{_lib_dir(machine)}/{name}"
        mounts.append(
            {"hostPath": f"{mount}/driver/{rel}", "containerPath": target, "options": ["ro", "nosuid", "nodev", "bind"]}
        )
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"MOKKA_STATE={CDI_STATE_DIR}/{state_name}"],
            "deviceNodes": [node("nvidiactl"), node("nvidia-uvm"), node("nvidia-uvm-tools")],
            "mounts": mounts,
        },
    }
    body = yaml.dump(spec, Dumper=_IndentedDumper, indent=2, sort_keys=False, default_flow_style=False)
    return "---\n" + body


def nfd_features(profile: str, gpu_count: int, driver_version: str) -> str:
    """NFD's local source reads `name=value` lines from features.d/. Un-prefixed names become
    feature.node.kubernetes.io/<name>; pci-10de.present is what the GPU Operator and the device
    plugin's chart select on. nvidia.com/ names need NFD's extraLabelNs to include nvidia.com."""
    lines = [
        "pci-10de.present=true",
        "nvidia.com/gpu.present=true",
        f"mokkafs.profile={profile}",
        f"mokkafs.gpus={gpu_count}",
        f"mokkafs.driver-version={driver_version}",
    ]
    return "".join(f"{line}\n" for line in lines)


DRIVER_FILES = (
    "usr/lib64/libnvidia-ml.so.1",
    "usr/lib64/libcuda.so.1",
    "usr/bin/nvidia-smi",
)


def write_atomically(path: str, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


# ---------------------------------------------------------------------------------------------
# The tree (a mounted node) as the agent sees it.


class MountedTree:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def gpu_count(self) -> int:
        return int(self.read("node/gpu_count"))

    def node_config(self) -> NodeConfig:
        """The mounted node's composition as far as an injection's limits depend on it: its
        profile (by the name in node/profile) and GPU count. Raises ProfileError for a profile
        this install cannot load (the daemon was given a profile file the agent does not have)."""
        profile = _profile(self.read("node/profile").strip())
        return compose(profile, gpus=self.gpu_count(), hostname="scratch")

    def healths(self) -> list[GpuHealth]:
        out = []
        for i in range(self.gpu_count()):
            info = parse_info(self.read(f"gpu{i}/info"))
            out.append(GpuHealth(i, info.get("health", "unknown"), info.get("faults", "none")))
        return out

    def devices(self) -> list[GpuDevice]:
        out = []
        for i in range(self.gpu_count()):
            info = parse_info(self.read(f"gpu{i}/info"))
            out.append(GpuDevice(i, int(info["minor"]), info["uuid"]))
        return out

    def write(self, command: Command) -> None:
        """One write() per command, as `echo` does; a refusal comes back as OSError (EINVAL)."""
        fd = os.open(self.root / command.path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, command.payload + b"\n")
        finally:
            os.close(fd)

    def driver_files(self) -> list[str]:
        return [rel for rel in DRIVER_FILES if (self.root / "driver" / rel).exists()]


@lru_cache(maxsize=8)
def _profile(name: str) -> GpuProfile:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", name):
        raise ProfileError(f"profile {name!r} is not a shipped profile's name")
    return load_profile(name)


def write_node_files(tree: MountedTree, state_dir: str, cdi_path: str | None, nfd_path: str | None) -> None:
    if cdi_path:
        state_file = os.path.join(os.path.abspath(state_dir), "state")
        spec = cdi_spec(str(tree.root), state_file, tree.devices(), tree.driver_files(), platform.machine())
        write_atomically(cdi_path, spec)
        log.info("wrote CDI spec %s", cdi_path)
    if nfd_path:
        profile = tree.read("node/profile").strip()
        driver = tree.read("node/driver_version").strip()
        write_atomically(nfd_path, nfd_features(profile, tree.gpu_count(), driver))
        log.info("wrote NFD feature file %s", nfd_path)


# ---------------------------------------------------------------------------------------------
# The API edge.


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Agent:
    """Watches one Node; applies its injections exactly once; keeps its condition true."""

    def __init__(self, api, node_name: str, tree: MountedTree, resync_s: float = 30.0) -> None:
        self.api = api  # kubernetes.client.CoreV1Api
        self.node_name = node_name
        self.tree = tree
        self.resync_s = resync_s
        self._seq = 0
        self.stopping = False

    # -- reads ---------------------------------------------------------------------------------

    def get_node(self) -> dict:
        resp = self.api.read_node(self.node_name, _preload_content=False)
        return json.loads(resp.data)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """List (GET), reconcile, watch from that resourceVersion; a watch that ends or drops
        is resumed, a 410 Gone lists again. Returns when `stopping` is set."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        rv = None
        backoff = 0.5
        while not self.stopping:
            try:
                if rv is None:
                    node = self.get_node()
                    self.reconcile(node)
                    rv = node["metadata"]["resourceVersion"]
                rv = self.watch(rv)
                self.report_health(self.get_node())
                backoff = 0.5
            except Gone:
                log.info("watch: resourceVersion %s is gone; listing again", rv)
                rv = None
            except (ApiException, HTTPError, OSError, ValueError, KeyError) as e:
                log.warning("API: %s; retrying in %.1fs", _short(e), backoff)
                rv = None
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def watch(self, rv: str) -> str:
        """One watch request; reconciles each event; returns the last resourceVersion seen."""
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.api.list_node(
            field_selector=f"metadata.name={self.node_name}",
            watch=True,
            resource_version=rv,
            timeout_seconds=max(1, int(self.resync_s)),
            _preload_content=False,
            _request_timeout=self.resync_s + 30,
        )
        try:
            for line in iter_resp_lines(resp):
                if self.stopping:
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self.reconcile(obj)
                    rv = obj["metadata"]["resourceVersion"]
                elif event.get("type") == "BOOKMARK":
                    rv = obj["metadata"]["resourceVersion"]
        finally:
            resp.close()
            resp.release_conn()
        return rv

    # -- one reconcile -------------------------------------------------------------------------

    def reconcile(self, node: dict) -> None:
        from kubernetes.client.rest import ApiException

        for _ in range(CONFLICT_RETRIES):
            try:
                config: NodeConfig | ProfileError = self.tree.node_config()
            except ProfileError as e:
                config = e
            action = decide(node, config)
            if action is None:
                break
            try:
                self.api.patch_node(
                    self.node_name,
                    claim_patch(action, utc_now()),
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            except ApiException as e:
                if e.status != 409:
                    raise
                log.info("%s: conflict on resourceVersion %s; reading the node again", self.node_name, action.resource_version)
                node = self.get_node()
                continue
            self.act(node, action)
            node = self.get_node()
            break
        else:
            log.warning("%s: %d conflicts in a row; trying again on the next event", self.node_name, CONFLICT_RETRIES)
        self.report_health(node)

    def act(self, node: dict, action: Apply | Reject) -> None:
        """After the claim: write the commands (applied exactly once) and say so in an Event."""
        if isinstance(action, Reject):
            log.warning("%s: rejected %s=%r: %s", self.node_name, ANNOTATION_INJECT, action.value, action.reason)
            self.event(node, "Warning", "InjectionRejected", f"{action.value!r}: {action.reason}")
            return
        for k, command in enumerate(action.commands):
            try:
                self.tree.write(command)
            except OSError as e:
                # Checked already, so the node changed in between (a remount with another
                # profile, a dead mount): say exactly what was applied and what was not.
                message = partial_failure(action, k, e.strerror or str(e))
                log.warning("%s: %s=%r partly applied: %s", self.node_name, ANNOTATION_INJECT, action.value, message)
                self.event(node, "Warning", "InjectionFailed", f"{action.value!r}: {message}")
                self.correct_record(failure_patch(action, k, message, utc_now()))
                return
        log.info("%s: applied %r", self.node_name, action.value)
        self.event(node, "Normal", "InjectionApplied", action.value)

    def correct_record(self, patch: dict) -> None:
        """An unconditional merge patch of the outcome annotations (the claim already took the
        injection off the node); losing it must not stop the agent, the Event says it too."""
        from kubernetes.client.rest import ApiException

        try:
            self.api.patch_node(
                self.node_name, patch, _content_type="application/merge-patch+json", _preload_content=False
            )
        except ApiException as e:
            log.warning("%s: could not correct %s: %s", self.node_name, ANNOTATION_APPLIED, _short(e))

    def report_health(self, node: dict) -> None:
        condition = health_condition(self.tree.healths(), current_condition(node), utc_now())
        if condition is None:
            return
        # Strategic merge patch: conditions merge by type, the kubelet's own stay untouched.
        self.api.patch_node_status(
            self.node_name,
            {"status": {"conditions": [condition]}},
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )
        log.info("%s: %s=%s (%s)", self.node_name, CONDITION_TYPE, condition["status"], condition["message"])

    def event(self, node: dict, event_type: str, reason: str, message: str) -> None:
        from kubernetes.client.rest import ApiException

        self._seq += 1
        body = node_event(node, event_type, reason, message, utc_now(), self._seq)
        try:
            from kubernetes.client import CoreV1Event

            # Pydantic-era clients (>= 35) take a model; older ones take the dict.
            model = CoreV1Event.from_dict(body) if hasattr(CoreV1Event, "from_dict") else body
            self.api.create_namespaced_event(body["metadata"]["namespace"], model, _preload_content=False)
        except ApiException as e:  # an Event is a report; losing one must not stop the agent
            log.warning("%s: could not record event %s: %s", self.node_name, reason, _short(e))


def _short(e: Exception) -> str:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    return f"{status} {reason}" if status else str(e).splitlines()[0] if str(e) else type(e).__name__


# ---------------------------------------------------------------------------------------------
# `mokka agent`


def kube_api(kubeconfig: str | None):
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return client.CoreV1Api()


class _Stop(Exception):
    pass


def main(args) -> int:
    """Entry point of `mokka agent` (arguments from mokkafs.cli)."""
    node_name = args.node_name or os.environ.get("NODE_NAME")
    if not node_name:
        print("mokka: agent: --node-name or NODE_NAME is required", file=sys.stderr)
        return 2
    api = kube_api(args.kubeconfig)
    node = json.loads(api.read_node(node_name, _preload_content=False).data)
    try:
        profile, gpus = node_settings(node, args.profile or os.environ.get("MOKKA_PROFILE"), args.gpus or os.environ.get("MOKKA_GPUS"))
    except ValueError as e:
        print(f"mokka: agent: {e}", file=sys.stderr)
        return 2
    mounted_here = False
    if not args.no_mount:
        cmd = [sys.executable, "-m", "mokkafs.cli", "mount", args.mountpoint, "--profile", profile,
               "--state-dir", args.state_dir, "--hostname", node_name]  # fmt: skip
        if gpus is not None:
            cmd += ["--gpus", str(gpus)]
        if args.kmsg:
            cmd.append("--kmsg")
        res = subprocess.run(cmd)
        if res.returncode != 0:
            return res.returncode
        mounted_here = True
    tree = MountedTree(args.mountpoint)
    agent = Agent(api, node_name, tree, resync_s=args.resync)

    def stop(signum, frame):
        agent.stopping = True
        raise _Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        write_node_files(tree, args.state_dir, args.cdi_spec or None, args.nfd_features or None)
        agent.run()
    except _Stop:
        log.info("signal: stopping")
    finally:
        if mounted_here:
            subprocess.run([sys.executable, "-m", "mokkafs.cli", "umount", args.mountpoint])
    return 0
