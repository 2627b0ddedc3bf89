"""Level 0: scenarios as data (model/scenario.py) — the schema, errors that name the file, the line
and the step, and the pure, seeded expansion into a plan of commands."""
from __future__ import annotations

import pytest

from mokkafs.model import Node, compose
from mokkafs.model.events import InjectXid, Pin, Reset
from mokkafs.model.scenario import (
    MAX_SCENARIO_BYTES,
    RunScenario,
    ScenarioError,
    StopScenario,
    expand,
    load_text,
    parse_request,
    request_bytes,
)
from mokkafs.profiles import load_profile

T0 = 1_800_000_000.0

STORY = """\
name: demo
seed: 7
end: reset
steps:
  - at: 0s
    gpu: 0
    ramp: {from: 45, to: 92, over: 10m, every: 1m}
    command: temperature
  - after: 30s
    random: 2
    command: xid 48
    every: 30s
    times: 3
    jitter: 2s
  - at: 1m
    gpus: [0, 3]
    command: nvlink 2 down
"""


def plan(text: str, seed: int | None = None, gpus: int = 8, where: str = "s.yaml", profile: str = "h100"):
    node = Node(compose(load_profile(profile), gpus=gpus), T0)
    return expand(load_text(text, where), seed, gpus, node.validate)


def lines(p) -> list[str]:
    return [f"{x.offset:g} {x.step} {x.command}" for x in p]


def test_expansion_of_each_kind_of_step():
    p = plan(STORY)
    ramp = [x for x in p if x.step == 1]
    # 45 -> 92 over ten minutes, one pin a minute, both ends included
    assert [(x.offset, x.command.event) for x in ramp][:2] == [(0, Pin(0, "temperature", (45,))), (60, Pin(0, "temperature", (50,)))]
    assert ramp[-1].offset == 600 and ramp[-1].command.event == Pin(0, "temperature", (92,))
    assert len(ramp) == 11
    xids = [x for x in p if x.step == 2]
    assert len(xids) == 6  # 3 times on 2 GPUs
    picked = sorted({x.command.target.index for x in xids})
    assert len(picked) == 2
    starts = sorted({x.offset for x in xids})
    # after the ramp's last pin (600 s) + 30 s, every 30 s, each with 0..2 s of jitter
    for k, t in enumerate(starts):
        assert 630 + 30 * k <= t <= 630 + 30 * k + 2
    assert [str(x.command) for x in p if x.step == 3] == ["gpu=0 nvlink 2 down", "gpu=3 nvlink 2 down"]
    # end: reset, after the last step
    assert p[-1].command.event == Reset(None) and p[-1].offset == starts[-1]
    assert [x.offset for x in p] == sorted(x.offset for x in p)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    assert lines(plan(STORY)) == lines(plan(STORY))
    assert lines(plan(STORY, seed=7)) == lines(plan(STORY))  # the file's seed is 7
    others = {tuple(lines(plan(STORY, seed=s))) for s in range(5)}
    assert len(others) > 1


def test_a_plan_is_pinned_across_machines():
    """random.Random(seed) is the same generator everywhere: this exact draw is part of the
    contract (a scenario file and seed name one sequence of events)."""
    xids = [f"{x.offset:g} {x.command}" for x in plan(STORY) if x.step == 2]
    assert xids == [
        "630.79 gpu=1 xid 48",
        "630.79 gpu=5 xid 48",
        "660.097 gpu=1 xid 48",
        "660.097 gpu=5 xid 48",
        "691.643 gpu=1 xid 48",
        "691.643 gpu=5 xid 48",
    ]


def test_after_counts_from_the_previous_step_and_ties_keep_file_order():
    p = plan("name: t\nsteps:\n  - at: 10s\n    gpu: 1\n    command: xid 13\n"
             "  - after: 0s\n    gpu: 0\n    command: xid 31\n  - at: 10s\n    node: true\n    command: reset\n")
    assert [(x.offset, x.command.event) for x in p] == [
        (10, InjectXid(1, 13)), (10, InjectXid(0, 31)), (10, Reset(None))
    ]


BAD = [
    # (file text, line named, part of the message)
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 9\n    command: xid 48\n", 4, "step 1: no gpu9, the node has 8 GPUs"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    command: xid 48\n  - at: 2s\n    gpu: 1\n    command: xid foo\n", 8, "step 2: 'xid foo' on gpu1: Xid must be a decimal number"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    command: nvlink 12 down\n", 5, "a100 has 12 NVLinks, no link 12"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    ramp: {from: 1, to: 300, over: 1m, every: 10s}\n    command: temperature\n", 5, "'temperature 250' on gpu1"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    every: 3s\n    command: xid 4\n", 3, "'every' and 'times' go together"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    command: xid 4\n  - gpu: 1\n    command: xid 4\n", 6, "step 2: a step has exactly one of 'at'"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    all: true\n    command: xid 4\n", 3, "exactly one target"),
    ("name: x\nsteps:\n  - at: 1 s\n    gpu: 1\n    command: xid 4\n", 3, "at: a duration is"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    comand: xid 4\n", 5, "comand: Extra inputs are not permitted"),
    ("name: x\nsteps:\n  - at: 1s\n    random: 9\n    command: xid 4\n", 4, "random: 9 GPUs asked for"),
    ("name: x\nduration: 1m\nsteps:\n  - at: 2m\n    gpu: 0\n    command: xid 4\n", 4, "after the scenario's duration"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    command: [xid\n", 6, "not YAML"),
    ("name: Bad Name\nsteps:\n  - at: 1s\n    gpu: 1\n    command: xid 4\n", 1, "name: String should match"),
    ("steps: &s\n  - at: 1s\n    gpu: 1\n    command: xid 4\nmore: *s\n", 1, "aliases are not allowed"),
    ("- 1\n- 2\n", 1, "a scenario is a mapping"),
    ("name: x\nsteps:\n  - at: 1s\n    gpu: true\n    command: xid 4\n", 4, "gpu: Input should be a valid integer"),
    ("name: x\nseed: '3'\nsteps:\n  - at: 1s\n    gpu: 0\n    command: xid 4\n", 2, "seed: Input should be a valid integer"),
]


@pytest.mark.parametrize("text,line,message", BAD)
def test_a_bad_scenario_is_refused_naming_its_line_and_step(text, line, message):
    with pytest.raises(ScenarioError) as e:
        plan(text, where="bad.yaml", profile="a100")
    assert str(e.value).startswith(f"bad.yaml:{line}:"), str(e.value)
    assert message in str(e.value), str(e.value)


def test_size_and_expansion_are_bounded():
    with pytest.raises(ScenarioError, match="longer than"):
        load_text("#" * (MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ScenarioError, match="more than 20000 commands"):
        plan("name: x\nsteps:\n  - at: 0s\n    all: true\n    command: xid 13\n    every: 1s\n    times: 5000\n")


def test_the_control_write_round_trips():
    req = parse_request(request_bytes(STORY, seed=3, speed=100, file="my story.yaml"))
    assert isinstance(req, RunScenario) and req.seed == 3 and req.speed == 100
    assert req.loaded.where == "my_story.yaml" and req.loaded.scenario.name == "demo"
    assert isinstance(parse_request(b"stop\n"), StopScenario)
    for bad in (b"go\n", b"run speed=0\n" + STORY.encode(), b"run seed=-1\n", b"\xff"):
        with pytest.raises(ScenarioError):
            parse_request(bad)
