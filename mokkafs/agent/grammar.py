"""The annotation's spelling of the command vocabulary: `mokkafs.io/inject` values parsed into
control-file writes by `model/commands.py`, and checked against a scratch node before anything
is written. Pure: no API client, no I/O."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from mokkafs.model import Event, InvalidCommand, Node, NodeConfig, commands

MAX_ANNOTATION = 1024  # bytes; an injection is a few short commands, not a script
MAX_COMMANDS = 16

# The injection grammar (docs/kubernetes.md):
#
#   value    := command (";" command)*          one optional trailing newline
#   command  := target " " key "=" word (" " word)*
#   target   := "gpu=" INDEX | "gpu=all" | "node"
#
# This is the annotation's spelling of the command vocabulary (model/commands.py): `key` is a
# verb (xid, ecc, temperature, ..., reset; the node takes only `reset=1`) and the text after "="
# its arguments, exactly what is written to the verb's control file, so `gpu=1 ecc=dbe 2` writes
# "dbe 2" to gpu1/inject_ecc; a setting (power_limit, persistence, compute_mode), which has no
# control file, goes to the daemon's control socket. `gpu=all` is the command once per GPU, in
# index order. Before anything is written, every command is parsed by the
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
    def path(self) -> str | None:
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


def _every_gpu(text: str, gpus: int) -> list[Command]:
    """`gpu=all KEY=VALUE`: the command for each GPU, each remembering (and each refusal naming)
    the text the annotation said."""
    rest = text[len("gpu=all "):]
    try:
        return [Command(parse_command(f"gpu={i} {rest}", gpus).command, text) for i in range(gpus)]
    except InvalidCommand as e:
        raise InvalidCommand(f"{text!r}: {str(e).split(': ', 1)[-1]}") from None


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
        if text.startswith("gpu=all "):
            commands += _every_gpu(text, config.gpus)
        else:
            commands.append(parse_command(text, config.gpus))
    check_injection(tuple(commands), config)
    return tuple(commands)


# --- mokkafs.io/scenario: a scenario to run on the node, or `stop` ------------------------------
#
#   value    := "stop" | source (" " option)*        one optional trailing newline
#   source   := NAME                                  a shipped scenario (`mokka scenario list`)
#             | "configmap=" CONFIGMAP "/" KEY        its YAML, under KEY of a ConfigMap in the
#                                                     agent's own namespace
#   option   := "seed=" DIGITS | "speed=" NUMBER | "start=" UTC-TIME   each at most once
#
# `start` (2026-12-03T17:00:00Z) is the timeline's zero on every node annotated with it, so a
# pool annotated at once (`kubectl annotate nodes -l ...`) runs in step.

MAX_SCENARIO_ANNOTATION = 512
_SHIPPED_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_CONFIGMAP = re.compile(r"configmap=(?P<name>[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?)/(?P<key>[-._a-zA-Z0-9]{1,253})")
_OPTION = {
    "seed": re.compile(r"[0-9]{1,18}"),
    "speed": re.compile(r"[0-9]{1,5}(?:\.[0-9]{1,3})?"),
    "start": re.compile(r"\S+"),  # checked by parse_start, for its message
}


@dataclass(frozen=True)
class ScenarioRequest:
    """A scenario to run: a shipped one by `name`, or the YAML under `key` of ConfigMap
    `configmap`; `start` in seconds since the epoch (None: when the node's daemon accepts it)."""

    value: str
    name: str | None = None
    configmap: str | None = None
    key: str | None = None
    seed: int | None = None
    speed: float = 1.0
    start: float | None = None


@dataclass(frozen=True)
class StopRequest:
    value: str


def parse_scenario(value: str) -> ScenarioRequest | StopRequest:
    """The `mokkafs.io/scenario` annotation, strictly; raises InvalidCommand with the reason."""
    from mokkafs.model.scenario import MAX_SPEED, parse_start

    if len(value.encode("utf-8", "replace")) > MAX_SCENARIO_ANNOTATION:
        raise InvalidCommand(f"annotation longer than {MAX_SCENARIO_ANNOTATION} bytes")
    if value.endswith("\n"):
        value = value[:-1]
    if not re.fullmatch(r"[ -~]+", value):
        raise InvalidCommand("empty annotation, or not printable ASCII on one line")
    if value == "stop":
        return StopRequest(value)
    source, *options = value.split(" ")
    fields: dict = {}
    if m := _CONFIGMAP.fullmatch(source):
        fields.update(configmap=m["name"], key=m["key"])
    elif _SHIPPED_NAME.fullmatch(source) and "=" not in source:
        fields["name"] = source.removesuffix(".yaml")
    else:
        raise InvalidCommand(
            f"{source!r}: expected a shipped scenario's name or 'configmap=NAME/KEY', then seed=N, speed=X, start=UTC-TIME"
        )
    for option in options:
        key, _, arg = option.partition("=")
        if key not in _OPTION or not _OPTION[key].fullmatch(arg):
            raise InvalidCommand(f"{option!r}: expected seed=N, speed=X or start=2026-12-03T17:00:00Z")
        if key in fields:
            raise InvalidCommand(f"{key} given twice")
        if key == "seed":
            fields["seed"] = int(arg)
        elif key == "speed":
            fields["speed"] = float(arg)
            if not 0 < fields["speed"] <= MAX_SPEED:
                raise InvalidCommand(f"speed must be above 0 and at most {MAX_SPEED:g}")
        else:
            fields["start"] = parse_start(arg)
    return ScenarioRequest(value, **fields)
