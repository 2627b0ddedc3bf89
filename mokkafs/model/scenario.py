"""Scenarios: a named, seeded timeline of commands (docs/scenarios.md). The YAML schema, its
loading with errors that name the file, the line and the step, and the pure expansion of a
scenario into `(offset, step, command)` for a node; the daemon's runner (`mokkafs/daemon/scenario_runner.py`)
applies them on its clock.

Everything random comes from one `random.Random(seed)`, drawn in the file's order, so the same
file and seed give the same plan on any machine.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mokkafs.model.commands import NODE, Command, gpu, parse_line
from mokkafs.model.events import Event, InvalidCommand, RunScenario, StopScenario, decimal_number, whole_number
from mokkafs.model.profiles import StrictLoader, too_deep

MAX_SCENARIO_BYTES = 64 * 1024  # a file, and what one write to node/scenario may carry
MAX_STEPS = 1000  # steps in a file
MAX_PLANNED = 20_000  # commands a whole scenario expands into (repeats, ramps, targets)
MAX_DURATION_S = 7 * 86400.0
MAX_NAME = 64

_DURATION = re.compile(r"(0|[1-9][0-9]{0,6})(\.[0-9]{1,3})?(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
RAMP_VERBS = ("temperature", "power", "utilization", "clocks", "memory_used")


def duration_s(value: object) -> float:
    """`30s`, `1.5m`, `10m`, `2h`, `250ms`, or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a text like '30s', '10m', '1h'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1) + (m.group(2) or "")) * _UNIT_S[m.group(3)]
    else:
        raise ValueError(f"a duration is a number of seconds or a text like '30s', '10m', '1h', got {value!r}")
    if not 0 <= seconds <= MAX_DURATION_S:
        raise ValueError(f"a duration must be 0..{MAX_DURATION_S:.0f} s, got {seconds}")
    return round(seconds, 3)


Duration = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]


class _Strict(BaseModel):
    # `gpu: true` is not gpu 1; the schemas are built at the first scenario loaded, not at every
    # daemon's start (~15 ms), which loads none unless one was left running.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class Ramp(_Strict):
    """A pinned signal moved from `from` to `to` over `over`, one pin each `every`."""

    from_: int | list[int] = Field(alias="from")
    to: int | list[int]
    over: Duration
    every: Duration

    _durations = field_validator("over", "every", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _shape(self) -> "Ramp":
        if self.every <= 0 or self.over <= 0:
            raise ValueError("over and every must be longer than 0 s")
        if self.over / self.every > MAX_PLANNED:
            raise ValueError(f"a ramp makes at most {MAX_PLANNED} pins")
        a, b = self.from_, self.to
        if isinstance(a, list) != isinstance(b, list) or (isinstance(a, list) and len(a) != len(b)):
            raise ValueError("from and to must both be one number or both lists of the same length")
        return self

    def values(self) -> list[tuple[float, tuple[int, ...]]]:
        """(offset from the ramp's start, values) for each pin, both ends included."""
        a = self.from_ if isinstance(self.from_, list) else [self.from_]
        b = self.to if isinstance(self.to, list) else [self.to]
        n = max(1, int(self.over // self.every))
        return [
            (round(k * self.over / n, 3), tuple(round(x + (y - x) * k / n) for x, y in zip(a, b)))
            for k in range(n + 1)
        ]


Load = Annotated[list[Annotated[int, Field(ge=0, le=100)]], Field(min_length=2, max_length=2)]


class _Pattern(_Strict):
    """A utilization pattern: the `utilization` pin (GPU %, memory %) moved by a shape over
    `over`, then `then: auto` (default: the GPU returns to its simulated curve) or `keep`."""

    over: Duration
    then: Literal["auto", "keep"] = "auto"
    releases: ClassVar[tuple[str, ...]] = ("utilization",)  # the pins `then: auto` returns

    _durations = field_validator("over", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _positive(self) -> "_Pattern":
        if self.over <= 0:
            raise ValueError("over must be longer than 0 s")
        return self

    def shape(self) -> list[tuple[float, str]]:
        raise NotImplementedError

    def pins(self) -> list[tuple[float, str]]:
        """(offset from the pattern's start, command) for each pin, in time order, ties in
        the order the shape makes them; with `then: auto`, the release at `over`."""
        out = self.shape()
        if self.then == "auto":
            out += [(self.over, f"{verb} auto") for verb in self.releases]
        return out


def _load(load: list[int]) -> str:
    return f"utilization {load[0]} {load[1]}"


class Idle(_Pattern):
    """No load: `utilization 0 0` for `over`."""

    kind: Literal["idle"]

    def shape(self) -> list[tuple[float, str]]:
        return [(0.0, "utilization 0 0")]


class Steady(_Pattern):
    """One load held for `over`."""

    kind: Literal["steady"]
    load: Load

    def shape(self) -> list[tuple[float, str]]:
        return [(0.0, _load(self.load))]


class Burst(_Pattern):
    """A square wave: `high` for `high_for` at the start of each `period`, `low` for the rest."""

    kind: Literal["burst"]
    high: Load
    low: Load
    period: Duration
    high_for: Duration

    _burst_durations = field_validator("period", "high_for", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _wave(self) -> "Burst":
        if not 0 < self.high_for < self.period:
            raise ValueError("high_for must be longer than 0 s and shorter than period")
        if self.over / self.period * 2 > MAX_PLANNED:
            raise ValueError(f"a burst makes at most {MAX_PLANNED} pins")
        return self

    def shape(self) -> list[tuple[float, str]]:
        out = []
        k = 0
        while (t := round(k * self.period, 3)) < self.over:
            out.append((t, _load(self.high)))
            if (down := round(t + self.high_for, 3)) < self.over:
                out.append((down, _load(self.low)))
            k += 1
        return out


class Eval(_Strict):
    """A training job's periodic evaluation pass: `load` for `for` every `every`."""

    every: Duration
    for_: Duration = Field(alias="for")
    load: Load

    _durations = field_validator("every", "for_", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _fits(self) -> "Eval":
        if not 0 < self.for_ < self.every:
            raise ValueError("for must be longer than 0 s and shorter than every")
        return self


class Training(_Pattern):
    """A training job's load curve: over `warmup` its memory fills from `memory[0]` to
    `memory[1]` MiB and its load ramps from `start` to `load` (one pin of each every `every`,
    both ends included), then `load` holds, dipping to `eval.load` for `eval.for` every
    `eval.every` (counted from the pattern's start); `then: auto` releases both pins."""

    kind: Literal["training"]
    releases: ClassVar[tuple[str, ...]] = ("utilization", "memory_used")
    memory: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2, max_length=2)]
    start: Load = [0, 0]
    load: Load
    warmup: Duration
    every: Duration
    eval: Eval | None = None

    _training_durations = field_validator("warmup", "every", mode="before")(lambda v: duration_s(v))

    @model_validator(mode="after")
    def _fits(self) -> "Training":
        if self.every <= 0 or self.warmup <= 0:
            raise ValueError("warmup and every must be longer than 0 s")
        if self.warmup >= self.over:
            raise ValueError("warmup must end before over")
        if self.warmup / self.every > MAX_PLANNED or (self.eval and self.over / self.eval.every * 2 > MAX_PLANNED):
            raise ValueError(f"a training pattern makes at most {MAX_PLANNED} pins")
        return self

    def shape(self) -> list[tuple[float, str]]:
        memory = Ramp.model_validate({"from": self.memory[0], "to": self.memory[1], "over": self.warmup, "every": self.every})
        load = Ramp.model_validate({"from": self.start, "to": self.load, "over": self.warmup, "every": self.every})
        out = []
        for (t, mem), (_, util) in zip(memory.values(), load.values()):
            out += [(t, f"memory_used {mem[0]}"), (t, f"utilization {util[0]} {util[1]}")]
        if self.eval is not None:
            k = 1
            while (t := round(k * self.eval.every, 3)) < self.over:
                if t >= self.warmup:
                    out.append((t, _load(self.eval.load)))
                    if (back := round(t + self.eval.for_, 3)) < self.over:
                        out.append((back, _load(self.load)))
                k += 1
        return out


Pattern = Annotated[Idle | Steady | Burst | Training, Field(discriminator="kind")]
PATTERNS = ("idle", "steady", "burst", "training")


class Step(_Strict):
    # when: exactly one of at/after
    at: Duration | None = None
    after: Duration | None = None
    # what: exactly one target
    gpu: Annotated[int, Field(ge=0)] | None = None
    gpus: list[Annotated[int, Field(ge=0)]] | None = None
    all: Literal[True] | None = None
    random: Annotated[int, Field(ge=1)] | None = None
    node: Literal[True] | None = None
    # how: a command (the vocabulary's, from the verb on), a ramp of a pin's values, or a
    # utilization pattern (no command)
    command: str | None = None
    ramp: Ramp | None = None
    pattern: Pattern | None = None
    every: Duration | None = None
    times: Annotated[int, Field(ge=1, le=MAX_PLANNED)] | None = None
    jitter: Duration = 0.0

    _durations = field_validator("at", "after", "every", "jitter", mode="before")(
        lambda v: None if v is None else duration_s(v)
    )

    @model_validator(mode="after")
    def _one_of_each(self) -> "Step":
        if (self.at is None) == (self.after is None):
            raise ValueError("a step has exactly one of 'at' (offset from the start) or 'after' (the previous step)")
        targets = [k for k in ("gpu", "gpus", "all", "random", "node") if getattr(self, k) is not None]
        if len(targets) != 1:
            raise ValueError("a step has exactly one target: gpu, gpus, all, random or node")
        if self.gpus is not None and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            raise ValueError("gpus must list distinct GPU indexes")
        if (self.command is None) == (self.pattern is None):
            raise ValueError("a step has exactly one of 'command' or 'pattern' (idle, steady, burst, training)")
        if self.pattern is not None and (self.ramp is not None or self.every is not None or self.jitter):
            raise ValueError("a pattern sets its own times: no ramp, every, times or jitter beside it")
        if (self.every is None) != (self.times is None):
            raise ValueError("'every' and 'times' go together (every 30s, 5 times)")
        if self.every is not None and self.every <= 0:
            raise ValueError("every must be longer than 0 s")
        if self.ramp is not None:
            if self.every is not None:
                raise ValueError("a ramp sets its own pace ('ramp.every'); no 'every'/'times' beside it")
            if self.command not in RAMP_VERBS:
                raise ValueError(f"a ramp's command is the signal it pins, one of {', '.join(RAMP_VERBS)}")
        return self


class Scenario(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=MAX_NAME)]
    description: str = ""
    source: str = ""  # where the failure story comes from
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    duration: Duration | None = None  # the timeline's length; `end` happens here (else at the last step)
    end: Literal["reset", "keep"] = "keep"
    steps: Annotated[list[Step], Field(min_length=1, max_length=MAX_STEPS)]

    _durations = field_validator("duration", mode="before")(lambda v: None if v is None else duration_s(v))


# --- loading, with line numbers ------------------------------------------------------------------


class ScenarioError(InvalidCommand):
    """A scenario refused whole; the message starts with `file:line` and names the step."""


@dataclass(frozen=True)
class Loaded:
    scenario: Scenario
    where: str  # the file's name, as errors name it
    lines: dict[tuple, int]  # YAML path (('steps', 2, 'command')) -> 1-based line
    text: str  # the file as given (persisted by the runner to resume)

    def line(self, path: tuple) -> int:
        """The line of `path` or of its nearest enclosing node."""
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)

    def at(self, path: tuple) -> str:
        """`file:line: step K (at 30s):` for errors about `path`."""
        head = f"{self.where}:{self.line(path)}:"
        if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
            head += f" step {path[1] + 1}:"
        return head


def _lines(node: yaml.Node, path: tuple, out: dict[tuple, int], seen: set[int]) -> None:
    if id(node) in seen:
        # An alias: the same node reached twice. Refused, so that a small file cannot expand
        # into an enormous document (aliases of aliases).
        raise ScenarioError(f"line {node.start_mark.line + 1}: anchors and aliases are not allowed in a scenario")
    seen.add(id(node))
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else None
            out.setdefault(path + (k,), key.start_mark.line + 1)
            _lines(value, path + (k,), out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, path + (i,), out, seen)


def load_text(text: str | bytes, where: str = "<scenario>") -> Loaded:
    """Parse and check one scenario file's text (not yet against a node). Raises ScenarioError."""
    if len(text) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{where}: longer than {MAX_SCENARIO_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ScenarioError(f"{where}: not UTF-8 text") from None
    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[tuple, int] = {}
        if tree is not None:
            try:
                _lines(tree, (), lines, set())
            except ScenarioError as e:
                raise ScenarioError(f"{where}:{str(e).removeprefix('line ')}") from None
        data = yaml.load(text, Loader=StrictLoader)
    except (yaml.YAMLError, RecursionError) as e:  # PyYAML's parser recurses once per level of nesting
        if too_deep(e):
            raise ScenarioError(f"{where}: nested too deeply") from None
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError(f"{where}:{line} not YAML: {problem}") from None
    except ScenarioError:
        raise
    except ValueError as e:  # a scalar PyYAML resolves but cannot make (a 2026-13-45 date)
        raise ScenarioError(f"{where}: not YAML: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}:1: a scenario is a mapping with name, seed and steps")
    probe = Loaded(None, where, lines, text)  # for the error's line before the model exists
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as e:
        # A misspelt key explains the missing one it stands for: name it first.
        err = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")[0]
        loc = tuple(err["loc"])
        shown = loc[2:] if loc[:1] == ("steps",) else loc  # `step K:` names the step
        what = ".".join(str(p) for p in shown)
        msg = err["msg"].removeprefix("Value error, ")
        extra = f" ({len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise ScenarioError(f"{probe.at(loc)} {what + ': ' if what else ''}{msg}{extra}") from None
    return Loaded(scenario, where, lines, text)


# --- expansion ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Planned:
    """One command of the plan: its offset from the start (scenario seconds) and its step."""

    offset: float
    order: int  # position in the plan, for ties at one offset (file order)
    step: int = field(compare=False)  # 1-based step number in the file
    command: Command = field(compare=False)

    def __str__(self) -> str:
        return f"+{self.offset:g}s step {self.step}: {self.command}"


def _targets(step: Step, rng: random.Random, gpu_count: int) -> list[int | None]:
    if step.node:
        return [None]
    if step.all:
        return list(range(gpu_count))
    if step.random is not None:
        if step.random > gpu_count:
            raise InvalidCommand(f"random: {step.random} GPUs asked for, the node has {gpu_count}")
        return sorted(rng.sample(range(gpu_count), step.random))
    picked = [step.gpu] if step.gpu is not None else list(step.gpus)
    for i in picked:
        if i >= gpu_count:
            raise InvalidCommand(f"no gpu{i}, the node has {gpu_count} GPUs (0..{gpu_count - 1})")
    return picked


def cmd_target(i: int | None) -> str:
    return "node" if i is None else f"gpu{i}"


def cmd_is_ramp(text: str, step: Step) -> bool:
    """Whether a refused command's values came from the ramp (then the ramp's line is named)."""
    return text != step.command


def _occurrences(step: Step) -> list[tuple[float, str]]:
    """(offset from the step's time, command text) before jitter."""
    if step.pattern is not None:
        return step.pattern.pins()
    if step.ramp is not None:
        return [(dt, f"{step.command} {' '.join(map(str, vals))}") for dt, vals in step.ramp.values()]
    times = step.times or 1
    return [(k * (step.every or 0.0), step.command) for k in range(times)]


def expand(
    loaded: Loaded, seed: int | None, gpu_count: int, validate: Callable[[Event], None] | None = None
) -> list[Planned]:
    """The scenario's commands in time order, for a node of `gpu_count` GPUs; `validate` (the
    node's `Node.validate`) checks each event against the board (its NVLinks, clocks, memory).
    Pure and deterministic: one `random.Random(seed)` drawn in file order (for each step, its
    random targets, then each occurrence's jitter). Raises ScenarioError naming the line."""
    s = loaded.scenario
    rng = random.Random(s.seed if seed is None else seed)
    planned: list[Planned] = []
    previous_end = 0.0
    for k, step in enumerate(s.steps):
        path = ("steps", k)
        try:
            start = step.at if step.at is not None else previous_end + step.after
            try:
                targets = _targets(step, rng, gpu_count)
            except InvalidCommand as e:
                key = next(k for k in ("gpu", "gpus", "random", "all", "node") if getattr(step, k) is not None)
                raise ScenarioError(f"{loaded.at(path + (key,))} {e}") from None
            occurrences = _occurrences(step)
            # `after` counts from a pattern's end (`over`), even one that keeps its last pin
            last = start + step.pattern.over if step.pattern is not None else start
            for dt, text in occurrences:
                jitter = round(rng.uniform(0, step.jitter), 3) if step.jitter else 0.0
                offset = round(start + dt + jitter, 3)
                last = max(last, offset)
                if s.duration is not None and offset > s.duration:
                    raise InvalidCommand(f"at {offset:g} s, after the scenario's duration ({s.duration:g} s)")
                for i in targets:
                    try:
                        cmd = parse_line(text, NODE if i is None else gpu(i), gpus=gpu_count)
                        if validate is not None:
                            validate(cmd.event)
                    except InvalidCommand as e:
                        key = "pattern" if step.pattern is not None else (
                            "ramp" if step.ramp is not None and cmd_is_ramp(text, step) else "command"
                        )
                        raise ScenarioError(f"{loaded.at(path + (key,))} {text!r} on {cmd_target(i)}: {e}") from None
                    planned.append(Planned(offset, len(planned), k + 1, cmd))
                    if len(planned) > MAX_PLANNED:
                        raise InvalidCommand(f"the scenario expands into more than {MAX_PLANNED} commands")
            previous_end = last
        except ScenarioError:
            raise
        except InvalidCommand as e:
            raise ScenarioError(f"{loaded.at(path)} {e}") from None
    if s.end == "reset":
        end_at = s.duration if s.duration is not None else max(p.offset for p in planned)
        cmd = parse_line("reset", NODE)
        planned.append(Planned(end_at, len(planned), len(s.steps) + 1, cmd))
    return sorted(planned)


def plan_length(s: Scenario, planned: list[Planned]) -> float:
    """Where the timeline ends: its duration, or its last command."""
    return s.duration if s.duration is not None else (planned[-1].offset if planned else 0.0)


# --- the control file: node/scenario (its requests, RunScenario and StopScenario, are in
# model/events.py: the daemon's runner keys on them without importing this module) --------------

MAX_SPEED = 10_000.0
_HEADER = re.compile(  # each number then under the one rule (model/events.py, whole_number)
    r"run(?: seed=(?P<seed>[0-9]+))?(?: speed=(?P<speed>[0-9]+(?:\.[0-9]{1,3})?))?"
    r"(?: start=(?P<start>[0-9]+(?:\.[0-9]{1,3})?))?(?: file=(?P<file>[A-Za-z0-9._-]{1,64}))?"
)
MAX_SEED = 2**63 - 1


def parse_request(data: bytes) -> Event:
    """What a write to node/scenario carries: `stop`, or a `run ...` line and the YAML text."""
    if len(data) > MAX_SCENARIO_BYTES + 256:
        raise ScenarioError(f"a scenario is at most {MAX_SCENARIO_BYTES} bytes")
    if data.rstrip(b"\n") == b"stop":
        return StopScenario(None)
    head, _, body = data.partition(b"\n")
    try:
        m = _HEADER.fullmatch(head.decode("ascii"))
    except UnicodeDecodeError:
        m = None
    if m is None:
        raise ScenarioError(
            "expected 'stop', or 'run [seed=N] [speed=X] [start=EPOCH] [file=NAME]' and the scenario's YAML on the next lines"
        )
    try:
        seed = whole_number(m["seed"], "seed", MAX_SEED) if m["seed"] else None
        speed = decimal_number(m["speed"], "speed") if m["speed"] else 1.0
        start = decimal_number(m["start"], "start") if m["start"] else None
    except InvalidCommand as e:
        raise ScenarioError(str(e)) from None
    if not 0 < speed <= MAX_SPEED:
        raise ScenarioError(f"speed must be above 0 and at most {MAX_SPEED:g}")
    loaded = load_text(body, m["file"] or "<scenario>")
    return RunScenario(None, loaded, seed, speed, start)


_START = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,3})?Z")


def parse_start(text: str) -> float:
    """A wall-clock start, `2026-12-03T17:00:00Z` (UTC, RFC 3339, at most milliseconds), as
    seconds since the epoch: the time every node of a pool starts its timeline at."""
    from datetime import datetime, timezone

    m = _START.fullmatch(text)
    if m is None:
        raise InvalidCommand(f"start must be a UTC time like 2026-12-03T17:00:00Z, got {text!r}")
    try:
        t = datetime(*(int(g) for g in m.groups()[:6]), tzinfo=timezone.utc)
    except ValueError as e:
        raise InvalidCommand(f"start {text!r}: {e}") from None
    return round(t.timestamp() + float(m.group(7) or 0), 3)


def start_text(t: float) -> str:
    """Seconds since the epoch as `parse_start` reads them, to the millisecond when it has them."""
    from datetime import datetime, timezone

    text = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    return text.removesuffix(".000") + "Z"


def _decimal(x: float) -> str:
    return f"{round(x, 3):.3f}".rstrip("0").rstrip(".")


def request_bytes(
    text: str, *, seed: int | None = None, speed: float = 1.0, start: float | None = None, file: str | None = None
) -> bytes:
    """The write `mokka scenario run` (and the agent) makes."""
    head = "run"
    if seed is not None:
        head += f" seed={seed}"
    if speed != 1.0:
        head += f" speed={_decimal(speed)}"
    if start is not None:
        head += f" start={_decimal(start)}"
    if file:
        head += f" file={re.sub(r'[^A-Za-z0-9._-]', '_', file)[:64]}"
    return f"{head}\n{text}".encode()
