"""The agent's reconcile decisions, pure: (Node object, the mounted node's composition) -> the
claim to patch, the outcome to record, the health condition and the Events to write. The watch
loop (`watch.py`) makes the API calls; nothing here imports the API client or does I/O."""
from __future__ import annotations

import re
from dataclasses import dataclass

from mokkafs.agent.grammar import Command, ScenarioRequest, parse_injection
from mokkafs.model import InvalidCommand, Node, NodeConfig
from mokkafs.model.scenario import MAX_DURATION_S, ScenarioError, expand, load_text, plan_length, request_bytes
from mokkafs.model.scenario import start_text as iso
from mokkafs.model.schema import ProfileError

ANNOTATION_INJECT = "mokkafs.io/inject"
ANNOTATION_APPLIED = "mokkafs.io/applied"
ANNOTATION_REJECTED = "mokkafs.io/rejected"
LABEL_PROFILE = "mokkafs.io/profile"
LABEL_GPUS = "mokkafs.io/gpus"
LABEL_NODE = "mokkafs.io/node"
CONDITION_TYPE = "MokkaGPUHealthy"
COMPONENT = "mokkafs-agent"
MAX_GPUS = 64


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


def injection(node: dict) -> object | None:
    """The Node's `mokkafs.io/inject` value, None where it has none (most watch events)."""
    return ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_INJECT)


def decide(node: dict, config: NodeConfig | ProfileError) -> Apply | Reject | None:
    """`config`: the mounted node's composition, or why it could not be had (a profile this
    install cannot load); then an annotation is rejected, as its limits cannot be checked."""
    meta = node.get("metadata") or {}
    value = injection(node)
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
        return Reject(value, said_once(value, str(e)), rv)


def said_once(value: str, reason: str) -> str:
    """`reason` without its leading `'<command>': ` where that command is the whole `value`:
    the Event and the record quote the value before the reason, so a one-command annotation's
    reason need not name it again (a command of several is still named)."""
    prefix = f"{value.strip()!r}: "
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def partial_failure(action: Apply, failed: int, error: str) -> str:
    """What an Event says when the daemon refused `action.commands[failed]` after the checks
    passed (the node changed in between): which commands were applied and which were not."""
    done, rest = action.commands[:failed], action.commands[failed:]
    quoted = lambda cs: ", ".join(repr(c.text) for c in cs) or "none"  # noqa: E731
    refused = action.commands[failed]
    return (
        f"{refused.path or 'the control socket'} refused {refused.text!r}: {error}; "
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


def current_condition(node: dict, type_: str = CONDITION_TYPE) -> dict | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def node_event(node: dict, event_type: str, reason: str, message: str, now: str, seq: int, now_ms: int) -> dict:
    """A core/v1 Event about the Node, as the kubelet writes them (namespace `default`), so
    `kubectl describe node` shows it. Its name is unique by the agent's `seq` and `now_ms`
    (milliseconds since the epoch), the latter for a restarted agent whose `seq` starts again."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.mokkafs.{now_ms:x}.{seq}", "namespace": "default"},
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


REASON_NODE_CHANGED = "SimulatedNodeChanged"  # the Event of a node mounted fresh for new settings
REASON_NODE_REFUSED = "SimulatedNodeRefused"  # the Event of settings no node can be mounted from


def _node_words(record: object, hostname: bool) -> str:
    """A state directory's node.json record as `8 x h100` (`, composition pcie-8`, `, hostname
    n1` where asked), or `a node this release does not describe` for any other content."""
    node = record.get("node") if isinstance(record, dict) else None
    if not isinstance(node, dict):
        return "a node this release does not describe"
    words = f"{node.get('gpus', '?')} x {node.get('profile', '?')}"
    if node.get("node"):
        words += f", composition {node['node']}"
    if hostname:
        words += f", hostname {node.get('hostname', '?')}"
    return words


def node_changed(saved: object, wanted: dict, moved_to: str) -> str:
    """What the log line and the SimulatedNodeChanged Event say when the state directory held
    another node (`saved`, its node.json) than the one to mount (`wanted`): both, and where the
    old node's files went."""
    old, new = _node_words(saved, False), _node_words(wanted, False)
    if old == new:  # the same board and count: the hostname (or the record's format) differs
        old, new = _node_words(saved, True), _node_words(wanted, True)
    return f"this Node is now {new} (was {old}): the previous node's state moved to {moved_to}; mounting a fresh node"


def node_settings(node: dict, env_profile: str | None, env_gpus: str | None) -> tuple[str, int | None]:
    """Profile and GPU count: the Node's labels win over the ConfigMap (environment). The
    ConfigMap's count goes with the ConfigMap's profile: a Node labelled with another profile and
    no count of its own gets that profile's own count (8 H100s in the ConfigMap say nothing of how
    many GB200s sit in a node)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    profile = labels.get(LABEL_PROFILE) or env_profile or "h100"
    if profile != (env_profile or "h100"):
        env_gpus = None
    gpus_text = labels.get(LABEL_GPUS) or env_gpus or ""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", profile):
        raise ValueError(f"bad profile {profile!r} (label {LABEL_PROFILE} or MOKKA_PROFILE)")
    if gpus_text == "":
        return profile, None
    if not re.fullmatch(r"[1-9][0-9]{0,1}", gpus_text) or int(gpus_text) > MAX_GPUS:
        raise ValueError(f"bad GPU count {gpus_text!r} (label {LABEL_GPUS} or MOKKA_GPUS): 1..{MAX_GPUS}")
    return profile, int(gpus_text)


def node_composition(node: dict, env_node: str | None) -> str | None:
    """The node composition (a shipped one's name), the Node's label winning over the ConfigMap;
    None: the profile's own."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = labels.get(LABEL_NODE) or env_node or None
    if name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
        raise ValueError(f"bad node composition {name!r} (label {LABEL_NODE} or MOKKA_NODE)")
    return name


# --- scenarios: mokkafs.io/scenario, the MokkaScenario condition and its Events ------------------

ANNOTATION_SCENARIO = "mokkafs.io/scenario"
ANNOTATION_SCENARIO_ACCEPTED = "mokkafs.io/scenario-accepted"
ANNOTATION_SCENARIO_REJECTED = "mokkafs.io/scenario-rejected"
SCENARIO_CONDITION = "MokkaScenario"


@dataclass(frozen=True)
class StartScenario:
    value: str
    request: bytes  # the one write to node/scenario
    summary: str  # what the ScenarioStarted Event says
    resource_version: str


@dataclass(frozen=True)
class StopScenario:
    value: str
    resource_version: str


@dataclass(frozen=True)
class RejectScenario:
    value: str
    reason: str
    resource_version: str


def scenario_annotation(node: dict) -> tuple[str, str] | None:
    """The `mokkafs.io/scenario` value to act on and the Node's resourceVersion, if any."""
    meta = node.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_SCENARIO)
    if value is None:
        return None
    return (value if isinstance(value, str) else repr(value)), meta.get("resourceVersion", "")


def decide_scenario(
    request: ScenarioRequest, text: str | bytes, where: str, config: NodeConfig, status: str, now: float, rv: str
) -> StartScenario | RejectScenario:
    """Whether this node runs `request` (its YAML `text`, named `where` in errors), decided
    whole before anything is written: the file loads, every command of its plan fits this node
    (Node.validate on a scratch node composed like the mounted one: GPU count, NVLinks, limits),
    no scenario runs already (`status`: node/scenario), and its timeline has not ended by `now`
    (seconds since the epoch) nor starts more than the longest timeline away."""
    def reject(reason: str) -> RejectScenario:
        return RejectScenario(request.value, reason, rv)

    running = parse_info(status)
    if running.get("state") == "running":
        return reject(f"scenario {running.get('name')} runs already (step {running.get('step')}); annotate 'stop' first")
    try:
        loaded = load_text(text, where)
        seed = loaded.scenario.seed if request.seed is None else request.seed
        plan = expand(loaded, seed, config.gpus, Node(config, now).validate)
    except (ScenarioError, InvalidCommand) as e:
        return reject(str(e))
    length = plan_length(loaded.scenario, plan)
    start = request.start
    if start is not None:
        if start + length / request.speed < now:
            return reject(f"its timeline ended at {iso(start + length / request.speed)}, before this node took it")
        if start > now + MAX_DURATION_S:
            return reject(f"start {iso(start)} is more than {MAX_DURATION_S / 86400:g} days away")
    when = f"at {iso(start)}" if start is not None else "now"
    summary = (
        f"{loaded.scenario.name} (seed {seed}, speed {request.speed:g}): {len(plan)} commands over "
        f"{length:g} s, starting {when}"
    )
    body = request_bytes(loaded.text, seed=request.seed, speed=request.speed, start=start, file=where)
    return StartScenario(request.value, body, summary, rv)


def scenario_claim_patch(action: StartScenario | StopScenario | RejectScenario, now: str) -> dict:
    """Takes `mokkafs.io/scenario` off the node (acted on once) and records the outcome;
    conditional on the resourceVersion, as an injection's claim is."""
    if isinstance(action, RejectScenario):
        record = {ANNOTATION_SCENARIO_REJECTED: f"{now} {action.value}: {action.reason}"}
    else:
        record = {ANNOTATION_SCENARIO_ACCEPTED: f"{now} {action.value}", ANNOTATION_SCENARIO_REJECTED: None}
    return {
        "metadata": {
            "resourceVersion": action.resource_version,
            "annotations": {ANNOTATION_SCENARIO: None, **record},
        }
    }


def scenario_failure_patch(action: StartScenario, message: str, now: str) -> dict:
    """The record corrected when the daemon refused a scenario the checks passed (a race: one
    started meanwhile, the node was remounted): not accepted after all."""
    return {
        "metadata": {
            "annotations": {
                ANNOTATION_SCENARIO_ACCEPTED: None,
                ANNOTATION_SCENARIO_REJECTED: f"{now} {action.value}: {message}",
            }
        }
    }


# How a scenario ended (node/scenario's `last:` line) -> the condition's reason and the Event.
_ENDINGS = (
    (re.compile(r"\S+ finished \("), "ScenarioFinished", "Normal"),
    (re.compile(r"\S+ stopped at step "), "ScenarioStopped", "Normal"),
    (re.compile(r"aborted after a restart: "), "ScenarioAborted", "Warning"),
)


def scenario_condition(status: str, previous: dict | None, now: str) -> tuple[dict | None, tuple[str, str, str] | None]:
    """The MokkaScenario condition for node/scenario's `status` text, or None when `previous`
    says it already; and the Event (type, reason, message) for a scenario that has just ended.
    True while one runs (ScenarioWaiting before its start, ScenarioRunning with its step after);
    False when none does, with how the last one ended."""
    info = parse_info(status)
    if info.get("state") == "running":
        status_, name, seed = "True", info.get("name", "?"), info.get("seed", "?")
        if "starts_in" in info:
            reason, message = "ScenarioWaiting", f"{name} (seed {seed}) starts at {info.get('started')}"
        else:
            reason = "ScenarioRunning"
            message = f"{name} (seed {seed}) at step {info.get('step')}, started {info.get('started')}"
    else:
        last = info.get("last", "none")
        status_, reason, message = "False", "NoScenario", "no scenario has run since the daemon started"
        for pattern, why, _ in _ENDINGS:
            if pattern.match(last):
                reason, message = why, last
    if previous and (previous.get("status"), previous.get("reason"), previous.get("message")) == (status_, reason, message):
        return None, None
    event = next(((kind, why, message) for _, why, kind in _ENDINGS if why == reason), None)
    transition = previous.get("lastTransitionTime") if previous and previous.get("status") == status_ else None
    condition = {
        "type": SCENARIO_CONDITION,
        "status": status_,
        "reason": reason,
        "message": message[:1024],
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition or now,
    }
    return condition, event
