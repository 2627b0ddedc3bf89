"""Scenarios as data (model/scenario.py) — the schema, errors that name the file, the line
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
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("model")

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


# --- utilization patterns: a step kind of their own ----------------------------------------------


def _pattern(pattern: str, extra: str = "") -> list[str]:
    return lines(plan(f"name: p\nsteps:\n  - at: 10s\n    gpu: 1\n    pattern: {pattern}\n{extra}"))


def test_idle_and_steady_hold_one_load_then_release_it():
    assert _pattern("{kind: idle, over: 5m}") == ["10 1 gpu=1 utilization 0 0", "310 1 gpu=1 utilization auto"]
    assert _pattern("{kind: steady, load: [90, 40], over: 1m, then: keep}") == ["10 1 gpu=1 utilization 90 40"]


def test_burst_is_a_square_wave_with_its_edges_on_time():
    got = _pattern("{kind: burst, high: [95, 60], low: [5, 2], period: 1m, high_for: 15s, over: 130s}")
    assert got == [
        "10 1 gpu=1 utilization 95 60", "25 1 gpu=1 utilization 5 2",
        "70 1 gpu=1 utilization 95 60", "85 1 gpu=1 utilization 5 2",
        "130 1 gpu=1 utilization 95 60",  # the last period is cut short by `over` (130 s): no low edge
        "140 1 gpu=1 utilization auto",
    ]  # fmt: skip


def test_training_fills_memory_ramps_the_load_and_dips_for_evaluation():
    got = _pattern("{kind: training, memory: [2000, 72000], load: [97, 45], warmup: 1m, every: 30s, "
                   "eval: {every: 10m, for: 1m, load: [35, 20]}, over: 25m}")  # fmt: skip
    assert got == [
        "10 1 gpu=1 memory_used 2000", "10 1 gpu=1 utilization 0 0",
        "40 1 gpu=1 memory_used 37000", "40 1 gpu=1 utilization 48 22",
        "70 1 gpu=1 memory_used 72000", "70 1 gpu=1 utilization 97 45",
        "610 1 gpu=1 utilization 35 20", "670 1 gpu=1 utilization 97 45",
        "1210 1 gpu=1 utilization 35 20", "1270 1 gpu=1 utilization 97 45",
        "1510 1 gpu=1 utilization auto", "1510 1 gpu=1 memory_used auto",
    ]  # fmt: skip


def test_after_a_pattern_counts_from_its_end():
    got = _pattern("{kind: steady, load: [50, 10], over: 10m, then: keep}",
                   "  - after: 5s\n    gpu: 0\n    command: xid 13\n")  # fmt: skip
    assert got == ["10 1 gpu=1 utilization 50 10", "615 2 gpu=0 xid 13"]


BAD_PATTERNS = [
    ("{kind: burst, high: [95, 60], low: [5, 2], period: 1m, high_for: 1m, over: 5m}", 5, "high_for must be longer than 0 s and shorter than period"),
    ("{kind: steady, load: [101, 40], over: 1m}", 5, "pattern.steady.load.0: Input should be less than or equal to 100"),
    ("{kind: steady, load: [90], over: 1m}", 5, "List should have at least 2 items"),
    ("{kind: sawtooth, over: 1m}", 5, "does not match any of the expected tags"),
    ("{kind: idle}", 5, "pattern.idle.over: Field required"),
    ("{kind: training, memory: [0, 999999], load: [97, 45], warmup: 1m, every: 30s, over: 5m}", 5, "'memory_used 500000' on gpu1: memory_used at most"),
    ("{kind: training, memory: [0, 10], load: [97, 45], warmup: 5m, every: 30s, over: 5m}", 5, "warmup must end before over"),
]


@pytest.mark.parametrize("pattern,line,message", BAD_PATTERNS)
def test_a_bad_pattern_is_refused_naming_its_line(pattern, line, message):
    with pytest.raises(ScenarioError) as e:
        plan(f"name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    pattern: {pattern}\n", where="bad.yaml")
    assert str(e.value).startswith(f"bad.yaml:{line}: step 1:"), str(e.value)
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("extra,message", [
    ("    command: xid 13\n", "exactly one of 'command' or 'pattern'"),
    ("    jitter: 5s\n", "a pattern sets its own times"),
    ("    every: 5s\n    times: 2\n", "a pattern sets its own times"),
])  # fmt: skip
def test_a_pattern_goes_alone(extra, message):
    with pytest.raises(ScenarioError, match=message):
        plan(f"name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    pattern: {{kind: idle, over: 1m}}\n{extra}")
    with pytest.raises(ScenarioError, match="exactly one of 'command' or 'pattern'"):
        plan("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n")


def test_a_shared_start_is_a_utc_time_and_travels_in_the_request():
    from mokkafs.model.events import InvalidCommand
    from mokkafs.model.scenario import parse_start, start_text

    assert parse_start("1970-01-01T00:01:00Z") == 60.0
    t = parse_start("2026-12-03T17:00:00.250Z")
    assert t == 1796317200.25 and start_text(t) == "2026-12-03T17:00:00.250Z"
    assert start_text(1796317200.0) == "2026-12-03T17:00:00Z"
    req = parse_request(request_bytes(STORY, speed=2, start=t, file="s.yaml"))
    assert (req.start, req.speed, req.loaded.where) == (t, 2, "s.yaml")
    assert parse_request(request_bytes(STORY)).start is None
    for bad in ("2026-12-03 17:00:00Z", "2026-12-03T17:00:00+01:00", "2026-02-30T00:00:00Z", "tomorrow", "2026-12-03T17:00:00.1234Z"):
        with pytest.raises(InvalidCommand, match="start"):
            parse_start(bad)
