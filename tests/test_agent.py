"""`mokka agent`: the injection grammar and reconcile decisions (pure), then the agent against a
fake API server (tests/k8s_fake.py) driving a real mounted node: conflicts, watch restarts,
rejected annotations, the health condition and Events."""
from __future__ import annotations

import errno
import json
import os
import shlex
import stat
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.level("deploy")

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install kubernetes)")

from conftest import mokka_cmd  # noqa: E402
from k8s_fake import FakeCluster  # noqa: E402

from mokkafs.agent import decisions, grammar, node_files, watch  # noqa: E402
from mokkafs.model import Node, compose  # noqa: E402
from mokkafs.model import scenario as scenario_model  # noqa: E402
from mokkafs.model.events import InvalidCommand, Pin  # noqa: E402
from mokkafs.model.schema import ProfileError
from mokkafs.model.profiles import load_profile  # noqa: E402
from helpers import wait_until


def config(profile: str = "h100", gpus: int = 4):
    return compose(load_profile(profile), gpus=gpus)


# --- the grammar --------------------------------------------------------------------------------

GOOD = [
    ("gpu=3 xid=79", [("gpu3/inject_xid", b"79")]),
    ("gpu=1 ecc=dbe 2", [("gpu1/inject_ecc", b"dbe 2")]),
    ("gpu=1 ecc=sbe 5 l2", [("gpu1/inject_ecc", b"sbe 5 l2")]),
    ("gpu=0 temperature=90", [("gpu0/temperature", b"90")]),
    ("gpu=0 temperature=auto", [("gpu0/temperature", b"auto")]),
    ("gpu=2 reset=1", [("gpu2/reset", b"1")]),
    ("node reset=1", [("node/reset", b"1")]),
    ("gpu=0 utilization=90 40", [("gpu0/utilization", b"90 40")]),
    ("gpu=0 nvlink=3 down", [("gpu0/nvlink", b"3 down")]),
    ("gpu=0 throttle=hw_thermal_slowdown sw_power_cap", [("gpu0/throttle", b"hw_thermal_slowdown sw_power_cap")]),
    ("gpu=0 xid=48; gpu=1 lost=1", [("gpu0/inject_xid", b"48"), ("gpu1/lost", b"1")]),
    ("gpu=0 xid=48;gpu=1 lost=1\n", [("gpu0/inject_xid", b"48"), ("gpu1/lost", b"1")]),
]

BAD = [
    ("", "empty"),
    ("gpu=4 xid=79", "no gpu4, the node has 4 GPUs"),
    ("gpu=03 xid=79", "target must be"),
    ("gpu=-1 xid=79", "target must be"),
    ("gpu=0 xid=abc", "Xid must be a decimal number"),
    ("gpu=0 xid=0", "Xid must be 1..999"),
    ("gpu=0 xid=1000", "at most 999"),
    ("gpu=0 xid=79 80", "Xid must be a decimal number"),
    ("gpu=0 frobnicate=1", "unknown key 'frobnicate'"),
    ("node xid=79", "unknown key 'xid'"),
    ("node reset=2", "expected 1"),
    ("gpu=0", "expected 'gpu=N KEY=VALUE'"),
    ("xid=79 gpu=0", "target must be"),
    ("gpu=0 ecc=dbe", "expected 'sbe N [LOCATION]' or 'dbe N [LOCATION]"),
    ("gpu=0 ecc=tbe 1", "ECC kind must be sbe or dbe"),
    ("gpu=0  xid=79", "stray whitespace"),
    ("gpu=0 xid=79;", "empty command"),
    ("gpu=0 xid=79;;gpu=1 xid=79", "empty command"),
    ("gpu=0 xid=79\ngpu=1 xid=79", "one line"),
    ("gpu=0 temperature=9\u00b0", "printable ASCII"),
    ("gpu=0 lost=1; gpu=9 lost=1", "no gpu9"),  # a later bad command rejects the whole value
    (";".join(["gpu=0 xid=79"] * 17), "more than 16 commands"),
    ("gpu=0 temperature=" + "9" * 2000, "longer than 1024 bytes"),
]


@pytest.mark.parametrize("value,expected", GOOD)
def test_grammar_accepts(value, expected):
    commands = grammar.parse_injection(value, config())
    assert [(c.path, c.payload) for c in commands] == expected


@pytest.mark.parametrize("value,reason", BAD)
def test_grammar_rejects_with_the_reason(value, reason):
    with pytest.raises(InvalidCommand, match=None) as e:
        grammar.parse_injection(value, config())
    assert reason in str(e.value)


# --- the node's limits: every command is applied to a scratch node before any is written -------

LIMITS = [
    ("a100", "gpu=0 xid=48; gpu=0 nvlink=17 down", "'gpu=0 nvlink=17 down': a100 has 12 NVLinks, no link 17"),
    ("a100", "gpu=0 nvlink=12 errors 3", "a100 has 12 NVLinks, no link 12"),
    ("t4", "gpu=0 temperature=80; gpu=0 nvlink=0 down", "t4 has 0 NVLinks, no link 0"),
    ("h100", "gpu=1 lost=1; gpu=0 clocks=19999 2619", "'gpu=0 clocks=19999 2619': clocks must be 1.."),
    ("h100", "gpu=0 memory_used=999999", "memory_used at most"),
]


@pytest.mark.parametrize("profile,value,reason", LIMITS)
def test_limits_of_the_profile_reject_the_whole_annotation(profile, value, reason):
    with pytest.raises(InvalidCommand) as e:
        grammar.parse_injection(value, config(profile))
    assert reason in str(e.value)
    rej = decisions.decide(_node({decisions.ANNOTATION_INJECT: value}), config(profile))
    assert isinstance(rej, decisions.Reject) and reason in rej.reason


def test_within_the_limits_of_the_profile():
    value = "gpu=0 xid=48; gpu=0 nvlink=11 down; gpu=0 nvlink=11 up; gpu=1 clocks=1410 1215; node reset=1"
    commands = grammar.parse_injection(value, config("a100"))
    assert [c.text for c in commands] == [part.strip() for part in value.split(";")]
    assert grammar.parse_injection("gpu=0 nvlink=17 down", config("h100"))  # 18 links there


def test_commands_are_checked_in_order_on_one_scratch_node(monkeypatch):
    # Today the model's checks depend on the profile only; should one depend on the state (here:
    # no pins on a GPU off the bus), a command must be checked against what the earlier ones did.
    validate = Node.validate

    def stateful(self, event):
        validate(self, event)
        if isinstance(event, Pin) and self.gpus[event.gpu].lost:
            raise InvalidCommand(f"gpu{event.gpu} is off the bus")

    monkeypatch.setattr(Node, "validate", stateful)
    with pytest.raises(InvalidCommand, match="'gpu=0 temperature=90': gpu0 is off the bus"):
        grammar.parse_injection("gpu=0 xid=79; gpu=0 temperature=90", config())
    assert grammar.parse_injection("gpu=0 xid=79; gpu=0 reset=1; gpu=0 temperature=90", config())
    assert grammar.parse_injection("gpu=0 xid=79; gpu=1 temperature=90", config())
    assert grammar.parse_injection("gpu=0 temperature=90; gpu=0 xid=79", config())


def test_a_node_whose_limits_cannot_be_known_rejects():
    rej = decisions.decide(_node({decisions.ANNOTATION_INJECT: "gpu=0 xid=79"}), ProfileError("unknown profile 'mine'"))
    assert isinstance(rej, decisions.Reject) and "cannot check it against the node's limits" in rej.reason
    assert decisions.decide(_node(), ProfileError("unknown profile 'mine'")) is None


def test_partial_failure_says_what_was_applied():
    value = "gpu=0 xid=48; gpu=0 nvlink=5 down; gpu=1 lost=1"
    act = decisions.decide(_node({decisions.ANNOTATION_INJECT: value}), config())
    message = decisions.partial_failure(act, 1, "Invalid argument")
    assert message == (
        "gpu0/nvlink refused 'gpu=0 nvlink=5 down': Invalid argument; "
        "applied: 'gpu=0 xid=48'; not applied: 'gpu=0 nvlink=5 down', 'gpu=1 lost=1'"
    )
    assert "applied: none;" in decisions.partial_failure(act, 0, "Invalid argument")
    patch = decisions.failure_patch(act, 1, message, "T")["metadata"]
    assert "resourceVersion" not in patch, "a correction, after the claim: unconditional"
    assert patch["annotations"] == {
        decisions.ANNOTATION_APPLIED: "T gpu=0 xid=48",
        decisions.ANNOTATION_REJECTED: f"T {act.value}: {message}",
    }
    none_done = decisions.failure_patch(act, 0, message, "T")["metadata"]["annotations"]
    assert none_done[decisions.ANNOTATION_APPLIED] is None


def _node(annotations=None, rv="7", conditions=None, labels=None):
    return {
        "metadata": {"name": "n1", "uid": "u1", "resourceVersion": rv, "annotations": annotations or {}, "labels": labels or {}},
        "status": {"conditions": conditions or []},
    }


def test_decide():
    assert decisions.decide(_node(), config()) is None
    act = decisions.decide(_node({decisions.ANNOTATION_INJECT: "gpu=3 xid=79"}), config())
    assert isinstance(act, decisions.Apply) and act.resource_version == "7"
    rej = decisions.decide(_node({decisions.ANNOTATION_INJECT: "gpu=3 xid=79"}), config(gpus=2))
    assert isinstance(rej, decisions.Reject) and "no gpu3" in rej.reason
    patch = decisions.claim_patch(act, "2026-12-01T00:00:00Z")
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch["metadata"]["annotations"][decisions.ANNOTATION_INJECT] is None
    assert patch["metadata"]["annotations"][decisions.ANNOTATION_APPLIED] == "2026-12-01T00:00:00Z gpu=3 xid=79"
    rpatch = decisions.claim_patch(rej, "T")
    assert rpatch["metadata"]["annotations"][decisions.ANNOTATION_REJECTED].startswith("T gpu=3 xid=79: ")


@pytest.mark.parametrize("value,said", [
    ("gpu=7 xid=79", "'gpu=7 xid=79': no gpu7, the node has 4 GPUs (0..3)"),
    ("gpu=7 xid=79\n", "'gpu=7 xid=79\\n': no gpu7, the node has 4 GPUs (0..3)"),
    ("gpu=all xid=banana", "'gpu=all xid=banana': Xid must be a decimal number, got 'banana'"),
    ("gpu=0", "'gpu=0': expected 'gpu=N KEY=VALUE' or 'node reset=1'"),
    # one of several commands: the value, then which command and why
    ("gpu=0 lost=1; gpu=9 lost=1", "'gpu=0 lost=1; gpu=9 lost=1': 'gpu=9 lost=1': no gpu9, the node has 4 GPUs (0..3)"),
])  # fmt: skip
def test_a_rejection_says_the_value_once(value, said):
    """What the InjectionRejected Event says (value, then reason) and what mokkafs.io/rejected
    records: a one-command value's reason does not name the command again."""
    rej = decisions.decide(_node({decisions.ANNOTATION_INJECT: value}), config())
    assert f"{rej.value!r}: {rej.reason}" == said
    record = decisions.claim_patch(rej, "T")["metadata"]["annotations"][decisions.ANNOTATION_REJECTED]
    assert record == f"T {value}: {rej.reason}" and record.count(value.split(";")[0].strip()) == 1


def test_an_event_is_named_by_the_time_given_and_its_sequence():
    ev = decisions.node_event(_node(), "Warning", "InjectionRejected", "x" * 2000, "T", 3, 0x19A2B3C4D5E)
    assert ev["metadata"]["name"].endswith(".mokkafs.19a2b3c4d5e.3"), ev["metadata"]["name"]
    assert (ev["firstTimestamp"], ev["lastTimestamp"], len(ev["message"])) == ("T", "T", 1024)


def test_health_condition_only_on_change():
    H = decisions.GpuHealth
    ok = [H(0, "healthy", "none"), H(1, "healthy", "none")]
    c = decisions.health_condition(ok, None, "T1")
    assert (c["status"], c["reason"], c["message"]) == ("True", "GPUsHealthy", "all 2 GPUs healthy")
    assert decisions.health_condition(ok, c, "T2") is None  # unchanged: no write
    bad = [H(0, "healthy", "none"), H(1, "lost", "lost")]
    c2 = decisions.health_condition(bad, c, "T3")
    assert (c2["status"], c2["reason"], c2["lastTransitionTime"]) == ("False", "GPUsUnhealthy", "T3")
    assert c2["message"] == "gpu1 lost (lost)"
    deg = [H(0, "degraded", "none"), H(1, "healthy", "none")]
    c3 = decisions.health_condition(deg, c, "T4")
    assert (c3["status"], c3["reason"], c3["lastTransitionTime"]) == ("True", "GPUsDegraded", "T1")


def test_node_settings_labels_win_over_configmap():
    assert decisions.node_settings(_node(), "t4", "1") == ("t4", 1)
    assert decisions.node_settings(_node(), None, None) == ("h100", None)
    labels = {decisions.LABEL_PROFILE: "b200", decisions.LABEL_GPUS: "4"}
    assert decisions.node_settings(_node(labels=labels), "t4", "1") == ("b200", 4)
    # The ConfigMap's count is its profile's: another profile's label alone takes that profile's
    # own count (None), the same profile keeps the ConfigMap's count.
    assert decisions.node_settings(_node(labels={"mokkafs.io/profile": "gb200"}), "h100", "8") == ("gb200", None)
    assert decisions.node_settings(_node(labels={"mokkafs.io/profile": "gb200"}), None, "8") == ("gb200", None)
    assert decisions.node_settings(_node(labels={"mokkafs.io/profile": "h100"}), "h100", "8") == ("h100", 8)
    assert decisions.node_settings(_node(labels={"mokkafs.io/gpus": "2"}), "h100", "8") == ("h100", 2)
    gpus, profile = decisions.LABEL_GPUS, decisions.LABEL_PROFILE
    for bad in ({gpus: "0"}, {gpus: "65"}, {gpus: "x"}, {profile: "../etc"}):
        with pytest.raises(ValueError):
            decisions.node_settings(_node(labels=bad), None, None)


def test_cdi_spec_shape():
    gpus = [node_files.GpuDevice(0, 0, "GPU-aaaa"), node_files.GpuDevice(1, 1, "GPU-bbbb")]
    text = node_files.cdi_spec("/m", "/s/state", gpus, ["usr/lib64/libnvidia-ml.so.1", "usr/bin/nvidia-smi"], "x86_64")
    assert text.startswith("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: '0'\n")
    assert "&" not in text and "*" not in text, "no YAML anchors or aliases"
    spec = yaml.safe_load(text)
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", "GPU-aaaa", "1", "GPU-bbbb", "all"]
    by = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert by["GPU-bbbb"] == [{"path": "/dev/nvidia1", "hostPath": "/m/dev/nvidia1"}]
    assert [n["path"] for n in by["all"]] == ["/dev/nvidia0", "/dev/nvidia1"]
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts == {
        "/run/mokka": "/s",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "/m/driver/usr/lib64/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi": "/m/driver/usr/bin/nvidia-smi",
    }
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"] and "MOKKA_STATE=/run/mokka/state" in edits["env"]
    assert "hooks" not in edits  # a driver root without mokka-cdi-hook
    hooked = yaml.safe_load(node_files.cdi_spec("/m", "/s/state", gpus, [], "x86_64", proc_hook=True,
                                                mig_monitor="nvidia-caps/nvidia-cap2"))
    every = {d["name"]: d["containerEdits"]["deviceNodes"] for d in hooked["devices"]}["all"]
    assert every[-1] == {"path": "/dev/nvidia-caps/nvidia-cap2", "hostPath": "/m/dev/nvidia-caps/nvidia-cap2"}
    assert hooked["containerEdits"]["hooks"] == [
        {"hookName": "createContainer", "path": "/m/driver/usr/bin/mokka-cdi-hook",
         "args": ["mokka-cdi-hook", "proc", "/m/proc"]}]


def test_nfd_feature_file_is_name_value_lines():
    text = node_files.nfd_features("h100", 8, "590.48.01")
    lines = text.splitlines()
    assert text.endswith("\n") and "pci-10de.present=true" in lines
    assert all("=" in line and " " not in line and not line.startswith("#") for line in lines)


# --- scenarios: the annotation, the decision, the condition (pure) --------------------------------

T_START = 1796317200.0  # 2026-12-03T17:00:00Z
SHORT_YAML = "name: short\nsteps:\n  - at: 0s\n    gpu: 0\n    command: xid 13\n  - at: 1s\n    gpu: 0\n    command: xid 31\n"
NVLINK_YAML = "name: flap\nsteps:\n  - at: 0s\n    gpu: 0\n    command: xid 74\n  - at: 1s\n    gpu: 0\n    command: nvlink 2 down\n"


def test_scenario_annotation_grammar():
    req = grammar.parse_scenario("ecc-degradation seed=4 speed=2.5 start=2026-12-03T17:00:00Z")
    assert (req.name, req.configmap, req.seed, req.speed, req.start) == ("ecc-degradation", None, 4, 2.5, T_START)
    req = grammar.parse_scenario("configmap=stories/flap.yaml start=2026-12-03T17:00:00.250Z\n")
    assert (req.name, req.configmap, req.key, req.seed, req.start) == (None, "stories", "flap.yaml", None, T_START + 0.25)
    assert grammar.parse_scenario("nvlink-flapping.yaml").name == "nvlink-flapping"
    assert isinstance(grammar.parse_scenario("stop"), grammar.StopRequest)


@pytest.mark.parametrize("value,reason", [
    ("", "empty annotation"),
    ("Bad/Name", "expected a shipped scenario's name or 'configmap=NAME/KEY'"),
    ("configmap=stories", "expected a shipped scenario's name or 'configmap=NAME/KEY'"),
    ("configmap=Stories/x.yaml", "expected a shipped scenario's name"),
    ("x seed=-1", "'seed=-1': expected seed=N"),
    ("x seed=1 seed=2", "seed given twice"),
    ("x speed=0", "speed must be above 0"),
    ("x start=2026-12-03T17:00:00+01:00", "start must be a UTC time"),
    ("x start=2026-13-03T17:00:00Z", "start '2026-13-03T17:00:00Z': month must be in 1..12"),
    ("x  seed=1", "''"),
    ("x frob=1", "'frob=1': expected"),
    ("x\nstop", "one line"),
    ("x " + "seed=1 " * 100, "longer than 512 bytes"),
])  # fmt: skip
def test_scenario_annotation_grammar_rejects(value, reason):
    with pytest.raises(InvalidCommand) as e:
        grammar.parse_scenario(value)
    assert reason in str(e.value), str(e.value)


IDLE = "state: idle\nlast: none\n"


def _decide(yaml_text, value="configmap=s/short.yaml", profile="h100", gpus=4, status=IDLE, now=T_START - 10):
    return decisions.decide_scenario(grammar.parse_scenario(value), yaml_text, "short.yaml", config(profile, gpus), status, now, "9")


def test_decide_scenario_starts_one_that_fits_the_node():
    act = _decide(SHORT_YAML, "configmap=s/short.yaml seed=3 start=2026-12-03T17:00:00Z")
    assert isinstance(act, decisions.StartScenario) and act.resource_version == "9"
    assert act.summary == "short (seed 3, speed 1): 2 commands over 1 s, starting at 2026-12-03T17:00:00Z"
    assert act.request.startswith(f"run seed=3 start={T_START:.0f} file=short.yaml\nname: short\n".encode())
    assert _decide(SHORT_YAML).summary.endswith("starting now")


@pytest.mark.parametrize("yaml_text,kw,reason", [
    (SHORT_YAML.replace("gpu: 0\n    command: xid 31", "gpu: 4\n    command: xid 31"), {},
     "short.yaml:7: step 2: no gpu4, the node has 4 GPUs (0..3)"),
    (NVLINK_YAML, {"profile": "t4", "gpus": 1}, "short.yaml:8: step 2: 'nvlink 2 down' on gpu0: t4 has 0 NVLinks, no link 2"),
    ("name: x\nsteps:\n  - at 1s\n", {}, "short.yaml:3: step 1: Input should be a valid dictionary"),
    ("name: x\nsteps: [\n", {}, "short.yaml:3: not YAML"),
    (SHORT_YAML, {"status": "state: running\nname: other\nstep: 3/9\n"}, "scenario other runs already (step 3/9); annotate 'stop' first"),
    (SHORT_YAML, {"value": "configmap=s/short.yaml start=2026-12-03T17:00:00Z", "now": T_START + 2},
     "its timeline ended at 2026-12-03T17:00:01Z, before this node took it"),
    (SHORT_YAML, {"value": "configmap=s/short.yaml start=2026-12-11T17:00:00Z"}, "more than 7 days away"),
])  # fmt: skip
def test_decide_scenario_refuses_whole(yaml_text, kw, reason):
    act = _decide(yaml_text, **kw)
    assert isinstance(act, decisions.RejectScenario), act
    assert reason in act.reason, act.reason
    patch = decisions.scenario_claim_patch(act, "T")["metadata"]
    assert patch["resourceVersion"] == "9" and patch["annotations"][decisions.ANNOTATION_SCENARIO] is None
    assert patch["annotations"][decisions.ANNOTATION_SCENARIO_REJECTED].startswith(f"T {act.value}: ")


def test_a_started_timeline_is_joined_where_it_stands():
    act = _decide(SHORT_YAML, "configmap=s/short.yaml start=2026-12-03T17:00:00Z", now=T_START + 0.5)
    assert isinstance(act, decisions.StartScenario)


RUNNING = "state: running\nname: short\nfile: short.yaml\nseed: 0\nspeed: 1\nstarted: 2026-12-03T17:00:00.000000Z\n"


def test_scenario_condition_and_its_events():
    waiting, ev = decisions.scenario_condition(RUNNING + "elapsed: 0.000s of 1s\nstarts_in: 4.000s\nstep: 0/2\n", None, "T1")
    assert (waiting["status"], waiting["reason"], ev) == ("True", "ScenarioWaiting", None)
    assert waiting["message"] == "short (seed 0) starts at 2026-12-03T17:00:00.000000Z"
    running, ev = decisions.scenario_condition(RUNNING + "step: 1/2\n", waiting, "T2")
    assert (running["reason"], running["lastTransitionTime"], ev) == ("ScenarioRunning", "T1", None)
    assert running["message"] == "short (seed 0) at step 1/2, started 2026-12-03T17:00:00.000000Z"
    assert decisions.scenario_condition(RUNNING + "step: 1/2\n", running, "T3") == (None, None)
    done, ev = decisions.scenario_condition("state: idle\nlast: short finished (2 commands)\n", running, "T4")
    assert (done["status"], done["reason"], done["lastTransitionTime"]) == ("False", "ScenarioFinished", "T4")
    assert ev == ("Normal", "ScenarioFinished", "short finished (2 commands)")
    _, ev = decisions.scenario_condition("state: idle\nlast: short stopped at step 1/2\n", running, "T5")
    assert ev == ("Normal", "ScenarioStopped", "short stopped at step 1/2")
    _, ev = decisions.scenario_condition("state: idle\nlast: aborted after a restart: x.yaml:4: no gpu9\n", None, "T6")
    assert ev == ("Warning", "ScenarioAborted", "aborted after a restart: x.yaml:4: no gpu9")
    none, ev = decisions.scenario_condition(IDLE, None, "T7")
    assert (none["status"], none["reason"], ev) == ("False", "NoScenario", None)


# --- against a fake API server and a real mount ----------------------------------------------------


@pytest.fixture
def cluster():
    c = FakeCluster()
    c.base_url = c.start()
    yield c
    c.stop()


def core_api(base_url: str):
    from kubernetes import client

    cfg = client.Configuration(host=base_url)
    cfg.proxy = None
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def start_agent(cluster, node_factory):
    """`start_agent(profile, gpus, tree=MountedTree, node_name=None)`: a mounted node and an
    agent thread watching the fake cluster's Node (`node_name`, added to the cluster if new)
    through `tree`; stopped at teardown."""
    threads = []

    def start(profile: str = "h100", gpus: int = 4, tree=watch.MountedTree, node_name: str | None = None):
        node_name = node_name or cluster.first
        if node_name not in cluster.nodes:
            cluster.add_node(node_name)
        node = node_factory(profile=profile, gpus=gpus, name=f"mnt-{node_name}")
        a = watch.Agent(core_api(cluster.base_url), node_name, tree(str(node.mnt)), resync_s=1)
        t = threading.Thread(target=a.run, daemon=True)
        t.start()
        threads.append((a, t))
        return cluster, node, a

    yield start
    for a, t in threads:
        a.stopping = True
        t.join(timeout=10)
        assert not t.is_alive(), "the agent did not stop within a resync period"


@pytest.fixture
def running(start_agent):
    """A mounted 4 x H100 node and an agent thread watching the fake cluster's Node."""
    return start_agent()


def annotations(cluster) -> dict:
    return cluster.snapshot()["metadata"].get("annotations") or {}


def events(cluster, reason: str, node: str | None = None) -> list[dict]:
    return [e for e in cluster.events if e["reason"] == reason and node in (None, e["involvedObject"]["name"])]


def test_injection_applied_once_despite_a_conflict(running):
    cluster, node, _ = running
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    assert cluster.condition(decisions.CONDITION_TYPE)["status"] == "True"
    cluster.conflicts = 1  # the kubelet writes the Node between our read and our claim
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=3 xid=79")
    wait_until(lambda: events(cluster, "InjectionApplied"), "the InjectionApplied event")

    assert node.read("gpu3/lost") == "1\n"
    assert "health: lost" in node.read("gpu3/info")
    assert node.read("gpu3/events").count(": 79, ") == 1, "applied exactly once"
    ann = annotations(cluster)
    assert decisions.ANNOTATION_INJECT not in ann
    assert ann[decisions.ANNOTATION_APPLIED].endswith(" gpu=3 xid=79")
    codes = [p for p in cluster.patches if p[0].endswith("/gpu-node-1")]
    # The first claim meets the 409; stale watch events may try (and 409) again; one wins.
    assert len(codes) >= 2 and len(events(cluster, "InjectionApplied")) == 1
    cond = wait_until(
        lambda: (c := cluster.condition(decisions.CONDITION_TYPE)) and c["status"] == "False" and c, "condition False"
    )
    assert cond["reason"] == "GPUsUnhealthy" and cond["message"].startswith("gpu3 lost")
    assert cluster.condition("Ready")["status"] == "True", "the kubelet's conditions are untouched"
    (ev,) = events(cluster, "InjectionApplied")
    assert ev["type"] == "Normal" and ev["message"] == "gpu=3 xid=79"
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1",
                                    "uid": "6f1c2a9e-0d7b-4c1e-9a51-3d1f8f0e2b71"}  # fmt: skip
    assert ev["metadata"]["namespace"] == "default" and ev["source"]["component"] == "mokkafs-agent"

    # Recovery: reset the node through the annotation; the condition follows.
    cluster.annotate(decisions.ANNOTATION_INJECT, "node reset=1")
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE)["status"] == "True", "condition True again")
    assert node.read("gpu3/lost") == "0\n"


def health_patches(cluster) -> list[dict]:
    """The PATCHes of nodes/status that wrote MokkaGPUHealthy, as the fake API server saw them."""
    return [body for path, _, body in cluster.patches if path.endswith("/status")
            and any(c["type"] == decisions.CONDITION_TYPE for c in body["status"]["conditions"])]


def test_the_condition_is_patched_once_per_change(running):
    """One injection that changes the condition is one PATCH of it, though the watch then shows
    the agent its own claim (a Node read before the condition changed); no change, no PATCH.
    The fake API server, because it records every request: a real one shows its PATCHes only in
    an audit log (the real-cluster tier checks what the condition says)."""
    cluster, node, _ = running
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    time.sleep(1.5)  # past a resync (1 s): the start's reports are done
    assert len(health_patches(cluster)) == 1, "the first report: one PATCH"
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=3 xid=79")
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE)["status"] == "False", "condition False")
    time.sleep(1.5)  # the watch events of the claim and of the PATCH itself, and a resync
    assert [p["status"]["conditions"][0]["status"] for p in health_patches(cluster)] == ["True", "False"]
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=1 temperature=70")  # no change to the condition
    wait_until(lambda: events(cluster, "InjectionApplied")[1:], "the second injection")
    cluster.heartbeat()  # the kubelet's own status update: nothing to write either
    time.sleep(1.5)
    assert len(health_patches(cluster)) == 2, "an injection that leaves the condition as it is writes none"
    cluster.annotate(decisions.ANNOTATION_INJECT, "node reset=1")
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE)["status"] == "True", "condition True again")
    time.sleep(1.5)
    assert [p["status"]["conditions"][0]["status"] for p in health_patches(cluster)] == ["True", "False", "True"]


@pytest.mark.parametrize("value,reason", [
    ("gpu=7 xid=79", "no gpu7, the node has 4 GPUs"),
    ("gpu=0 xid=banana", "Xid must be a decimal number"),
    ("gpu=0 lost=1; gpu=1 frobnicate=2", "unknown key 'frobnicate'"),
    ("gpu=0 xid=79;", "empty command"),
])  # fmt: skip
def test_bad_annotation_gets_an_event_and_changes_nothing(running, expect_log, value, reason):
    expect_log(r"rejected mokkafs.io/inject")
    cluster, node, _ = running
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    before = {p: node.read(p) for p in ("node/events", "gpu0/info", "gpu0/lost", "gpu1/info")}
    cluster.annotate(decisions.ANNOTATION_INJECT, value)
    (ev,) = wait_until(lambda: events(cluster, "InjectionRejected"), "the InjectionRejected event")
    assert ev["type"] == "Warning" and reason in ev["message"]
    assert ev["message"].count(value.split(";")[0].strip()) == 1, f"the value said once: {ev['message']}"
    assert {p: node.read(p) for p in before} == before
    ann = annotations(cluster)
    assert decisions.ANNOTATION_INJECT not in ann and reason in ann[decisions.ANNOTATION_REJECTED]
    assert cluster.condition(decisions.CONDITION_TYPE)["status"] == "True"


GPU0_FILES = ("node/events", "gpu0/info", "gpu0/inject_xid", "gpu0/inject_ecc", "gpu0/nvlink", "gpu0/events")


def test_annotation_beyond_the_profiles_limits_changes_nothing(start_agent, expect_log):
    # The first command alone is fine; the second names a link an A100 does not have. Checked
    # against the node's limits before any write, the Xid is never applied.
    expect_log(r"rejected mokkafs.io/inject")
    cluster, node, _ = start_agent("a100", 2)
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    before = {p: node.read(p) for p in GPU0_FILES}
    assert before["gpu0/inject_xid"] == "none\n" and "health: healthy" in before["gpu0/info"]
    value = "gpu=0 xid=48; gpu=0 nvlink=17 down"
    cluster.annotate(decisions.ANNOTATION_INJECT, value)
    (ev,) = wait_until(lambda: events(cluster, "InjectionRejected"), "the InjectionRejected event")
    assert ev["type"] == "Warning"
    assert ev["message"] == f"{value!r}: 'gpu=0 nvlink=17 down': a100 has 12 NVLinks, no link 17"
    assert {p: node.read(p) for p in GPU0_FILES} == before, "no command of a bad annotation is written"
    assert not events(cluster, "InjectionApplied") and not events(cluster, "InjectionFailed")
    ann = annotations(cluster)
    assert decisions.ANNOTATION_INJECT not in ann and decisions.ANNOTATION_APPLIED not in ann
    assert ann[decisions.ANNOTATION_REJECTED].endswith(f" {value}: 'gpu=0 nvlink=17 down': a100 has 12 NVLinks, no link 17")
    assert cluster.condition(decisions.CONDITION_TYPE)["status"] == "True"


def test_annotation_within_the_limits_applies_fully(start_agent):
    cluster, node, _ = start_agent("a100", 2)
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    value = "gpu=0 xid=48; gpu=0 nvlink=11 down; gpu=1 temperature=91"
    cluster.annotate(decisions.ANNOTATION_INJECT, value)
    (ev,) = wait_until(lambda: events(cluster, "InjectionApplied"), "the InjectionApplied event")
    assert ev["message"] == value
    assert node.read("gpu0/inject_xid").startswith("48 ")
    assert "11 down " in node.read("gpu0/nvlink")
    assert node.read("gpu1/temperature") == "91\n"
    assert annotations(cluster)[decisions.ANNOTATION_APPLIED].endswith(f" {value}")


def test_mig_annotation(start_agent, expect_log):
    """`mig=` through the agent: the same vocabulary as `mokka inject`, checked whole against a
    scratch node first (an over-full layout is refused before anything is written)."""
    expect_log(r"rejected mokkafs.io/inject")
    cluster, node, _ = start_agent("h100", 2)
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=0 mig=enable; gpu=0 mig=create 4g.40gb,4g.40gb")
    (bad,) = wait_until(lambda: events(cluster, "InjectionRejected"), "the InjectionRejected event")
    assert "4g.40gb" in bad["message"] and node.read("gpu0/mig").startswith("mode: disabled\n")
    value = "gpu=all mig=enable; gpu=1 mig=create 3g.40gb,2g.20gb,1g.10gb,1g.10gb"
    cluster.annotate(decisions.ANNOTATION_INJECT, value)
    (ev,) = wait_until(lambda: events(cluster, "InjectionApplied"), "the InjectionApplied event")
    assert ev["message"] == value
    assert node.read("gpu0/mig").startswith("mode: enabled\n") and "\ngi " not in node.read("gpu0/mig")
    shown = node.read("gpu1/mig")
    assert [line.split()[1] for line in shown.splitlines() if line.startswith("gi ")] == ["2", "3", "9", "10"]
    assert sorted(os.listdir(node.mnt / "proc/driver/nvidia/capabilities/gpu1/mig")) == ["gi10", "gi2", "gi3", "gi9"]


def test_the_mounted_nodes_limits_are_read_once_per_daemon(node_factory, monkeypatch):
    """The agent reads node/profile and node/gpu_count once per mount, not per annotation; a
    remount (another daemon, another profile) is read afresh."""
    node = node_factory("t4", 2)
    tree = watch.MountedTree(str(node.mnt))
    first = tree.node_config()
    assert (first.profile.name, first.gpus) == ("t4", 2)
    reads = []
    monkeypatch.setattr(tree, "read", lambda rel: reads.append(rel) or watch.MountedTree.read(tree, rel))
    assert tree.node_config() is first and reads == []
    node.umount()
    node.profile, node.gpus, node.state_dir = "l4", 1, node.state_dir.with_name("l4-state")
    node.mount()
    again = tree.node_config()
    assert (again.profile.name, again.gpus) == ("l4", 1) and "node/profile" in reads


class _StaleTree(watch.MountedTree):
    """A tree whose limits the agent reads as an H100's while the mount is an A100's: what a
    remount with another profile between the check and the writes would look like."""

    def node_config(self):
        return compose(load_profile("h100"), gpus=self.gpu_count())


def test_refusal_at_write_time_says_what_was_applied(start_agent, expect_log):
    expect_log(r"partly applied")
    cluster, node, _ = start_agent("a100", 2, tree=_StaleTree)
    node.expect_warning(r"EINVAL write gpu0/nvlink: .*no link 17")
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    value = "gpu=0 xid=48; gpu=0 nvlink=17 down; gpu=1 temperature=91"
    cluster.annotate(decisions.ANNOTATION_INJECT, value)
    (ev,) = wait_until(lambda: events(cluster, "InjectionFailed"), "the InjectionFailed event")
    strerror = os.strerror(errno.EINVAL)
    assert ev["type"] == "Warning" and ev["message"] == (
        f"{value!r}: gpu0/nvlink refused 'gpu=0 nvlink=17 down': {strerror}; "
        "applied: 'gpu=0 xid=48'; not applied: 'gpu=0 nvlink=17 down', 'gpu=1 temperature=91'"
    )
    assert node.read("gpu0/inject_xid").startswith("48 "), "the first command was applied"
    assert node.read("gpu1/temperature") != "91\n", "the one after the refusal was not"
    assert not events(cluster, "InjectionApplied")
    ann = wait_until(lambda: (a := annotations(cluster)) and decisions.ANNOTATION_REJECTED in a and a, "the corrected record")
    assert ann[decisions.ANNOTATION_APPLIED].endswith(" gpu=0 xid=48"), "applied names only what was written"
    assert "not applied: 'gpu=0 nvlink=17 down', 'gpu=1 temperature=91'" in ann[decisions.ANNOTATION_REJECTED]


def test_watch_that_ends_and_watch_that_expires(running):
    cluster, node, _ = running
    wait_until(lambda: cluster.condition(decisions.CONDITION_TYPE), "the first health report")
    gets = lambda: sum(1 for m, p in cluster.requests if m == "GET" and p.startswith("/api/v1/nodes/"))  # noqa: E731
    watches = lambda: sum(1 for m, p in cluster.requests if "watch=true" in p)  # noqa: E731
    cluster.end_watches, cluster.expire_watches = 1, 1
    n_gets, n_watches = gets(), watches()
    wait_until(lambda: cluster.expire_watches == 0 and watches() >= n_watches + 3, "watches after the restarts")
    assert gets() > n_gets, "a 410 Gone makes the agent list (GET) again"
    cluster.heartbeat()
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=1 ecc=dbe 2")
    wait_until(lambda: events(cluster, "InjectionApplied"), "the injection after the restarts")
    assert "volatile dbe 2" in node.read("gpu1/inject_ecc")


# --- scenarios across a node pool ----------------------------------------------------------------

POOL = ("gpu-node-1", "gpu-node-2")


def _mark_times(node, name: str) -> list[float]:
    """When each `scenario NAME step` line of the node's event log was applied (epoch seconds)."""
    out = []
    for line in node.read("node/events").splitlines():
        stamp, _, text = line.partition(" ")
        if text.startswith(f"scenario {name} step "):
            out.append(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp())
    return out


def _reasons_seen(cluster, node_name: str) -> list[str]:
    """The MokkaScenario condition's reasons in the order the node's history shows them."""
    out = []
    for snap in cluster.history:
        if snap["metadata"]["name"] != node_name:
            continue
        c = next((c for c in snap["status"]["conditions"] if c["type"] == decisions.SCENARIO_CONDITION), None)
        if c and (not out or out[-1] != c["reason"]):
            out.append(c["reason"])
    return out


def test_two_nodes_start_a_configmap_scenario_at_one_wall_clock_time(start_agent):
    agents = [start_agent("h100", 2, node_name=n) for n in POOL]
    cluster = agents[0][0]
    for name in POOL:
        wait_until(lambda: cluster.condition(decisions.SCENARIO_CONDITION, name), f"{name}'s first report")
    for _, node, _ in agents:
        node.expect_warning(r"Xid")
    cluster.set_configmap("mokkafs", "stories", {"short.yaml": SHORT_YAML})
    start = round(time.time() + 4, 3)
    start_text = scenario_model.start_text(start)
    value = f"configmap=stories/short.yaml start={start_text}"
    cluster.annotate_all(decisions.ANNOTATION_SCENARIO, value)  # kubectl annotate nodes -l pool=a ...
    for name in POOL:
        (ev,) = wait_until(lambda: events(cluster, "ScenarioStarted", name), f"{name}'s ScenarioStarted")
        assert ev["message"] == f"short (seed 0, speed 1): 2 commands over 1 s, starting at {start_text}"
    assert time.time() < start, "both accepted before the shared start"
    for name in POOL:
        wait_until(lambda: events(cluster, "ScenarioFinished", name), f"{name}'s ScenarioFinished", timeout=20)
    firsts = []
    for (_, node, _), name in zip(agents, POOL):
        times = _mark_times(node, "short")
        # at their times, never early (how late, 1-5 ms, is a benchmark's to say, not a test's)
        assert len(times) == 2 and abs(times[1] - times[0] - 1.0) < 0.25, times
        assert -0.005 < times[0] - start < 0.25, (name, times[0] - start)
        firsts.append(times[0])
        assert "xid 31" in node.read("gpu0/events") and node.read("node/scenario").startswith("state: idle\n")
        reasons = _reasons_seen(cluster, name)  # Running only if a resync fell within its 1 s
        assert reasons[:2] == ["NoScenario", "ScenarioWaiting"] and reasons[-1] == "ScenarioFinished", reasons
        cond = cluster.condition(decisions.SCENARIO_CONDITION, name)
        assert (cond["status"], cond["message"]) == ("False", "short finished (2 commands)")
        ann = annotations_of(cluster, name)
        assert decisions.ANNOTATION_SCENARIO not in ann and ann[decisions.ANNOTATION_SCENARIO_ACCEPTED].endswith(f" {value}")
    assert abs(firsts[0] - firsts[1]) < 0.25, "the two nodes' timelines line up"


def annotations_of(cluster, node_name: str) -> dict:
    return cluster.snapshot(node_name)["metadata"].get("annotations") or {}


def test_a_scenario_a_node_cannot_take_is_refused_whole_there(start_agent, expect_log):
    # A mixed pool: the T4 has no NVLink, so the scenario is refused whole there (not even its
    # first step, an Xid), with the line and step in an Event; the H100 runs it.
    expect_log(r"rejected mokkafs.io/scenario")
    h100 = start_agent("h100", 2, node_name=POOL[0])
    t4 = start_agent("t4", 1, node_name=POOL[1])
    cluster = h100[0]
    h100[1].expect_warning(r"Xid")
    for name in POOL:
        wait_until(lambda: cluster.condition(decisions.SCENARIO_CONDITION, name), f"{name}'s first report")
    # First a malformed file: refused on every node, the reason in each one's Event.
    cluster.set_configmap("mokkafs", "stories", {"bad.yaml": "name: bad\nsteps:\n  - at: 1s\n    gpu: 0\n    command: xid 4 8\n",
                                                 "flap.yaml": NVLINK_YAML})  # fmt: skip
    cluster.annotate_all(decisions.ANNOTATION_SCENARIO, "configmap=stories/bad.yaml")
    for name in POOL:
        (ev,) = wait_until(lambda: events(cluster, "ScenarioRejected", name), f"{name}'s rejection")
        assert ev["type"] == "Warning" and ev["message"] == (
            "'configmap=stories/bad.yaml': bad.yaml:5: step 1: 'xid 4 8' on gpu0: Xid must be a decimal number, got '4 8'"
        )
    before = t4[1].read("node/events")
    cluster.annotate_all(decisions.ANNOTATION_SCENARIO, "configmap=stories/flap.yaml speed=10")
    (ev,) = wait_until(lambda: events(cluster, "ScenarioRejected", POOL[1])[1:], "the T4's rejection")
    assert ev["message"] == (
        "'configmap=stories/flap.yaml speed=10': flap.yaml:8: step 2: 'nvlink 2 down' on gpu0: t4 has 0 NVLinks, no link 2"
    )
    assert annotations_of(cluster, POOL[1])[decisions.ANNOTATION_SCENARIO_REJECTED].endswith(ev["message"].split(": ", 1)[1])
    wait_until(lambda: events(cluster, "ScenarioFinished", POOL[0]), "the H100's ScenarioFinished")
    assert "2 down" in h100[1].read("gpu0/nvlink")
    assert t4[1].read("node/events") == before == "", "nothing of it applied on the T4"
    assert t4[1].read("node/scenario") == "state: idle\nlast: none\n"
    assert not events(cluster, "ScenarioStarted", POOL[1])


def test_a_shipped_scenario_by_name_then_stop(start_agent, expect_log):
    expect_log(r"rejected mokkafs.io/scenario")
    cluster, node, _ = start_agent("h100", 8)
    wait_until(lambda: cluster.condition(decisions.SCENARIO_CONDITION), "the first report")
    cluster.set_configmap("other", "stories", {"x.yaml": SHORT_YAML})  # not the agent's namespace
    cluster.set_configmap("mokkafs", "big", {"huge.yaml": SHORT_YAML + "#" * 70000})
    for k, (value, reason) in enumerate([
        ("no-such-story", "no shipped scenario 'no-such-story' (mokka scenario list)"),
        ("configmap=stories/x.yaml", "configmap mokkafs/stories: not found"),
        ("configmap=big/short.yaml", "configmap mokkafs/big has no key 'short.yaml' (keys: huge.yaml)"),
        ("configmap=big/huge.yaml", "huge.yaml: longer than 65536 bytes"),
        ("Bad/Name", "expected a shipped scenario's name or 'configmap=NAME/KEY', then seed=N, speed=X, start=UTC-TIME"),
    ]):  # fmt: skip
        cluster.annotate(decisions.ANNOTATION_SCENARIO, value)
        rejected = wait_until(lambda: events(cluster, "ScenarioRejected")[k:], f"the rejection of {value!r}")
        assert rejected[0]["message"] == f"{value!r}: {reason}"
    assert node.read("node/scenario") == "state: idle\nlast: none\n" and node.read("node/events") == ""
    cluster.annotate(decisions.ANNOTATION_SCENARIO, "thermal-runaway seed=2")
    (ev,) = wait_until(lambda: events(cluster, "ScenarioStarted"), "ScenarioStarted")
    assert ev["message"].startswith("thermal-runaway (seed 2, speed 1): ") and ev["message"].endswith("starting now")
    cond = wait_until(lambda: (c := cluster.condition(decisions.SCENARIO_CONDITION))["status"] == "True" and c, "running")
    assert cond["reason"] == "ScenarioRunning" and cond["message"].startswith("thermal-runaway (seed 2) at step ")
    # One at a time: a second one is refused while the first runs.
    cluster.annotate(decisions.ANNOTATION_SCENARIO, "gsp-error")
    wait_until(lambda: events(cluster, "ScenarioRejected")[5:], "the busy rejection")
    assert "scenario thermal-runaway runs already" in events(cluster, "ScenarioRejected")[5]["message"]
    cluster.annotate(decisions.ANNOTATION_SCENARIO, "stop")
    (ev,) = wait_until(lambda: events(cluster, "ScenarioStopped"), "ScenarioStopped")
    assert ev["message"].startswith("thermal-runaway stopped at step ")
    cond = cluster.condition(decisions.SCENARIO_CONDITION)
    assert (cond["status"], cond["reason"]) == ("False", "ScenarioStopped")
    assert node.read("node/scenario").startswith("state: idle\nlast: thermal-runaway stopped")


# --- `mokka agent` as a process: mounts, writes the node files, applies, unmounts on SIGTERM ----


def write_kubeconfig(cluster, tmp_path) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": cluster.base_url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }))  # fmt: skip
    return kubeconfig


def test_mokka_agent_command(cluster, tmp_path):
    kubeconfig = write_kubeconfig(cluster, tmp_path)
    cluster.node["metadata"]["labels"].update({decisions.LABEL_PROFILE: "t4", decisions.LABEL_GPUS: "2"})
    mnt, state = tmp_path / "root", tmp_path / "state"
    cdi, nfd = tmp_path / "cdi" / "nvidia.yaml", tmp_path / "features.d" / "mokkafs"
    env = dict(os.environ, MOKKA_RUNTIME_DIR=str(tmp_path / "run"), NODE_NAME="gpu-node-1", MOKKA_PROFILE="h100",
               POD_NAMESPACE="sim", MOKKA_FGO_NAMESPACE="gpu-operator")  # fmt: skip
    cluster.set_configmap("sim", "stories", {"warm.yaml": "name: warm\nsteps:\n  - at: 0s\n    gpu: 0\n    command: temperature 77\n"})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [*mokka_cmd(), "agent", "--kubeconfig", str(kubeconfig), "--mountpoint", str(mnt), "--state-dir", str(state),
         "--cdi-spec", str(cdi), "--nfd-features", str(nfd), "--resync", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: nfd.exists() or proc.poll() is not None, "the NFD feature file", timeout=60)
        assert proc.poll() is None, proc.stdout.read()
        assert (mnt / "node/profile").read_text() == "t4\n", "the Node's labels chose the profile"
        assert (mnt / "node/gpu_count").read_text() == "2\n"
        spec = yaml.safe_load(cdi.read_text())
        uuids = [line.split(": ")[1] for i in range(2) for line in (mnt / f"gpu{i}/info").read_text().splitlines() if line.startswith("uuid: ")]
        assert [d["name"] for d in spec["devices"]] == ["0", uuids[0], "1", uuids[1], "all"]
        assert "pci-10de.present=true\n" in nfd.read_text() and "mokkafs.profile=t4\n" in nfd.read_text()
        cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=1 temperature=91")
        wait_until(lambda: events(cluster, "InjectionApplied"), "the injection")
        assert (mnt / "gpu1/temperature").read_text() == "91\n"
        # Scenario ConfigMaps are read in the pod's namespace (POD_NAMESPACE).
        cluster.annotate(decisions.ANNOTATION_SCENARIO, "configmap=stories/warm.yaml")
        wait_until(lambda: events(cluster, "ScenarioFinished"), "the scenario from the ConfigMap")
        assert (mnt / "gpu0/temperature").read_text() == "77\n"
        # MOKKA_FGO_NAMESPACE: the node's profile for fake-gpu-operator (2 x t4: not t4's own count)
        wait_until(lambda: ("gpu-operator", "gpu-profile-t4-x2") in cluster.configmaps, "the profile ConfigMap")
        assert fgo_resolve(cluster.configmaps, "gpu-operator", "t4-x2")["count"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    assert proc.returncode == 0, out
    assert not Path(mnt / "node").exists(), "unmounted on SIGTERM"
    assert "Traceback" not in out and " WARNING " not in out, out


@pytest.mark.parametrize("labels, said", [
    # A combination the CLI refuses: 8 GB200s (they sit 4 to a node).
    ({decisions.LABEL_PROFILE: "gb200", decisions.LABEL_GPUS: "8"}, "boards sit at most 4 to a node"),
    # A label the agent itself refuses.
    ({decisions.LABEL_GPUS: "99"}, "bad GPU count '99'"),
])
def test_settings_no_node_can_be_mounted_from_say_why_on_the_node(cluster, tmp_path, labels, said):
    """The agent exits (the kubelet restarts it; a corrected label takes effect then) and says why
    in its log and in one Warning Event on the Node, where `kubectl describe node` shows it; before,
    only the container's log said it, and the pod crash-looped with the Node silent."""
    kubeconfig = write_kubeconfig(cluster, tmp_path)
    cluster.node["metadata"]["labels"].update(labels)
    env = dict(os.environ, MOKKA_RUNTIME_DIR=str(tmp_path / "run"), NODE_NAME="gpu-node-1")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    r = subprocess.run([*mokka_cmd(), "agent", "--kubeconfig", str(kubeconfig), "--mountpoint", str(tmp_path / "root"),
                        "--state-dir", str(tmp_path / "state"), "--cdi-spec", "", "--nfd-features", ""],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr
    refused = events(cluster, decisions.REASON_NODE_REFUSED)
    assert len(refused) == 1 and refused[0]["type"] == "Warning", cluster.events
    assert refused[0]["message"].startswith("no node mounted: ") and said in refused[0]["message"], refused
    assert not (tmp_path / "root" / "node").exists()


class AgentProcess:
    """`mokka agent` as the DaemonSet's container runs it (mount, CDI spec, NFD file, watch),
    started and stopped (SIGTERM) again and again on one state directory, as the kubelet
    restarts the pod. Against the fake API server: the restart with new labels is what is
    tested, and a plain process restarts in a second where a kubelet's back-off takes tens;
    the real-cluster tier relabels a Node under the DaemonSet itself."""

    def __init__(self, cluster, tmp_path: Path, extra_env: dict | None = None) -> None:
        self.kubeconfig = write_kubeconfig(cluster, tmp_path)
        self.mnt, self.state = tmp_path / "root", tmp_path / "state"
        self.cdi, self.nfd = tmp_path / "cdi" / "nvidia.yaml", tmp_path / "features.d" / "mokkafs"
        self.env = dict(os.environ, MOKKA_RUNTIME_DIR=str(tmp_path / "run"), NODE_NAME=cluster.first, **(extra_env or {}))
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc: subprocess.Popen | None = None
        self.output = ""

    def start(self) -> None:
        """Start and wait for the node: the NFD file is written once the mount answers."""
        self.nfd.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [*mokka_cmd(), "agent", "--kubeconfig", str(self.kubeconfig), "--mountpoint", str(self.mnt),
             "--state-dir", str(self.state), "--cdi-spec", str(self.cdi), "--nfd-features", str(self.nfd),
             "--resync", "1"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        wait_until(lambda: self.nfd.exists() or self.proc.poll() is not None, "the NFD feature file", timeout=60)
        if self.proc.poll() is not None:
            self.output = self.proc.stdout.read()
            raise AssertionError(f"mokka agent exited {self.proc.returncode} at start:\n{self.output}")

    def stop(self) -> str:
        """SIGTERM, as the kubelet stops a pod; the agent unmounts and exits 0. Its output."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
        assert self.proc.returncode == 0, out
        assert not Path(self.mnt / "node").exists(), "unmounted on SIGTERM"
        self.output = out
        return out


@pytest.fixture
def agent_process(cluster, tmp_path):
    procs = []

    def make(**kw) -> AgentProcess:
        procs.append(AgentProcess(cluster, tmp_path, **kw))
        return procs[-1]

    yield make
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
            p.proc.communicate()
            subprocess.run(["fusermount3", "-u", "-z", str(p.mnt)], capture_output=True)


def test_a_new_profile_starts_a_new_node(cluster, agent_process):
    """A Node relabelled to another GPU count (or profile) and its agent restarted: the state
    directory, made for the old node, is moved aside to state/previous with one log line and
    one SimulatedNodeChanged Event, and the new node mounts fresh. The same labels keep the
    state (faults survive a restart), and the old node's faults never come back."""
    labels = cluster.node["metadata"]["labels"]
    labels.update({decisions.LABEL_PROFILE: "t4", decisions.LABEL_GPUS: "2"})
    agent = agent_process()
    agent.start()
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=1 xid=79")
    wait_until(lambda: events(cluster, "InjectionApplied"), "the injection")
    assert (agent.mnt / "gpu1/lost").read_text() == "1\n"
    agent.stop()

    agent.start()  # a restart, nothing changed: the same node, its fault still there
    assert (agent.mnt / "gpu1/lost").read_text() == "1\n"
    out = agent.stop()
    assert not events(cluster, decisions.REASON_NODE_CHANGED) and "previous" not in out
    assert not (agent.state / "previous").exists()

    labels[decisions.LABEL_GPUS] = "1"  # kubectl label node --overwrite mokkafs.io/gpus=1
    agent.start()
    assert (agent.mnt / "node/gpu_count").read_text() == "1\n"
    assert "health: healthy" in (agent.mnt / "gpu0/info").read_text()
    saved = json.loads((agent.state / "previous" / "node.json").read_text())
    assert (saved["node"]["profile"], saved["node"]["gpus"]) == ("t4", 2), "the old node's files, for reading"
    assert (agent.state / "previous" / "events.log").read_text().count("79") >= 1
    assert json.loads((agent.state / "node.json").read_text())["node"]["gpus"] == 1
    (ev,) = events(cluster, decisions.REASON_NODE_CHANGED)
    assert ev["type"] == "Normal" and ev["involvedObject"]["name"] == cluster.first
    said = (f"this Node is now 1 x t4 (was 2 x t4): the previous node's state moved to {agent.state / 'previous'}; "
            "mounting a fresh node")  # fmt: skip
    assert ev["message"] == said
    out = agent.stop()
    assert [line for line in out.splitlines() if "previous" in line] == [
        line for line in out.splitlines() if line.endswith(f"{cluster.first}: {said}")], out
    assert out.count(said) == 1 and "Traceback" not in out and " WARNING " not in out, out

    labels[decisions.LABEL_GPUS] = "2"  # back to two GPUs: a fresh node again, not the old one
    agent.start()
    assert (agent.mnt / "gpu1/lost").read_text() == "0\n", "the old node's fault does not come back"
    assert len(events(cluster, decisions.REASON_NODE_CHANGED)) == 2
    assert json.loads((agent.state / "previous" / "node.json").read_text())["node"]["gpus"] == 1, "one generation kept"
    agent.stop()


def test_the_host_sees_the_state_directory_where_the_hostpath_puts_it(cluster, agent_process, tmp_path):
    """A DaemonSet whose hostPath (here tmp/host/...) is not its mountPath (tmp/state, tmp/root):
    node/state_dir, the driver root's run/mokka link and the CDI spec name the host's paths
    (MOKKA_HOST_STATE_DIR, MOKKA_HOST_MOUNTPOINT), so `mokka env` on the host finds the driver;
    the agent itself still reaches the daemon by its own path. Against the fake API server: what
    is tested is the mount and the files, and two views of one directory are made here with
    links; the real-cluster tier runs the DaemonSet on a real hostPath."""
    host = tmp_path / "host"
    cluster.node["metadata"]["labels"].update({decisions.LABEL_PROFILE: "t4", decisions.LABEL_GPUS: "2"})
    agent = agent_process(extra_env={"MOKKA_HOST_STATE_DIR": str(host / "state"),
                                     "MOKKA_HOST_MOUNTPOINT": str(host / "root")})  # fmt: skip
    agent.start()
    mnt = agent.mnt
    assert (mnt / "node/state_dir").read_text() == f"{host / 'state'}\n"
    assert os.readlink(mnt / "driver/run/mokka") == str(host / "state")
    # The agent runs as root: the node's socket itself is bound there (docs/containers.md), no
    # link to name a path; the host sees the bind through the hostPath's propagation.
    sock, node_sock = os.lstat(mnt / "driver/run/nvidia-persistenced/socket"), os.stat(agent.state / "node.sock")
    assert stat.S_ISSOCK(sock.st_mode) and (sock.st_dev, sock.st_ino) == (node_sock.st_dev, node_sock.st_ino)
    spec = yaml.safe_load(agent.cdi.read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/run/mokka"] == str(host / "state")
    assert mounts["/usr/bin/nvidia-smi"] == str(host / "root/driver/usr/bin/nvidia-smi")
    # The hook the runtime runs on the host, from the host's view of the driver root.
    (hook,) = spec["containerEdits"]["hooks"]
    assert hook["path"] == str(host / "root/driver/usr/bin/mokka-cdi-hook")
    assert hook["args"][1:] == ["proc", str(host / "root/proc")]
    # `all` is the GPUs and the MIG monitor capability, whose node the driver makes on any board
    # (a T4's grants nothing: it has no MIG device).
    every = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}["all"]
    assert [n["path"] for n in every] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap2"]
    assert every[-1]["hostPath"] == str(host / "root/dev/nvidia-caps/nvidia-cap2")
    nodes = [n["hostPath"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert nodes and all(n.startswith(f"{host / 'root'}/dev/nvidia") for n in nodes), nodes
    # The host's paths do not exist in here (the agent's container): a setting still reaches
    # the daemon's control socket, by the agent's own --state-dir.
    cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=0 power_limit=65")
    wait_until(lambda: events(cluster, "InjectionApplied") or events(cluster, "InjectionFailed"), "the setting")
    assert not events(cluster, "InjectionFailed"), events(cluster, "InjectionFailed")
    assert "power_limit: 65" in (mnt / "gpu0/config").read_text()
    # The host's view of the same directories: what `mokka env` there says works.
    host.mkdir()
    (host / "state").symlink_to(agent.state)
    (host / "root").symlink_to(mnt)
    shell = f'eval "$({shlex.join(mokka_cmd())} env --root {host / "root"})" && echo "$MOKKA_STATE" && nvidia-smi -L'
    res = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60, env=agent.env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == str(host / "state" / "state")
    assert [line.split(":")[0] for line in lines[1:]] == ["GPU 0", "GPU 1"], res.stdout
    agent.stop()


def test_the_latency_bench_runs():
    """bench/bench_agent.py measures the agent's share of annotation-to-fault latency; this runs it
    briefly so that it keeps working (its numbers are the bench's to print, not a test's to
    judge). Against the fake API server, its default: the real-cluster tier passes --kubeconfig."""
    res = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "bench_agent.py"),
                          "--n", "3", "--profile", "t4", "--gpus", "1"],
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if "watch event -> control write done" in line
            or "floor: a bare" in line]  # fmt: skip
    assert len(rows) == 4 and all(float(r[-3]) > 0 for r in rows), res.stdout


def test_the_hosts_paths_are_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOKKA_HOST_STATE_DIR", raising=False)
    assert watch.host_path(None, "MOKKA_HOST_STATE_DIR", "state") == str(tmp_path / "state"), "unset: the agent's own"
    assert watch.host_path("/data//mokkafs/state/", "MOKKA_HOST_STATE_DIR", "state") == "/data/mokkafs/state"
    monkeypatch.setenv("MOKKA_HOST_STATE_DIR", "data/state")
    with pytest.raises(ValueError, match="MOKKA_HOST_STATE_DIR='data/state': the host's path must be absolute"):
        watch.host_path(None, "MOKKA_HOST_STATE_DIR", "state")


def test_retire_moves_everything_but_the_lock_and_waits_for_no_daemon(tmp_path):
    """persist.retire on its own: the directory's files (the daemon's log and sockets too) go to
    previous/, an older previous/ is replaced, node.json last; a directory a daemon holds is
    left alone."""
    import fcntl

    from mokkafs.daemon import persist

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    for name in ("node.json", "gpu0.json", "events.log", "daemon.log"):
        (state / name).write_text(name)
    (state / "mirror").mkdir()
    (state / "previous").mkdir()
    (state / "previous" / "node.json").write_text("older")
    (state / ".previous.new").mkdir()  # a retirement cut short
    (state / ".previous.new" / "gpu9.json").write_text("x")
    assert persist.retire(state) == state / "previous"
    assert sorted(os.listdir(state)) == ["daemon.lock", "previous"]
    assert sorted(os.listdir(state / "previous")) == ["daemon.log", "events.log", "gpu0.json", "mirror", "node.json"]
    assert (state / "previous" / "node.json").read_text() == "node.json"
    assert persist.saved_record(state) is None, "what the next daemon finds: a fresh directory"
    with open(state / "daemon.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (state / "node.json").write_text("{}")
        with pytest.raises(RuntimeError, match="in use by a mokka daemon"):
            persist.retire(state)
    assert (state / "node.json").exists()


def test_node_changed_says_what_was_and_what_is():
    def rec(**node):
        return {"format": 1, "node": {"profile": "h100", "gpus": 8, "hostname": "n1", **node}}

    assert decisions.node_changed(rec(), rec(profile="a100", gpus=4), "/s/previous") == (
        "this Node is now 4 x a100 (was 8 x h100): the previous node's state moved to /s/previous; mounting a fresh node")
    assert decisions.node_changed(rec(node="pcie-8"), rec(), "/p").startswith(
        "this Node is now 8 x h100 (was 8 x h100, composition pcie-8): ")
    assert decisions.node_changed(rec(hostname="old"), rec(), "/p").startswith(
        "this Node is now 8 x h100, hostname n1 (was 8 x h100, hostname old): ")
    assert "(was a node this release does not describe)" in decisions.node_changed(["x"], rec(), "/p")


# --- the node's profile for fake-gpu-operator (mokkafs/agent/fgo.py) ------------------------------


def fgo_resolve(configmaps: dict, namespace: str, pool_profile: str) -> dict:
    """What fake-gpu-operator's status-updater makes of a node pool `gpu: {profile: NAME}`, as its
    Go source reads the ConfigMap: profile.Load (name `gpu-profile-` + NAME in its namespace, key
    `profile.yaml`, YAML), profile.Extract (device_defaults.name / architecture /
    memory.total_bytes in MiB, system.driver_version / cuda_version, DeviceCount: device_count,
    else len(devices)) and profile.PCITopology (each device's NUMA node through the
    pcie_topology root complexes, bus ids matched case-insensitively)
    (run-ai/fake-gpu-operator internal/common/profile/profile.go, constants.go)."""
    cm = configmaps[(namespace, "gpu-profile-" + pool_profile)]
    doc = yaml.safe_load(cm["data"]["profile.yaml"])
    dd, system = doc.get("device_defaults") or {}, doc.get("system") or {}
    count = doc.get("device_count") or len(doc.get("devices") or [])
    numa_of = {bdf.lower(): rc["numa_node"] for rc in doc["pcie_topology"]["root_complexes"] for bdf in rc["devices"]}
    return {
        "labels": cm["metadata"].get("labels") or {},
        "product": dd.get("name"), "architecture": dd.get("architecture"),
        "memory_mib": (dd.get("memory") or {}).get("total_bytes", 0) // (1024 * 1024),
        "driver": system.get("driver_version"), "cuda": system.get("cuda_version"), "count": count,
        "numa": {d["index"]: numa_of[d["pci"]["bus_id"].lower()] for d in doc["devices"]},
    }


def test_fgo_configmap_is_what_fake_gpu_operator_reads():
    """Pure: name, labels, key and the fields fake-gpu-operator extracts; deterministic."""
    from mokkafs.agent import fgo

    p = load_profile("h100-nvl")
    devs = [fgo.FgoDevice(0, 0, "00000000:18:00.0", 0), fgo.FgoDevice(1, 1, "00000000:9A:00.0", 1)]
    cm = fgo.configmap(p, devs, "550.54.14", "12.4", "gpu-operator")
    assert cm["metadata"]["name"] == "gpu-profile-h100-nvl" and cm["metadata"]["namespace"] == "gpu-operator"
    assert cm["metadata"]["labels"]["fake-gpu-operator/gpu-profile"] == "true"
    assert cm["metadata"]["labels"]["run.ai/gpu-profile"] == "true"
    got = fgo_resolve({("gpu-operator", cm["metadata"]["name"]): cm}, "gpu-operator", "h100-nvl")
    assert got["product"] == "NVIDIA H100 NVL" and got["architecture"] == "hopper"
    assert got["memory_mib"] == p.memory.total_mib == 95830
    assert (got["driver"], got["cuda"], got["count"], got["numa"]) == ("550.54.14", "12.4", 2, {0: 0, 1: 1})
    doc = yaml.safe_load(cm["data"]["profile.yaml"])
    assert doc["device_defaults"]["pci"]["device_id"] == 0x232110DE
    assert doc["device_defaults"]["compute_capability"] == {"major": 9, "minor": 0}
    assert doc["nvlink"]["links_per_gpu"] == 12
    assert fgo.configmap(p, devs, "550.54.14", "12.4", "gpu-operator") == cm  # no UUIDs, no times
    # another GPU count than the profile's: its own name, so the two never overwrite each other
    assert fgo.configmap(p, devs[:1], "550.54.14", "12.4", "x")["metadata"]["name"] == "gpu-profile-h100-nvl-x1"
    assert "nvlink" not in yaml.safe_load(fgo.configmap(load_profile("l4"), devs[:1], "550.90.07", "12.4", "x")
                                          ["data"]["profile.yaml"])
    # The memory as the node's NVML reports it at its driver: before 510 no reserved share, and
    # a total without it (model/dynamics.py, framebuffer).
    a100 = load_profile("a100")
    mem = yaml.safe_load(fgo.configmap(a100, devs[:1], "470.256.02", "11.4", "x")["data"]["profile.yaml"])
    assert mem["device_defaults"]["memory"]["total_bytes"] == 40536 << 20
    assert mem["device_defaults"]["memory"]["reserved_bytes"] == 0


def _fgo_agent(cluster, node_factory, node_name: str, profile: str, gpus: int | None, namespace="gpu-operator"):
    if node_name not in cluster.nodes:
        cluster.add_node(node_name)
    node = node_factory(profile=profile, gpus=gpus, name=f"mnt-{node_name}")
    a = watch.Agent(core_api(cluster.base_url), node_name, watch.MountedTree(str(node.mnt)), resync_s=1,
                    fgo_namespace=namespace)
    t = threading.Thread(target=a.run, daemon=True)
    t.start()
    return node, a, t


def _stop(*agents):
    for a, t in agents:
        a.stopping = True
        t.join(timeout=10)
        assert not t.is_alive()


def test_agents_publish_the_profile_once_for_a_mixed_cluster(cluster, node_factory):
    """Two mokkafs nodes of one profile publish one ConfigMap (created, then unchanged); a node
    of another size publishes its own; a stale one (an older mokkafs) is replaced. What
    fake-gpu-operator resolves from it equals what the mounted node shows."""
    node1, a1, t1 = _fgo_agent(cluster, node_factory, "gpu-node-1", "a100-80gb", None)
    try:
        wait_until(lambda: a1.fgo_published, "the first agent's ConfigMap")
        assert a1.fgo_published == "created"
        got = fgo_resolve(cluster.configmaps, "gpu-operator", "a100-80gb")
        assert got["product"] == node1.read("gpu0/info").splitlines()[0].split(": ")[1] == "NVIDIA A100-SXM4-80GB"
        assert got["count"] == int(node1.read("node/gpu_count")) == 4
        assert got["driver"] == node1.read("node/driver_version").strip() == "555.42.02"
        assert got["numa"] == {i: int(watch.parse_info(node1.read(f"gpu{i}/info"))["numa_node"]) for i in range(4)}
        node2, a2, t2 = _fgo_agent(cluster, node_factory, "gpu-node-2", "a100-80gb", None)
        node3, a3, t3 = _fgo_agent(cluster, node_factory, "gpu-node-3", "a100-80gb", 2)
        wait_until(lambda: a2.fgo_published and a3.fgo_published, "the other agents' ConfigMaps")
        assert (a2.fgo_published, a3.fgo_published) == ("unchanged", "created")
        assert fgo_resolve(cluster.configmaps, "gpu-operator", "a100-80gb-x2")["count"] == 2
        assert [w for w in cluster.configmap_writes] == [
            ("POST", "gpu-operator", "gpu-profile-a100-80gb"), ("POST", "gpu-operator", "gpu-profile-a100-80gb-x2")]
        _stop((a2, t2), (a3, t3))
        # an older content under the same name (another mokkafs release, a hand edit): replaced
        cm = cluster.configmaps[("gpu-operator", "gpu-profile-a100-80gb")]
        cm["data"]["profile.yaml"] = "version: \"1.0\"\n"
        cm["metadata"]["labels"]["team"] = "ml"
        node4, a4, t4 = _fgo_agent(cluster, node_factory, "gpu-node-4", "a100-80gb", None)
        wait_until(lambda: a4.fgo_published, "the replacement")
        assert a4.fgo_published == "replaced" and cluster.configmap_writes[-1][0] == "PUT"
        after = cluster.configmaps[("gpu-operator", "gpu-profile-a100-80gb")]
        assert fgo_resolve(cluster.configmaps, "gpu-operator", "a100-80gb")["count"] == 4
        assert after["metadata"]["labels"]["team"] == "ml", "labels others added are kept"
        _stop((a4, t4))
    finally:
        _stop((a1, t1))


def test_no_rbac_in_the_operator_namespace_is_a_warning_not_a_stop(cluster, node_factory, expect_log):
    expect_log(r"could not publish configmap gpu-operator/gpu-profile-l4 for fake-gpu-operator: 403")
    cluster.forbidden.add("gpu-operator")
    node, a, t = _fgo_agent(cluster, node_factory, "gpu-node-1", "l4", None)
    try:
        wait_until(lambda: sum(1 for r in cluster.requests if r[0] == "POST" and "configmaps" in r[1]) >= 2,
                   "a second try on the next pass")
        assert a.fgo_published is None and ("gpu-operator", "gpu-profile-l4") not in cluster.configmaps
        cluster.annotate(decisions.ANNOTATION_INJECT, "gpu=0 temperature=70")  # the agent still works
        wait_until(lambda: events(cluster, "InjectionApplied"), "the injection")
        cluster.forbidden.clear()  # RBAC granted later: published on the next pass
        wait_until(lambda: a.fgo_published == "created", "the ConfigMap once allowed")
    finally:
        _stop((a, t))
