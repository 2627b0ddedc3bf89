"""The one command vocabulary: every command that changes the node, as (target, verb, arguments),
parsed strictly into one frozen event (model/events.py). Control files, `mokka inject`, the
agent's annotations and scenario steps are spellings of these commands and parse through here.

    target     verb         arguments                          control file
    gpu=N      xid          CODE [gi=G [ci=C]]                 gpuN/inject_xid (gi, ci: the MIG instance it names)
    gpu=N      ecc          sbe|dbe COUNT [LOCATION] [contained]  gpuN/inject_ecc (dbe: with its Xids)
    gpu=N      temperature  ... memory_used, throttle (pins)   gpuN/<verb>
    gpu=N      lost         0|1                                gpuN/lost
    gpu=N      nvlink       LINK up|down|reset_errors, LINK errors COUNT   gpuN/nvlink
    gpu=N      reset        1|idle (idle: refused while a process is on it)  gpuN/reset
    gpu=N      persistence  0|1|default                        (control socket; gpuN/config shows it)
    gpu=N      compute_mode default|exclusive_process|prohibited   (control socket)
    gpu=N      power_limit  W|default                          (control socket)
    gpu=N      locked_clocks MIN_MHZ MAX_MHZ|default           (control socket)
    gpu=N      ecc_mode     0|1|default (pending until a reset)  (control socket)
    gpu=N      accounting   0|1|default                        (control socket)
    gpu=N      applications_clocks MEM_MHZ GRAPHICS_MHZ|default (control socket)
    gpu=N      locked_memory_clocks MIN_MHZ MAX_MHZ|default    (control socket)
    gpu=N      clear_ecc    volatile|aggregate                 (control socket)
    gpu=N      clear_accounting 1                              (control socket)
    gpu=N      mig          enable|disable, create LIST, ...   (control socket; gpuN/mig shows it; docs/mig.md)
    node       reset        1|idle|idle GPU,...                node/reset (GPU,...: those GPUs' reset, all or none)
    hca=N      port         up|down|errors [COUNTER] COUNT     ib/mlx5_N/port1

A parser returns a complete event or raises `InvalidCommand` with the reason; nothing is applied
until the whole command has parsed, so a bad command never half-changes the node. Whether the
event fits this node (its GPU count, NVLinks, clocks, power limits) is `Node.validate`'s to say.

The settings (model/config.py) have no control file: `gpuN/config` only shows them, and they
reach the daemon through its control socket (mokkafs/daemon/control_socket.py), as NVML's setters do.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from mokkafs.model import mig
from mokkafs.model.config import SETTINGS, parse_setting
from mokkafs.model.state_limits import MAX_GPUS
from mokkafs.model.events import (
    MAX_COUNT,
    MAX_XID,
    ECC_CLEAR_SCOPES,
    ClearAccounting,
    ClearEcc,
    Event,
    IbPortCommand,
    InjectEcc,
    InjectXid,
    InvalidCommand,
    NvLinkCommand,
    Pin,
    Reset,
    SetLost,
    whole_number,
)

MAX_COMMAND = 256  # bytes of arguments one command may carry (a control write, newline included)
TARGET_KINDS = ("gpu", "node", "hca")


# --- targets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a command acts on: a GPU, the whole node, or an InfiniBand HCA's port."""

    kind: str  # one of TARGET_KINDS
    index: int | None = None  # None for the node

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise InvalidCommand(f"unknown target kind {self.kind!r}")
        if (self.kind == "node") != (self.index is None):
            raise InvalidCommand("the node has no index; a GPU or HCA needs one")
        if self.index is not None and not (
            isinstance(self.index, int) and not isinstance(self.index, bool) and self.index >= 0
        ):
            raise InvalidCommand(f"bad {self.kind} index {self.index!r}")

    def __str__(self) -> str:
        return "node" if self.index is None else f"{self.kind}={self.index}"

    @property
    def directory(self) -> str:
        """Where its control files are, relative to the mount."""
        return {"gpu": f"gpu{self.index}", "node": "node", "hca": f"ib/mlx5_{self.index}"}[self.kind]


NODE = Target("node")


def gpu(i: int) -> Target:
    return Target("gpu", i)


def hca(j: int) -> Target:
    return Target("hca", j)


_TARGET_SPELLING = {"gpu": "'gpu=N'", "node": "'node'", "hca": "'hca=N'"}
# A target's index names a GPU or HCA as its directory does (gpu3, mlx5_3): no leading zeros.
_INDEX = r"(0|[1-9][0-9]{0,2})"


def parse_target(
    word: str, *, kinds: tuple[str, ...] = TARGET_KINDS, gpus: int | None = None, hcas: int | None = None
) -> Target:
    """`gpu=N`, `node` or `hca=N`, of the `kinds` a surface takes; with `gpus`/`hcas`, an index
    beyond the node's is refused here, naming the range."""
    m = re.fullmatch(rf"(gpu|hca)={_INDEX}|node", word)
    kind = m and (m.group(1) or "node")
    if kind not in kinds:
        spelled = [_TARGET_SPELLING[k] for k in kinds]
        listed = " or ".join(spelled) if len(spelled) < 3 else f"{', '.join(spelled[:-1])} or {spelled[-1]}"
        raise InvalidCommand(f"target must be {listed}, got {word!r}")
    if kind == "node":
        return NODE
    index = int(m.group(2))
    count = gpus if kind == "gpu" else hcas
    if count is not None and index >= count:
        plural = "GPUs" if kind == "gpu" else "HCAs"
        raise InvalidCommand(f"no {kind}{index}, the node has {count} {plural} (0..{count - 1})")
    return Target(kind, index)


# --- argument parsers: (target index, argument text) -> event -----------------------------------


def _uint(word: str, what: str, high: int) -> int:
    return whole_number(word, what, high)


def _xid(i: int, text: str) -> InjectXid:
    """`79`, or an Xid a MIG instance caused: `31 gi=2`, `31 gi=2 ci=0`."""
    m = re.fullmatch(r"(\S+)(?: gi=(\S+)(?: ci=(\S+))?)?", text)
    if not m:  # anything but the instance words after the code: say what the code must be
        return InjectXid(i, _uint(text, "Xid", MAX_XID))
    code, gi, ci = m.groups()
    return InjectXid(i, _uint(code, "Xid", MAX_XID), None if gi is None else _uint(gi, "gi", 0xFF),
                     None if ci is None else _uint(ci, "ci", 0xFF))


def _ecc(i: int, text: str) -> InjectEcc:
    """`sbe N [LOCATION]`, `dbe N [LOCATION] [contained|uncontained]` (default uncontained)."""
    words = text.split(" ")
    containment = words.pop() if len(words) > 2 and words[-1] in ("contained", "uncontained") else None
    if len(words) not in (2, 3):
        raise InvalidCommand("expected 'sbe N [LOCATION]' or 'dbe N [LOCATION] [contained|uncontained]'")
    kind, count = words[0], _uint(words[1], "count", MAX_COUNT)
    location = words[2] if len(words) == 3 else "dram"
    if containment is not None and kind != "dbe":
        raise InvalidCommand(f"{containment}: only an uncorrectable (dbe) error is contained or not")
    return InjectEcc(i, kind, count, location, containment == "contained")


def _lost(i: int, text: str) -> SetLost:
    if text not in ("0", "1"):
        raise InvalidCommand("expected 0 or 1")
    return SetLost(i, text == "1")


def _reset(i: int | None, text: str) -> Reset:
    if text not in ("1", "idle"):
        raise InvalidCommand("expected 1 or idle")
    return Reset(i, idle=text == "idle")


def _node_reset(i: None, text: str) -> Reset:
    """`1`, `idle` (the node), or `idle GPU,GPU,...`: NVIDIA's reset of those GPUs together."""
    words = text.split(" ")
    if len(words) == 2 and words[0] == "idle":
        gpus = tuple(_uint(w, "gpu", MAX_GPUS - 1) for w in words[1].split(","))
        if len(set(gpus)) != len(gpus):
            raise InvalidCommand("a GPU named twice")
        return Reset(None, idle=True, gpus=gpus)
    return _reset(i, text)


def _clear_ecc(i: int, text: str) -> ClearEcc:
    if text not in ECC_CLEAR_SCOPES:
        raise InvalidCommand("expected volatile or aggregate")
    return ClearEcc(i, text)


def _clear_accounting(i: int, text: str) -> ClearAccounting:
    if text != "1":
        raise InvalidCommand("expected 1")
    return ClearAccounting(i)


def _nvlink(i: int, text: str) -> NvLinkCommand:
    words = text.split(" ")
    if len(words) == 2 and words[1] in ("up", "down", "reset_errors"):
        return NvLinkCommand(i, _uint(words[0], "link", 17), words[1])
    if len(words) == 3 and words[1] == "errors":
        return NvLinkCommand(i, _uint(words[0], "link", 17), "errors", _uint(words[2], "count", MAX_COUNT))
    raise InvalidCommand("expected 'L up', 'L down', 'L errors N' or 'L reset_errors'")


def _ib_port(j: int, text: str) -> IbPortCommand:
    """`down`, `up`, `errors N` (symbol errors) or `errors COUNTER N`; HCAs have one port."""
    words = text.split(" ")
    if len(words) == 1 and words[0] in ("up", "down"):
        return IbPortCommand(None, j, 1, words[0])
    if len(words) == 2 and words[0] == "errors":
        return IbPortCommand(None, j, 1, "errors", "symbol_error", _uint(words[1], "count", MAX_COUNT))
    if len(words) == 3 and words[0] == "errors":
        return IbPortCommand(None, j, 1, "errors", words[1], _uint(words[2], "count", MAX_COUNT))
    raise InvalidCommand("expected 'down', 'up', 'errors N' or 'errors COUNTER N'")


def _pin(signal: str, arity: int, high: int) -> Callable[[int, str], Pin]:
    def parse(i: int, text: str) -> Pin:
        if text == "auto":
            return Pin(i, signal, None)
        words = text.split(" ")
        if len(words) != arity:
            raise InvalidCommand(f"expected {arity} number(s) or 'auto'")
        return Pin(i, signal, tuple(_uint(w, signal, high) for w in words))

    return parse


def _throttle(i: int, text: str) -> Pin:
    if text == "auto":
        return Pin(i, "throttle", None)
    if text == "none":
        return Pin(i, "throttle", ())
    return Pin(i, "throttle", tuple(text.split(" ")))


# --- the vocabulary -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verb:
    name: str
    target: str  # the kind of target it acts on
    file: str | None  # the control file, in the target's directory, that takes it; None: none does
    usage: str  # the forms of its arguments, for messages and help
    parse: Callable[[int | None, str], Event] = field(repr=False)
    default: str | None = None  # the arguments a surface that lets them be left out uses


_VERBS = (
    Verb("xid", "gpu", "inject_xid", f"CODE (1..{MAX_XID}) [gi=G [ci=C]]", _xid),
    Verb("ecc", "gpu", "inject_ecc", "sbe|dbe COUNT [LOCATION] [contained|uncontained]", _ecc),
    Verb("temperature", "gpu", "temperature", "C|auto", _pin("temperature", 1, 200)),
    Verb("power", "gpu", "power", "W|auto", _pin("power", 1, 10_000)),
    Verb("utilization", "gpu", "utilization", "GPU% MEM%|auto", _pin("utilization", 2, 100)),
    Verb("clocks", "gpu", "clocks", "SM_MHZ MEM_MHZ|auto", _pin("clocks", 2, 20_000)),
    Verb("memory_used", "gpu", "memory_used", "MIB|auto", _pin("memory_used", 1, 10_000_000)),
    Verb("throttle", "gpu", "throttle", "REASON...|none|auto", _throttle),
    Verb("lost", "gpu", "lost", "0|1", _lost, default="1"),
    Verb("nvlink", "gpu", "nvlink", "LINK up|down|reset_errors, LINK errors COUNT", _nvlink),
    Verb("reset", "gpu", "reset", "1|idle", _reset, default="1"),
    *(Verb(s.name, "gpu", None, s.usage, parse_setting(s.name)) for s in SETTINGS.values()),
    # Actions on a GPU's books, through the control socket like the settings (NVML's setters).
    Verb("clear_ecc", "gpu", None, "volatile|aggregate", _clear_ecc),
    Verb("clear_accounting", "gpu", None, "1", _clear_accounting, default="1"),
    Verb("mig", "gpu", None, mig.USAGE, mig.parse),
    Verb("reset", "node", "reset", "1|idle|idle GPU,GPU,...", _node_reset, default="1"),
    Verb("port", "hca", "port1", "up|down, errors [COUNTER] COUNT", _ib_port),
)
VERBS: dict[str, dict[str, Verb]] = {kind: {v.name: v for v in _VERBS if v.target == kind} for kind in TARGET_KINDS}


def verb_for(target: Target, name: str) -> Verb:
    verb = VERBS[target.kind].get(name)
    if verb is None:
        known = ", ".join(sorted(VERBS[target.kind]))
        raise InvalidCommand(f"unknown command {name!r} for {target}; known: {known}")
    return verb


@dataclass(frozen=True)
class Command:
    """One parsed command: what it acts on, how it was said, and the event it makes."""

    target: Target
    verb: Verb
    args: str
    event: Event = field(compare=False)

    @property
    def path(self) -> str | None:
        """The control file that takes it, relative to the mount; None for a setting, which
        only the control socket takes."""
        return None if self.verb.file is None else f"{self.target.directory}/{self.verb.file}"

    @property
    def payload(self) -> bytes:
        """What a write to that control file carries (without its newline)."""
        return self.args.encode("ascii")

    def __str__(self) -> str:
        """The canonical line (`gpu=0 xid 79`), which `parse_line` reads back."""
        return f"{self.target} {self.verb.name} {self.args}"


def _check_args(text: str) -> None:
    """The same rules for every spelling: printable ASCII, one space between words, no
    leading or trailing space, at most MAX_COMMAND bytes."""
    if len(text) > MAX_COMMAND:
        raise InvalidCommand(f"command longer than {MAX_COMMAND} bytes")
    if not text.isascii():
        raise InvalidCommand("command is not ASCII")
    if not text or not re.fullmatch(r"[ -~]+", text):
        raise InvalidCommand("empty command or control characters")
    if text != text.strip() or "  " in text:
        raise InvalidCommand("stray whitespace")


def command(target: Target, verb: str, args: str | None) -> Command:
    """Parse `args` as `verb`'s arguments on `target`. `args=None`: none were given, which only
    a verb with a default (`reset`, `lost`) accepts."""
    v = verb_for(target, verb)
    if args is None:
        if v.default is None:
            raise InvalidCommand(f"{verb} needs arguments: {v.usage}")
        args = v.default
    if not isinstance(args, str):
        raise InvalidCommand(f"{verb}: arguments must be text, got {type(args).__name__}")
    _check_args(args)
    return Command(target, v, args, v.parse(target.index, args))


def parse_write(target: Target, verb: str, data: bytes) -> Event:
    """A control-file write: `data` is the arguments, with one optional trailing newline."""
    if len(data) > MAX_COMMAND:
        raise InvalidCommand(f"command longer than {MAX_COMMAND} bytes")
    if data.endswith(b"\n"):
        data = data[:-1]
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidCommand("command is not ASCII") from None
    return command(target, verb, text).event


def control_writer(target: Target, verb: str) -> Callable[[bytes], Event]:
    """The parser a control file carries: its target and verb are fixed by where it is."""
    if verb_for(target, verb).file is None:  # a file for a verb that has none is a bug, found at build time
        raise InvalidCommand(f"{verb} has no control file")

    def write(data: bytes) -> Event:
        return parse_write(target, verb, data)

    return write


def parse_line(
    line: str, target: Target | None = None, *, where: str | None = None, gpus: int | None = None
) -> Command:
    """One command on one line: `gpu=0 xid 79`, `node reset`, `hca=1 port down`; with `target`
    given (a scenario step `{gpu: 0, command: "ecc sbe 5 dram"}`), the line starts at the verb.
    `where` (a file and line, `faults.yaml:12`) starts every error message."""
    try:
        if not isinstance(line, str):
            raise InvalidCommand(f"a command is text, got {type(line).__name__}")
        _check_args(line)
        words = line.split(" ", 1 if target is not None else 2)
        if target is None:
            target = parse_target(words.pop(0), gpus=gpus)
            if not words:
                raise InvalidCommand(f"expected a command after {target}")
        return command(target, words[0], words[1] if len(words) > 1 else None)
    except InvalidCommand as e:
        if where is None:
            raise
        raise InvalidCommand(f"{where}: {e}") from None
