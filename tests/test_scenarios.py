"""Level 2 (a whole daemon in virtual time, as tests/test_virtual_time.py runs one) and level 4
(a real mount, the `mokka scenario` CLI and a pynvml event waiter): scenarios run inside the
daemon, each step through the controller and marked in the event log; the shipped library;
determinism by seed; refusal of a bad scenario, whole; resuming after a restart."""
from __future__ import annotations

import contextlib
import errno
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from helpers_nvml import consumer_env
from mokkafs.daemon.clock import TrioClock
from mokkafs.daemon.lifetime import Options, start
from mokkafs.model.scenario import expand, load_text, request_bytes, start_text
from mokkafs.daemon.scenario_runner import shipped_scenarios
from test_virtual_time import T0, read, write

pytestmark = pytest.mark.level("daemon")

GPUS = 8


def _opts(base: Path, state: str = "state", gpus: int = GPUS) -> Options:
    return Options(mountpoint=str(base / "mnt"), gpus=gpus, state_dir=str(base / state), hostname="virtual", tick_s=1.0)


@contextlib.asynccontextmanager
async def daemon(base: Path, mock: trio.testing.MockClock, state: str = "state", epoch: float = T0, gpus: int = GPUS):
    """A whole daemon (no kernel mount) on a virtual clock that reads `epoch` now."""
    clock = TrioClock(epoch=epoch)
    with contextlib.ExitStack() as stack:
        async with trio.open_nursery() as nursery:
            mock.autojump_threshold = float("inf")  # start-up takes no simulated time
            d = await start(_opts(base, state, gpus), clock, stack, nursery)
            await d.mirror.ready.wait()
            mock.autojump_threshold = 0
            yield d
            nursery.cancel_scope.cancel()


async def until_idle(ops) -> str:
    while (status := await read(ops, "node/scenario")).startswith("state: running"):
        await trio.sleep(1)
    return status


def scenario_lines(events: str) -> list[str]:
    return [line for line in events.splitlines() if " scenario " in line]


# --- the library --------------------------------------------------------------------------------

# What each story leaves behind, read on the control files after it ends.
AFTERMATH = {
    "ecc-degradation": [("gpu0/inject_ecc", "failure yes"), ("gpu0/info", "health: unhealthy")],
    "fallen-off-the-bus": [("gpu0/lost", "0"), ("node/events", "fallen off the bus")],  # and reset at the end
    "gsp-error": [("gpu0/inject_xid", "120 "), ("gpu0/info", "health: unhealthy")],
    "nvlink-flapping": [("gpu1/nvlink", "2 up replay="), ("node/events", "nvlink 2 down")],
    "thermal-runaway": [("node/events", "mokka: gpu0 temperature pinned 94")],
    "power-brake": [("gpu3/throttle", "gpu_idle"), ("node/events", "mokka: gpu7 throttle pinned hw_slowdown hw_power_brake_slowdown")],
    "training-job": [("gpu5/memory_used", "0\n"), ("gpu5/info", "health: healthy"), ("node/events", "mokka: gpu5 memory_used pinned 72000")],
}



def test_a_daemon_imports_the_scenario_schema_at_its_first_scenario():
    """model/scenario.py (its pydantic schemas) is ~12 ms of the start of a daemon that runs no
    scenario: the daemon's modules leave it out until node/scenario is first written."""
    code = (
        "import sys\n"
        "import mokkafs.daemon.lifetime\n"
        "from mokkafs.model.events import StopScenario\n"
        "from mokkafs.render.control import _scenario_request\n"
        "assert 'mokkafs.model.scenario' not in sys.modules, 'imported by the daemon at its start'\n"
        "assert isinstance(_scenario_request(b'stop\\n'), StopScenario)\n"
        "assert 'mokkafs.model.scenario' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

def test_the_library_is_documented_and_each_story_has_its_checks():
    shipped = shipped_scenarios()
    assert set(shipped) == set(AFTERMATH)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "scenarios.md").read_text()
    for name, path in shipped.items():
        s = load_text(path.read_bytes(), path.name).scenario
        assert s.name == name and s.source.startswith("https://") and s.description
        assert f"`{name}`" in doc and s.source in doc and s.source in path.read_text()


async def _run_library(base: Path, mock) -> dict:
    out = {}
    async with daemon(base, mock) as d:
        node = d.controller.node
        for name, path in shipped_scenarios().items():
            began = d.clock()
            assert not await write(d.ops, "node/reset", b"1\n")
            seq = node.log_seq
            assert not await write(d.ops, "node/scenario", request_bytes(path.read_text(), file=path.name))
            running = await read(d.ops, "node/scenario")
            status = await until_idle(d.ops)
            plan = expand(load_text(path.read_bytes(), path.name), None, GPUS)
            marks = [e for e in node.log_since(seq) if e.text.startswith("scenario ")]
            out[name] = {
                "running": running,
                "status": status,
                "plan": [(p.offset, f"scenario {name} step {p.step}: {p.command}") for p in plan],
                "marks": [(round(e.time - began - 0.0, 3), e.text) for e in marks],
                "files": {f: await read(d.ops, f) for f, _ in AFTERMATH[name]},
            }
    return out


def test_each_shipped_scenario_runs_end_to_end_in_virtual_time(tmp_path, expect_log):
    expect_log(r"Xid|saturated")
    mock = trio.testing.MockClock()
    began = time.perf_counter()
    out = trio.run(_run_library, tmp_path, mock, clock=mock)
    wall = time.perf_counter() - began
    for name, checks in AFTERMATH.items():
        got = out[name]
        assert got["running"].startswith(f"state: running\nname: {name}\n"), got["running"]
        assert got["status"] == f"state: idle\nlast: {name} finished ({len(got['plan'])} commands)\n"
        # every command of the plan, at its offset to the millisecond, marked with the scenario
        assert got["marks"] == got["plan"], name
        for (path, expected) in checks:
            assert expected in got["files"][path], (name, path, got["files"][path])
    assert wall < 20, f"the library took {wall:.1f} s of real time"


# --- determinism ----------------------------------------------------------------------------------

HOUR_SCENARIO = """\
name: an-hour
seed: 5
duration: 1h
end: reset
steps:
  - at: 0s
    random: 3
    command: utilization 80 50
  - at: 1m
    random: 1
    command: ecc sbe 3 dram
    every: 2m
    times: 25
    jitter: 40s
  - at: 5m
    gpu: 2
    ramp: {from: 50, to: 90, over: 30m, every: 1m}
    command: temperature
  - after: 5m
    random: 2
    jitter: 5m
    command: xid 13
"""


async def _events_of_an_hour(base: Path, mock, state: str, seed: int | None) -> str:
    async with daemon(base, mock, state) as d:
        assert not await write(d.ops, "node/scenario", request_bytes(HOUR_SCENARIO, seed=seed, file="hour.yaml"))
        await until_idle(d.ops)
        assert d.clock() >= T0 + 3600
        return await read(d.ops, "node/events")


def test_an_hour_gives_the_same_event_log_for_a_seed_and_another_for_another(tmp_path):
    logs = [
        trio.run(_events_of_an_hour, tmp_path, mock, f"s{k}", seed, clock=mock)
        for k, (seed, mock) in enumerate([(None, trio.testing.MockClock()), (None, trio.testing.MockClock()),
                                           (6, trio.testing.MockClock())])
    ]
    assert len(scenario_lines(logs[0])) > 60
    assert logs[0] == logs[1]
    assert logs[0] != logs[2] and len(scenario_lines(logs[2])) == len(scenario_lines(logs[0]))


# --- bad input ------------------------------------------------------------------------------------

BAD_SCENARIOS = [
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 1\n    command: xid 48\n  - at: 2s\n    gpu: 3\n    command: xid 4 8\n",
     "bad.yaml:8: step 2:"),  # malformed command
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 0\n    command: xid 48\n  - at: 2s\n    gpus: [1, 4]\n    command: xid 79\n",
     "bad.yaml:7: step 2: no gpu4, the node has 4 GPUs"),  # impossible step on this node
    ("name: x\nsteps:\n  - at: 1s\n    gpu: 0\n    command: xid 48\n  - at 2s\n", "bad.yaml:6:"),  # not YAML
]


async def _refusals(base: Path, mock) -> list:
    out = []
    async with daemon(base, mock, gpus=4) as d:
        for text, _ in BAD_SCENARIOS:
            err = await write(d.ops, "node/scenario", request_bytes(text, file="bad.yaml"))
            out.append((err, await read(d.ops, "node/scenario"), await read(d.ops, "node/events")))
        good = "name: ok\nsteps:\n  - at: 1h\n    gpu: 0\n    command: xid 13\n"
        out.append(await write(d.ops, "node/scenario", request_bytes(good)))
        out.append(await write(d.ops, "node/scenario", request_bytes(good)))  # one at a time
        out.append(await write(d.ops, "node/scenario", b"stop\n"))
        out.append(await read(d.ops, "node/scenario"))
        out.append((base / "state" / "scenario.json").exists())
    return out


def test_a_bad_scenario_is_refused_whole_with_its_line(tmp_path, expect_log, caplog):
    expect_log(r"write node/scenario")
    mock = trio.testing.MockClock()
    out = trio.run(_refusals, tmp_path, mock, clock=mock)
    for err, status, events in out[: len(BAD_SCENARIOS)]:
        assert err == errno.EINVAL
        assert status == "state: idle\nlast: none\n" and events == ""  # nothing applied, not even step 1
    # The first refusal of a kind is logged with its reason (repeats are summarised).
    logged = [r.getMessage() for r in caplog.records if "write node/scenario" in r.getMessage()]
    assert BAD_SCENARIOS[0][1] in logged[0], logged
    started, busy, stopped, status, record_left = out[len(BAD_SCENARIOS):]
    assert (started, busy, stopped) == (0, errno.EBUSY, 0)
    assert status == "state: idle\nlast: ok stopped at step 0/1\n" and not record_left


def test_each_refusal_names_file_line_and_step():
    """What the daemon refuses with (the message the CLI prints too), per bad file."""
    from mokkafs.model import Node, compose
    from mokkafs.model.scenario import ScenarioError
    from mokkafs.model.profiles import load_profile

    node = Node(compose(load_profile("h100"), gpus=4), T0)
    for text, where in BAD_SCENARIOS:
        with pytest.raises(ScenarioError) as e:
            expand(load_text(text, "bad.yaml"), None, 4, node.validate)
        assert str(e.value).startswith(where), str(e.value)


# --- across a restart -----------------------------------------------------------------------------

RESUMED = """\
name: resumed
steps:
  - at: 10s
    gpu: 0
    command: xid 13
    every: 10s
    times: 6
"""


async def _restart(base: Path, mock) -> dict:
    out = {}
    async with daemon(base, mock) as d:
        assert not await write(d.ops, "node/scenario", request_bytes(RESUMED))
        await trio.sleep(25)  # steps at 10 and 20 s applied
        out["record"] = json.loads((base / "state" / "scenario.json").read_text())
    # The daemon is gone (its nursery cancelled, as a kill leaves it: no stop written); the next
    # one starts 20 s later: the steps at 30 and 40 s fell due meanwhile.
    async with daemon(base, mock, epoch=T0 + 45) as d:
        out["status"] = await read(d.ops, "node/scenario")
        out["idle"] = await until_idle(d.ops)
        out["marks"] = [(round(e.time - T0, 3), e.text) for e in d.controller.node.log if e.text.startswith("scenario")]
        out["left"] = (base / "state" / "scenario.json").exists()
    return out


def test_a_scenario_resumes_after_a_restart_where_its_timeline_stands(tmp_path):
    mock = trio.testing.MockClock()
    out = trio.run(_restart, tmp_path, mock, clock=mock)
    assert out["record"]["next"] == 2 and out["record"]["start"] == T0
    assert out["status"].startswith("state: running\nname: resumed\n")
    times = [t for t, _ in out["marks"]]
    assert times == [10, 20, 45, 45, 50, 60]  # 30 and 40 caught up at the restart, then on time
    assert out["idle"] == "state: idle\nlast: resumed finished (6 commands)\n" and not out["left"]


async def _resume_refused(base: Path, mock) -> str:
    async with daemon(base, mock) as d:
        assert not await write(d.ops, "node/scenario", request_bytes(RESUMED))
    record = json.loads((base / "state" / "scenario.json").read_text())
    record["text"] = record["text"].replace("gpu: 0", "gpu: 12")  # no longer fits the node
    (base / "state" / "scenario.json").write_text(json.dumps(record))
    async with daemon(base, mock) as d:
        return await read(d.ops, "node/scenario") + await read(d.ops, "node/events")


def test_a_record_that_no_longer_fits_is_aborted(tmp_path, expect_log):
    expect_log(r"scenario left by the previous daemon aborted: <scenario>:4: step 1: no gpu12")
    mock = trio.testing.MockClock()
    out = trio.run(_resume_refused, tmp_path, mock, clock=mock)
    assert out.startswith("state: idle\nlast: aborted after a restart: <scenario>:4: step 1: no gpu12")
    assert " scenario " not in out
    assert not (tmp_path / "state" / "scenario.json").exists()


# --- a real mount: the CLI, and an NVML waiter receiving the scenario's Xids ----------------------

SHORT = """\
name: short
steps:
  - at: 1s
    gpu: 1
    command: xid 13
  - at: 2s
    gpu: 1
    command: xid 31
  - at: 3s
    gpu: 1
    command: xid 43
"""

WAITER = """
import time, pynvml as p
p.nvmlInit()
s = p.nvmlEventSetCreate()
p.nvmlDeviceRegisterEvents(p.nvmlDeviceGetHandleByIndex(1), p.nvmlEventTypeXidCriticalError, s)
print("waiting", flush=True)
for _ in range(3):
    d = p.nvmlEventSetWait_v2(s, 20000)
    print(d.eventData, time.time(), flush=True)
"""


def test_mokka_scenario_run_wait_and_an_nvml_waiter_gets_its_xids(node_factory, tmp_path):
    node = node_factory(profile="h100", gpus=2)
    node.expect_warning(r"Xid")
    out = node.cli("scenario", "list").stdout
    assert "ecc-degradation" in out and "nvlink-flapping" in out
    assert node.cli("scenario", "status", "--root", str(node.mnt)).stdout == "state: idle\nlast: none\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(SHORT.replace("gpu: 1\n    command: xid 31", "gpu: 2\n    command: xid 31"))
    refused = node.cli("scenario", "run", str(bad), "--root", str(node.mnt), check=False)
    assert refused.returncode == 2 and "bad.yaml:7: step 2: no gpu2, the node has 2 GPUs" in refused.stderr
    good = tmp_path / "short.yaml"
    good.write_text(SHORT)
    waiter = subprocess.Popen([sys.executable, "-c", WAITER], env=consumer_env(node.state_dir / "state"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout.readline() == "waiting\n"
        start = round(time.time() + 5.0, 3)  # a wall-clock zero, so each Xid has a scheduled time; 5 s
        # ahead, since a loaded machine can take seconds to start the command that sets it
        done = node.cli("scenario", "run", str(good), "--root", str(node.mnt), "--speed", "2",
                        "--start", start_text(start), "--wait")  # fmt: skip
        assert done.stdout == "short finished (3 commands)\n"
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    got = [line.split() for line in out.splitlines()]
    assert [code for code, _ in got] == ["13", "31", "43"]
    # 1, 2 and 3 s of the timeline at speed 2: each received at its scheduled time, never before
    # it and within half a step (0.25 s) after; how late (1-9 ms) is bench/bench_scenario.py's
    # to measure, since a loaded machine delays any process by more than that.
    late = [round(float(t) - (start + offset / 2), 4) for (_, t), offset in zip(got, (1, 2, 3))]
    assert all(-0.002 < x < 0.25 for x in late), late
    assert scenario_lines(node.read("node/events")) and "scenario short step 3: gpu=1 xid 43" in node.read("gpu1/events")


def test_after_kill_9_the_remounted_daemon_resumes_the_scenario(node_factory, tmp_path):
    node = node_factory(profile="h100", gpus=1)
    node.expect_warning(r"Xid|clearing stale mount|cut short by a crash")
    story = tmp_path / "k.yaml"
    story.write_text("name: k\nsteps:\n  - at: 0s\n    gpu: 0\n    command: xid 13\n    every: 2s\n    times: 4\n")
    node.cli("scenario", "run", str(story), "--root", str(node.mnt))
    deadline = time.monotonic() + 10
    while "step: 2/4" not in node.read("node/scenario") and time.monotonic() < deadline:
        time.sleep(0.02)
    node.kill9()
    node.mount()
    resumed = [line for line in (node.state_dir / "daemon.log").read_text().splitlines() if "resumed" in line]
    assert len(resumed) == 1 and "scenario k resumed at step 2/4" in resumed[0], resumed
    deadline = time.monotonic() + 10
    while node.read("node/scenario").startswith("state: running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.read("node/scenario") == "state: idle\nlast: k finished (4 commands)\n"
    marks = scenario_lines(node.read("node/events"))
    # every command once; the one in flight at the kill may be applied twice (docs/scenarios.md)
    assert 4 <= len(marks) <= 5 and all("scenario k step 1: gpu=0 xid 13" in m for m in marks), marks


# --- a shared start: the timeline's zero given as a wall-clock time --------------------------------

STARTED = "name: started\nsteps:\n  - at: 0s\n    gpu: 0\n    command: xid 13\n  - at: 10s\n    gpu: 0\n    command: xid 31\n"


async def _shared_start(base: Path, mock, start: float) -> dict:
    async with daemon(base, mock) as d:
        assert not await write(d.ops, "node/scenario", request_bytes(STARTED, start=start))
        waiting = await read(d.ops, "node/scenario")
        idle = await until_idle(d.ops)
        marks = [(round(e.time - T0, 3), e.text) for e in d.controller.node.log if e.text.startswith("scenario")]
        too_far = await write(d.ops, "node/scenario", request_bytes(STARTED, start=d.clock() + 8 * 86400))
        return {"waiting": waiting, "idle": idle, "marks": marks, "too_far": too_far}


def test_a_future_start_waits_for_it_and_a_past_one_joins_the_timeline(tmp_path, expect_log):
    expect_log(r"write node/scenario")
    mock = trio.testing.MockClock()
    out = trio.run(_shared_start, tmp_path / "a", mock, T0 + 30, clock=mock)
    assert "\nstarts_in: 30.000s\nstep: 0/2\n" in out["waiting"], out["waiting"]
    assert [t for t, _ in out["marks"]] == [30, 40], "on the shared timeline, not from when it was accepted"
    assert out["idle"] == "state: idle\nlast: started finished (2 commands)\n" and out["too_far"] == errno.EINVAL
    mock = trio.testing.MockClock()
    out = trio.run(_shared_start, tmp_path / "b", mock, T0 - 5, clock=mock)
    assert "starts_in" not in out["waiting"]
    assert [t for t, _ in out["marks"]] == [0, 5], "the step due 5 s before it was accepted is applied at once"


# --- settings are steps too: a rack's power capping at a time ----------------------------------------

POWER_CAP = """\
name: power-cap
steps:
  - at: 10s
    all: true
    command: power_limit 400
  - at: 20s
    all: true
    command: power_limit default
"""


async def _power_cap(base: Path, mock) -> dict:
    async with daemon(base, mock, gpus=2) as d:
        before = await read(d.ops, "gpu1/config")
        assert not await write(d.ops, "node/scenario", request_bytes(POWER_CAP))
        await trio.sleep(15)
        capped = await read(d.ops, "gpu1/config")
        await until_idle(d.ops)
        return {"before": before, "capped": capped, "after": await read(d.ops, "gpu1/config"),
                "events": scenario_lines(await read(d.ops, "node/events"))}  # fmt: skip


def test_a_setting_is_a_step_applied_through_the_controller(tmp_path):
    mock = trio.testing.MockClock()
    out = trio.run(_power_cap, tmp_path, mock, clock=mock)
    limit = lambda text: next(line for line in text.splitlines() if line.startswith("power_limit"))  # noqa: E731
    assert limit(out["before"]) == limit(out["after"]) != limit(out["capped"])
    assert "400" in limit(out["capped"]), limit(out["capped"])
    assert [line.split(" ", 1)[1] for line in out["events"]] == [
        "scenario power-cap step 1: gpu=0 power_limit 400", "scenario power-cap step 1: gpu=1 power_limit 400",
        "scenario power-cap step 2: gpu=0 power_limit default", "scenario power-cap step 2: gpu=1 power_limit default",
    ]  # fmt: skip


MIG_SCENARIO = """\
name: mig-layout
description: partition gpu 1 as the issue asks, then take it apart
source: docs/mig.md
seed: 1
end: keep
steps:
  - {at: 1s, gpu: 1, command: mig enable}
  - {after: 1s, gpu: 1, command: 'mig create 3g.40gb,2g.20gb,1g.10gb,1g.10gb'}
  - {after: 1s, gpu: 1, command: 'mig destroy_ci 10 all'}
  - {after: 1s, gpu: 1, command: 'mig destroy_gi 10'}
"""


def test_a_scenario_s_mig_steps_run_in_the_daemon(tmp_path):
    """Each `mig` step goes through the controller like any other command: the layout, its
    capability files and the event log follow the timeline."""

    async def main(mock):
        async with daemon(tmp_path, mock, gpus=2) as d:
            assert not await write(d.ops, "node/scenario", request_bytes(MIG_SCENARIO, file="mig.yaml"))
            await trio.sleep(2.5)  # after the create, before the destroys
            mid = await read(d.ops, "gpu1/mig")
            caps_mid = await read(d.ops, "proc/driver/nvidia/capabilities/gpu1/mig/gi10/ci0/access")
            status = await until_idle(d.ops)
            return mid, caps_mid, await read(d.ops, "gpu1/mig"), status, await read(d.ops, "node/events")

    mock = trio.testing.MockClock()
    mid, caps_mid, end, status, events = trio.run(main, mock, clock=mock)
    assert mid.startswith("mode: enabled\n") and mid.count("\ngi ") == 4 and mid.count("\n  ci ") == 4
    assert caps_mid.startswith(f"DeviceFileMinor: {3 + 135 + 9 * 10 + 1}\n")
    assert end.count("\ngi ") == 3 and "\ngi 10 " not in end
    assert status.startswith("state: idle\nlast: mig-layout finished (4 commands)")
    assert "mokka: gpu1 MIG created gi=2 3g.40gb at 4:4 with ci=0" in events
    assert [line.split(" scenario ", 1)[1] for line in scenario_lines(events)][:2] == [
        "mig-layout step 1: gpu=1 mig enable", "mig-layout step 2: gpu=1 mig create 3g.40gb,2g.20gb,1g.10gb,1g.10gb"]
