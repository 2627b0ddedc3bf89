"""`mokka agent`'s edge: the mounted node it reads and writes, the CDI spec and NFD feature file
it writes, and the Kubernetes API it watches. It mounts the simulated node, applies the fault
injections and starts the scenarios written as Node annotations, and reports GPU health and the
scenario's progress as Node conditions and Events; what to do is decided by the pure `grammar`
and `decisions`, and this module only acts on it.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from mokkafs.agent.decisions import (
    ANNOTATION_APPLIED,
    ANNOTATION_INJECT,
    ANNOTATION_SCENARIO,
    REASON_NODE_CHANGED,
    REASON_NODE_REFUSED,
    SCENARIO_CONDITION,
    Apply,
    GpuHealth,
    Reject,
    RejectScenario,
    StartScenario,
    StopScenario,
    claim_patch,
    current_condition,
    decide,
    decide_scenario,
    failure_patch,
    health_condition,
    injection,
    node_changed,
    node_composition,
    node_event,
    node_settings,
    parse_info,
    partial_failure,
    said_once,
    scenario_annotation,
    scenario_claim_patch,
    scenario_condition,
    scenario_failure_patch,
)
from mokkafs.agent import fgo
from mokkafs.agent.grammar import Command, ScenarioRequest, StopRequest, parse_scenario
from mokkafs.agent.node_files import DRIVER_FILES, GpuDevice, cdi_spec, nfd_features
from mokkafs.model import InvalidCommand, NodeConfig, compose
from mokkafs.model.schema import GpuProfile, ProfileError
from mokkafs.model.profiles import load_profile
from mokkafs.render.native import CDI_HOOK

log = logging.getLogger(__name__)

DEFAULT_MOUNTPOINT = "/var/lib/mokkafs/root"
DEFAULT_STATE_DIR = "/var/lib/mokkafs/state"
DEFAULT_CDI_SPEC = "/var/run/cdi/nvidia.yaml"
DEFAULT_NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d/mokkafs"
DEFAULT_NAMESPACE = "mokkafs"  # where scenario ConfigMaps are read (POD_NAMESPACE in the DaemonSet)

CONFLICT_RETRIES = 5


def write_atomically(path: str, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


# ---------------------------------------------------------------------------------------------
# The tree (a mounted node) as the agent sees it.


class MountedTree:
    def __init__(self, root: str, composition: str | None = None, state_dir: str | None = None) -> None:
        self.root = Path(root)
        self.composition = composition  # the node composition it was mounted with; None: the profile's
        # The daemon's state directory as this process reaches it, where it is known (the agent
        # mounted the node); None: through the tree's driver/run/mokka, which names it as the
        # host sees it, and so fits only where host and agent see one path.
        self.state_dir = state_dir
        self._config: tuple[tuple[int, int], NodeConfig] | None = None  # (the mount's identity, its node)

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def gpu_count(self) -> int:
        return int(self.read("node/gpu_count"))

    def node_config(self) -> NodeConfig:
        """The mounted node's composition as far as an injection's limits depend on it: its
        profile (by the name in node/profile), composition (HCA count) and GPU count. Raises
        ProfileError for a profile or composition this install cannot load (the daemon was given
        a file the agent does not have)."""
        # A mount's profile and GPU count never change in its daemon's life: read once per
        # daemon, named by the mount root's device and mount time (its mtime), which a stat
        # gets in a fraction of the two reads (a remount, with another profile or not, is read
        # afresh). Every watch event with an annotation asks.
        st = os.stat(self.root)
        mount = (st.st_dev, st.st_mtime_ns)
        if self._config is None or self._config[0] != mount:
            config = _scratch_config(self.read("node/profile").strip(), self.composition, self.gpu_count())
            self._config = (mount, config)
        return self._config[1]

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
        """One write() per command, as `echo` does; a refusal comes back as OSError (EINVAL).
        A setting goes to the control socket beside the node's state file (driver/run/mokka),
        whose refusal comes back as OSError too."""
        if command.path is None:
            from mokkafs.cli.control_client import send
            from mokkafs.daemon.control_protocol import control_path

            state_dir = Path(self.state_dir) if self.state_dir else self.root / "driver" / "run" / "mokka"
            reply = send(control_path(state_dir / "state"), str(command.command))
            if not reply.ok:
                raise OSError(errno.EINVAL, str(reply))
            return
        fd = os.open(self.root / command.path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, command.payload + b"\n")
        finally:
            os.close(fd)

    def write_scenario(self, request: bytes) -> None:
        """One write() to node/scenario: a scenario to run, or `stop`; a refusal is OSError."""
        fd = os.open(self.root / "node" / "scenario", os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, request)
        finally:
            os.close(fd)

    def driver_files(self) -> list[str]:
        return [rel for rel in DRIVER_FILES if (self.root / "driver" / rel).exists()]

    def mig_monitor_node(self) -> str | None:
        """The MIG monitor capability's device node under dev/ (`nvidia-caps/nvidia-cap2`, its minor
        from mig-minors' `monitor` line), or None on a board without MIG."""
        try:
            minors = self.read("proc/driver/nvidia-caps/mig-minors")
        except OSError:
            return None
        for line in minors.splitlines():
            name, _, minor = line.partition(" ")
            if name == "monitor" and minor.isdigit():
                rel = f"nvidia-caps/nvidia-cap{int(minor)}"
                return rel if (self.root / "dev" / rel).exists() else None
        return None

    def has_cdi_hook(self) -> bool:
        """The driver root serves mokka-cdi-hook and the tree has proc/driver and proc/devices for it
        to bind."""
        return ((self.root / "driver/usr/bin" / CDI_HOOK).is_file() and (self.root / "proc/driver").is_dir()
                and (self.root / "proc/devices").is_file())

    def fgo_devices(self) -> list[fgo.FgoDevice]:
        out = []
        for i in range(self.gpu_count()):
            info = parse_info(self.read(f"gpu{i}/info"))
            out.append(fgo.FgoDevice(i, int(info["minor"]), info["bus_id"], int(info["numa_node"])))
        return out

    def fgo_configmap(self, namespace: str) -> dict:
        """The node's profile as fake-gpu-operator's GPU-profile ConfigMap (mokkafs/agent/fgo.py).
        ProfileError for a profile this install does not ship (a mounted profile file)."""
        profile = _profile(self.read("node/profile").strip())
        return fgo.configmap(profile, self.fgo_devices(), self.read("node/driver_version").strip(),
                             self.read("node/cuda_version").strip(), namespace)


@lru_cache(maxsize=8)
def _profile(name: str) -> GpuProfile:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", name):
        raise ProfileError(f"profile {name!r} is not a shipped profile's name")
    return load_profile(name)


@lru_cache(maxsize=8)
def _scratch_config(profile: str, composition: str | None, gpus: int) -> NodeConfig:
    """A node composed as the mounted one is, for checks (NodeConfig is frozen: shared safely)."""
    return compose(_profile(profile), node=composition, gpus=gpus, hostname="scratch")


def write_node_files(tree: MountedTree, host_mountpoint: str, host_state_dir: str, cdi_path: str | None,
                     nfd_path: str | None) -> None:
    """The CDI spec names the mount and the state directory as the host sees them: the
    container runtime reads its hostPaths on the host."""
    if cdi_path:
        state_file = os.path.join(host_state_dir, "state")
        spec = cdi_spec(host_mountpoint, state_file, tree.devices(), tree.driver_files(), platform.machine(),
                        proc_hook=tree.has_cdi_hook(), mig_monitor=tree.mig_monitor_node())
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

    def __init__(
        self, api, node_name: str, tree: MountedTree, resync_s: float = 30.0, namespace: str = DEFAULT_NAMESPACE,
        fgo_namespace: str | None = None,
    ) -> None:
        self.api = api  # kubernetes.client.CoreV1Api
        self.node_name = node_name
        self.tree = tree
        self.resync_s = resync_s
        self.namespace = namespace  # scenario ConfigMaps are read here, nowhere else
        self.fgo_namespace = fgo_namespace  # where fake-gpu-operator reads GPU profiles; None: not published
        self.fgo_published: str | None = None  # created / replaced / unchanged, once published
        self._scenario_condition: dict | None = None  # the MokkaScenario condition last written
        self._health_condition: dict | None = None  # the MokkaGPUHealthy condition last written
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
            self.publish_fgo_profile()
            try:
                if rv is None:
                    node = self.get_node()
                    self.reconcile(node)
                    rv = node["metadata"]["resourceVersion"]
                rv = self.watch(rv)
                self.report_health(self.get_node(), fresh=True)
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
        node = self.reconcile_injection(node)
        node = self.reconcile_scenario(node)
        self.report_health(node)

    def reconcile_injection(self, node: dict) -> dict:
        """Act on `mokkafs.io/inject`; returns the Node as last read."""
        from kubernetes.client.rest import ApiException

        for _ in range(CONFLICT_RETRIES):
            if injection(node) is None:
                break  # most events: the mounted node's limits are not needed
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
        return node

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

    # -- scenarios -----------------------------------------------------------------------------

    def reconcile_scenario(self, node: dict) -> dict:
        """Act on `mokkafs.io/scenario` exactly once (claimed as an injection is); returns the
        Node as last read."""
        from kubernetes.client.rest import ApiException

        for _ in range(CONFLICT_RETRIES):
            found = scenario_annotation(node)
            if found is None:
                return node
            action = self.scenario_action(*found)
            try:
                self.api.patch_node(
                    self.node_name,
                    scenario_claim_patch(action, utc_now()),
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            except ApiException as e:
                if e.status != 409:
                    raise
                node = self.get_node()
                continue
            self.act_scenario(node, action)
            return self.get_node()
        log.warning("%s: %d conflicts in a row; trying again on the next event", self.node_name, CONFLICT_RETRIES)
        return node

    def scenario_action(self, value: str, rv: str) -> StartScenario | StopScenario | RejectScenario:
        """Parse, fetch and check the whole scenario before anything is written."""
        try:
            request = parse_scenario(value)
            if isinstance(request, StopRequest):
                return StopScenario(value, rv)
            text, where = self.scenario_text(request)
            config = self.tree.node_config()
        except InvalidCommand as e:
            return RejectScenario(value, said_once(value, str(e)), rv)
        except ProfileError as e:
            return RejectScenario(value, f"cannot check it against the node's limits: {e}", rv)
        return decide_scenario(request, text, where, config, self.tree.read("node/scenario"), time.time(), rv)

    def scenario_text(self, request: ScenarioRequest) -> tuple[str | bytes, str]:
        """The scenario's YAML and the name its errors give it: a shipped file, or a ConfigMap's
        key in the agent's namespace. What cannot be had is InvalidCommand (the reason)."""
        from kubernetes.client.rest import ApiException

        if request.name is not None:
            from mokkafs.daemon.scenario_runner import shipped_scenarios

            path = shipped_scenarios().get(request.name)
            if path is None:
                raise InvalidCommand(f"no shipped scenario {request.name!r} (mokka scenario list)")
            return path.read_bytes(), path.name
        where = f"configmap {self.namespace}/{request.configmap}"
        try:
            resp = self.api.read_namespaced_config_map(request.configmap, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status in (403, 404):
                raise InvalidCommand(f"{where}: {'not found' if e.status == 404 else 'forbidden'}") from None
            raise
        data = json.loads(resp.data).get("data") or {}
        if request.key not in data:
            raise InvalidCommand(f"{where} has no key {request.key!r} (keys: {', '.join(sorted(data)) or 'none'})")
        return data[request.key], request.key

    def act_scenario(self, node: dict, action: StartScenario | StopScenario | RejectScenario) -> None:
        if isinstance(action, RejectScenario):
            log.warning("%s: rejected %s=%r: %s", self.node_name, ANNOTATION_SCENARIO, action.value, action.reason)
            self.event(node, "Warning", "ScenarioRejected", f"{action.value!r}: {action.reason}")
            return
        try:
            self.tree.write_scenario(b"stop\n" if isinstance(action, StopScenario) else action.request)
        except OSError as e:
            # Checked already: the node changed in between (a scenario started meanwhile, a
            # remount). Nothing of it was applied; say so and correct the record.
            message = f"node/scenario refused it: {e.strerror or e}"
            log.warning("%s: %s=%r: %s", self.node_name, ANNOTATION_SCENARIO, action.value, message)
            self.event(node, "Warning", "ScenarioFailed", f"{action.value!r}: {message}")
            if isinstance(action, StartScenario):
                self.correct_record(scenario_failure_patch(action, message, utc_now()))
            return
        if isinstance(action, StartScenario):
            log.info("%s: scenario %s", self.node_name, action.summary)
            self.event(node, "Normal", "ScenarioStarted", action.summary)
        else:
            log.info("%s: scenario stop written", self.node_name)

    # -- the profile for fake-gpu-operator ------------------------------------------------------

    def publish_fgo_profile(self) -> None:
        """Create (or bring up to date) the node's GPU-profile ConfigMap in fake-gpu-operator's
        namespace, once; a failure (no RBAC there, an unshipped profile) is logged and tried again
        on the next pass of the loop, and never stops the agent."""
        from kubernetes.client.rest import ApiException

        if self.fgo_namespace is None or self.fgo_published is not None:
            return
        try:
            cm = self.tree.fgo_configmap(self.fgo_namespace)
        except (ProfileError, OSError, KeyError, ValueError) as e:
            log.warning("%s: no fake-gpu-operator profile: %s", self.node_name, e)
            self.fgo_published = "skipped"
            return
        name, ns = cm["metadata"]["name"], self.fgo_namespace
        try:
            self.fgo_published = self._put_configmap(cm)
        except ApiException as e:
            log.warning("%s: could not publish configmap %s/%s for fake-gpu-operator: %s", self.node_name, ns, name, _short(e))
            return
        log.info("%s: configmap %s/%s for fake-gpu-operator %s", self.node_name, ns, name, self.fgo_published)

    def _put_configmap(self, cm: dict) -> str:
        """Create, or replace what differs (with the resourceVersion read, so a concurrent writer
        makes it read again); nodes of one profile write the same content, so mostly 'unchanged'."""
        from kubernetes.client import V1ConfigMap
        from kubernetes.client.rest import ApiException

        def model(body: dict):
            return V1ConfigMap.from_dict(body) if hasattr(V1ConfigMap, "from_dict") else body

        name, ns = cm["metadata"]["name"], cm["metadata"]["namespace"]
        try:
            self.api.create_namespaced_config_map(ns, model(cm), _preload_content=False)
            return "created"
        except ApiException as e:
            if e.status != 409:
                raise
        for _ in range(CONFLICT_RETRIES):
            current = json.loads(self.api.read_namespaced_config_map(name, ns, _preload_content=False).data)
            if fgo.same_content(current, cm):
                return "unchanged"
            labels = {**(current["metadata"].get("labels") or {}), **cm["metadata"]["labels"]}
            body = {**cm, "metadata": {**cm["metadata"], "labels": labels,
                                       "resourceVersion": current["metadata"]["resourceVersion"]}}
            try:
                self.api.replace_namespaced_config_map(name, ns, model(body), _preload_content=False)
                return "replaced"
            except ApiException as e:
                if e.status != 409:
                    raise
        raise ApiException(status=409, reason=f"{CONFLICT_RETRIES} conflicts in a row")

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

    def report_health(self, node: dict, fresh: bool = False) -> None:
        """The MokkaGPUHealthy and MokkaScenario conditions, written when they change, and the
        Event of a scenario that has ended since the last report. `fresh`: `node` was just read
        (GET), not taken from a watch event."""
        now = utc_now()
        # The agent alone writes these conditions: what it wrote last is newer than a Node read
        # from a watch event that may predate it (the event of its own claim, say), which would
        # write the condition again or announce an ending twice. A fresh read is newer still, so
        # a condition someone removed is written again at the next resync.
        known = None if fresh else self._health_condition
        health = health_condition(self.tree.healths(), known or current_condition(node), now)
        previous = self._scenario_condition or current_condition(node, SCENARIO_CONDITION)
        scenario, ended = scenario_condition(self.tree.read("node/scenario"), previous, now)
        changed = [c for c in (health, scenario) if c is not None]
        if not changed:
            return
        # Strategic merge patch: conditions merge by type, the kubelet's own stay untouched.
        self.api.patch_node_status(
            self.node_name,
            {"status": {"conditions": changed}},
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )
        if scenario is not None:
            self._scenario_condition = scenario
        if health is not None:
            self._health_condition = health
        for c in changed:
            log.info("%s: %s=%s (%s)", self.node_name, c["type"], c["status"], c["message"])
        if ended is not None:
            self.event(node, *ended)

    def event(self, node: dict, event_type: str, reason: str, message: str) -> None:
        self._seq += 1
        post_event(self.api, node, event_type, reason, message, self._seq)


def post_event(api, node: dict, event_type: str, reason: str, message: str, seq: int = 0) -> None:
    """An Event about the Node (decisions.node_event); one the API refuses is logged, never raised."""
    from kubernetes.client.rest import ApiException

    body = node_event(node, event_type, reason, message, utc_now(), seq, time.time_ns() // 1_000_000)
    try:
        from kubernetes.client import CoreV1Event

        # Pydantic-era clients (>= 35) take a model; older ones take the dict.
        model = CoreV1Event.from_dict(body) if hasattr(CoreV1Event, "from_dict") else body
        api.create_namespaced_event(body["metadata"]["namespace"], model, _preload_content=False)
    except ApiException as e:  # an Event is a report; losing one must not stop the agent
        name = (node.get("metadata") or {}).get("name", "")
        log.warning("%s: could not record event %s: %s", name, reason, _short(e))


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


def host_path(given: str | None, env: str, own: str) -> str:
    """A path as the host sees it: `given` (an option), else $`env`, else `own`, the path as
    this process sees it (a DaemonSet whose hostPath is its mountPath). ValueError for a path
    that is not absolute."""
    path = given or os.environ.get(env) or os.path.abspath(own)
    if not path.startswith("/") or "\n" in path:
        raise ValueError(f"{env}={path!r}: the host's path must be absolute, on one line")
    return os.path.normpath(path)


def retire_another_nodes_state(api, node: dict, state_dir: str, profile: str, composition: str | None,
                               gpus: int | None, hostname: str, host_state_dir: str | None = None) -> str | None:
    """When `state_dir` holds another node than the one about to be mounted (the Node's
    profile, GPU count or composition changed since: a pod restart after a relabel, or a new
    ConfigMap), move its files aside (persist.retire) so the mount starts a fresh node, and say
    so in one log line and a SimulatedNodeChanged Event. Returns that message, or None when the
    directory is this node's, fresh, or not readable (then the mount refuses it with the reason).
    RuntimeError or OSError when it cannot be moved (a daemon still uses it)."""
    from mokkafs.daemon.persist import StateError, node_record, retire, saved_record

    try:
        wanted = node_record(compose(load_profile(profile), node=composition, gpus=gpus, hostname=hostname))
        saved = saved_record(Path(state_dir))
    except (ProfileError, StateError, ValueError, OSError):
        return None  # the mount says what is wrong, as it would have
    if saved is None or saved == wanted:
        return None
    try:
        moved_to = retire(Path(state_dir))
    except StateError as e:
        raise RuntimeError(str(e)) from None
    shown = os.path.join(host_state_dir, moved_to.name) if host_state_dir else str(moved_to)  # as the host sees it
    message = node_changed(saved, wanted, shown)
    log.info("%s: %s", hostname, message)
    post_event(api, node, "Normal", REASON_NODE_CHANGED, message)
    return message


def refuse(api, node: dict, reason: str, code: int) -> int:
    """The agent cannot mount the node its settings ask for (a label or ConfigMap value, or a
    combination, that the CLI refuses): the reason goes to its log and, as a Warning Event, to the
    Node, where `kubectl describe node` shows it; then the agent exits with `code` (the kubelet
    restarts it, and a corrected label takes effect at that restart)."""
    reason = reason.removeprefix("mokka: ").removeprefix("agent: ")
    print(f"mokka: agent: {reason}", file=sys.stderr)
    post_event(api, node, "Warning", REASON_NODE_REFUSED, f"no node mounted: {reason}")
    return code


def main(args) -> int:
    """Entry point of `mokka agent` (arguments from mokkafs.cli.main)."""
    node_name = args.node_name or os.environ.get("NODE_NAME")
    if not node_name:
        print("mokka: agent: --node-name or NODE_NAME is required", file=sys.stderr)
        return 2
    api = kube_api(args.kubeconfig)
    node = json.loads(api.read_node(node_name, _preload_content=False).data)
    try:
        profile, gpus = node_settings(node, args.profile or os.environ.get("MOKKA_PROFILE"), args.gpus or os.environ.get("MOKKA_GPUS"))
        composition = node_composition(node, getattr(args, "node", None) or os.environ.get("MOKKA_NODE"))
        # Where the host sees the mount and the state directory (the DaemonSet's hostPath).
        host_mountpoint = host_path(getattr(args, "host_mountpoint", None), "MOKKA_HOST_MOUNTPOINT", args.mountpoint)
        host_state_dir = host_path(getattr(args, "host_state_dir", None), "MOKKA_HOST_STATE_DIR", args.state_dir)
    except ValueError as e:
        return refuse(api, node, str(e), 2)
    mounted_here = False
    if not args.no_mount:
        try:
            retire_another_nodes_state(api, node, args.state_dir, profile, composition, gpus, node_name, host_state_dir)
        except (RuntimeError, OSError) as e:  # a daemon still uses it; the mount would refuse it too
            print(f"mokka: agent: {e}", file=sys.stderr)
            return 1
        cmd = [sys.executable, "-m", "mokkafs.cli", "mount", args.mountpoint, "--profile", profile,
               "--state-dir", args.state_dir, "--host-state-dir", host_state_dir, "--hostname", node_name]  # fmt: skip
        if composition is not None:
            cmd += ["--node", composition]
        if gpus is not None:
            cmd += ["--gpus", str(gpus)]
        if args.kmsg:
            cmd.append("--kmsg")
        # stderr to a file, not a pipe: the daemon the mount starts may keep what it inherited open.
        with tempfile.TemporaryFile(mode="w+") as err:
            res = subprocess.run(cmd, stderr=err)
            err.seek(0)
            said = err.read(64 * 1024)
        sys.stderr.write(said)
        if res.returncode != 0:
            lines = [line for line in said.splitlines() if line.strip()]
            return refuse(api, node, lines[-1] if lines else f"mokka mount exited {res.returncode}", res.returncode)
        mounted_here = True
    tree = MountedTree(args.mountpoint, composition, args.state_dir if mounted_here else None)
    namespace = getattr(args, "namespace", None) or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    fgo_namespace = getattr(args, "fgo_namespace", None) or os.environ.get("MOKKA_FGO_NAMESPACE") or None
    agent = Agent(api, node_name, tree, resync_s=args.resync, namespace=namespace, fgo_namespace=fgo_namespace)

    def stop(signum, frame):
        agent.stopping = True
        raise _Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        write_node_files(tree, host_mountpoint, host_state_dir, args.cdi_spec or None, args.nfd_features or None)
        agent.run()
    except _Stop:
        log.info("signal: stopping")
    finally:
        if mounted_here:
            subprocess.run([sys.executable, "-m", "mokkafs.cli", "umount", args.mountpoint])
    return 0
