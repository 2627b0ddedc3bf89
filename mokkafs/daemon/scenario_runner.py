"""The daemon's scenario runner: one scenario at a time, on the daemon's clock, each step applied
through the controller and marked in the event log (`scenario NAME step K: COMMAND`); what
`node/scenario` shows; the record in the state directory by which a restarted daemon resumes.

A restarted daemon resumes the timeline where it stands: the start time is kept, steps that fell
due while no daemon ran are applied at once, in order, then the rest at their times. The step
being applied when the daemon died may be applied twice (its record is saved after it).
"""
from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from mokkafs.daemon.clock import Clock
from mokkafs.daemon.controller import Controller
from mokkafs.model.events import InvalidCommand, RunScenario, StopScenario
from mokkafs.model.outcome import Outcome
from mokkafs.daemon.persist import StateError
from mokkafs.render.control import iso_time

if TYPE_CHECKING:
    from mokkafs.model.scenario import Loaded, Planned

log = logging.getLogger(__name__)


def _scenarios():
    """model/scenario.py, the schema and expansion, imported at the first scenario requested or
    left running: most daemons never run one, and its import is ~12 ms of every start."""
    from mokkafs.model import scenario

    return scenario


SHIPPED = [
    Path(__file__).resolve().parents[2] / "scenarios",  # a source checkout or editable install
    Path(__file__).resolve().parents[1] / "scenarios_data",  # a wheel (package-dir mapping)
]


def shipped_scenarios() -> dict[str, Path]:
    """The library's scenarios by name (the file's stem)."""
    found: dict[str, Path] = {}
    for d in SHIPPED:
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                found.setdefault(p.stem, p)
    return found


class ScenarioBusy(InvalidCommand):
    """A scenario runs already; `stop` it first."""

    errno = errno.EBUSY


@dataclass
class Run:
    loaded: Loaded
    seed: int
    speed: float
    start: float  # the daemon's clock when it started (seconds since the epoch)
    plan: list[Planned]
    next: int = 0  # index in `plan` of the next command to apply

    @property
    def name(self) -> str:
        return self.loaded.scenario.name

    def due(self, k: int) -> float:
        return self.start + self.plan[k].offset / self.speed

    def record(self) -> dict:
        return {
            "text": self.loaded.text,
            "where": self.loaded.where,
            "seed": self.seed,
            "speed": self.speed,
            "start": self.start,
            "next": self.next,
        }


class ScenarioRunner:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.controller: Controller | None = None
        self.current: Run | None = None
        self.last = "none"  # how the last scenario ended, for node/scenario
        self._changed = trio.Event()

    def attach(self, controller: Controller) -> None:
        self.controller = controller
        controller.handlers[RunScenario] = self.handle
        controller.handlers[StopScenario] = self.handle

    # --- requests (a write to node/scenario, through the controller) ------------------------

    def _plan(self, loaded: Loaded, seed: int) -> list[Planned]:
        node = self.controller.node
        return _scenarios().expand(loaded, seed, len(node.gpus), node.validate)

    def handle(self, event) -> Outcome:
        if isinstance(event, StopScenario):
            if self.current is not None:
                self._end(f"{self.current.name} stopped at step {self._step_no(self.current)}")
            return Outcome()
        if self.current is not None:
            raise ScenarioBusy(f"scenario {self.current.name} runs; stop it first")
        seed = event.loaded.scenario.seed if event.seed is None else event.seed
        plan = self._plan(event.loaded, seed)  # refused whole here, before anything applies
        now = self.clock()
        most = _scenarios().MAX_DURATION_S
        if event.start is not None and event.start > now + most:
            raise InvalidCommand(f"start {iso_time(event.start)} is more than {most / 86400:g} days away")
        # A start in the past joins the timeline where it stands: what fell due is applied at
        # once, in order, as after a restart (an agent that sees a pool's start late).
        self.current = Run(event.loaded, seed, event.speed, now if event.start is None else event.start, plan)
        self._save()
        log.info(
            "scenario %s (%s, seed %d, speed %g, start %s): %d commands over %g s",
            self.current.name, event.loaded.where, seed, event.speed, iso_time(self.current.start), len(plan),
            _scenarios().plan_length(event.loaded.scenario, plan),
        )
        self._wake()
        return Outcome()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _end(self, how: str) -> None:
        log.info("scenario %s", how)
        self.last = how
        self.current = None
        self._save()
        self._wake()

    def _save(self) -> None:
        state = self.controller.state
        if state is not None:
            state.save_scenario(None if self.current is None else self.current.record())

    @staticmethod
    def _step_no(run: Run) -> str:
        return f"{run.next}/{len(run.plan)}"

    # --- after a restart ---------------------------------------------------------------------

    def restore(self) -> None:
        """Take up the scenario a previous daemon left running; one that no longer loads or
        fits this node is aborted (logged, record removed), never half-run."""
        state = self.controller.state
        if state is None:
            return
        try:
            rec = state.load_scenario()
            if rec is None:
                return
            missing = [k for k in ("text", "where", "seed", "speed", "start", "next") if k not in rec]
            if missing:
                raise ValueError(f"{missing[0]}: missing")
            scenarios = _scenarios()
            loaded = scenarios.load_text(str(rec["text"]), str(rec["where"]))
            seed, speed, start, nxt = int(rec["seed"]), float(rec["speed"]), float(rec["start"]), int(rec["next"])
            # The request's rule for its start holds for a restored one too: a start past it
            # (1e20, say) is no time a clock can show, and node/scenario could not render it.
            for key, ok in (("seed", 0 <= seed <= 2**63 - 1), ("speed", 0 < speed <= scenarios.MAX_SPEED),
                            ("start", 0 <= start <= self.clock() + scenarios.MAX_DURATION_S)):
                if not ok:
                    raise ValueError(f"{key}: {str(rec[key])[:40]} out of range")
            plan = self._plan(loaded, seed)
            if not 0 <= nxt <= len(plan):
                raise ValueError(f"next step {nxt} beyond the plan's {len(plan)}")
        except (StateError, InvalidCommand, KeyError, ValueError, TypeError) as e:  # a ScenarioError too
            log.warning("%s: scenario left by the previous daemon aborted: %s", state.path / "scenario.json", e)
            self.last = f"aborted after a restart: {e}"
            state.save_scenario(None)
            return
        self.current = Run(loaded, seed, speed, start, plan, nxt)
        behind = sum(1 for k in range(nxt, len(plan)) if self.current.due(k) <= self.clock())
        log.info("scenario %s resumed at step %d/%d (%d due already)", loaded.scenario.name, nxt, len(plan), behind)

    # --- the timeline ------------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.restore()
        task_status.started()
        while True:
            run = self.current
            if run is None:
                await self._changed.wait()
                continue
            if run.next >= len(run.plan):
                self._end(f"{run.name} finished ({len(run.plan)} commands)")
                continue
            wait = run.due(run.next) - self.clock()
            if wait > 0:
                changed = self._changed
                with trio.move_on_after(wait):
                    await changed.wait()  # a stop (or a new run) ends the wait early
                continue  # re-read: the scenario may have changed meanwhile
            self._apply(run)
            await trio.lowlevel.checkpoint()  # a long catch-up after a restart shares the loop

    def _apply(self, run: Run) -> None:
        p = run.plan[run.next]
        run.next += 1
        note = f"scenario {run.name} step {p.step}: {p.command}"
        try:
            self.controller.apply(p.command.event, note=note)
        except InvalidCommand as e:
            # Validated at load; the node's state may still refuse (none does today).
            log.warning("%s refused: %s", note, e)
        self._save()

    # --- node/scenario -----------------------------------------------------------------------

    def status(self, now: float) -> str:
        run = self.current
        if run is None:
            return f"state: idle\nlast: {self.last}\n"
        s = run.loaded.scenario
        elapsed = max(0.0, (now - run.start) * run.speed)
        rows = [
            ("state", "running"),
            ("name", s.name),
            ("file", run.loaded.where),
            ("seed", run.seed),
            ("speed", f"{run.speed:g}"),
            ("started", iso_time(run.start)),
            ("elapsed", f"{elapsed:.3f}s of {_scenarios().plan_length(s, run.plan):g}s"),
            *([("starts_in", f"{run.start - now:.3f}s")] if now < run.start else []),
            ("step", self._step_no(run)),
            ("next", str(run.plan[run.next]) if run.next < len(run.plan) else "end"),
        ]
        return "".join(f"{k}: {v}\n" for k, v in rows)
