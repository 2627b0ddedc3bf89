"""`mokka scenario` list, run, status and stop: the shell's side of `node/scenario` (docs/scenarios.md).
A scenario is checked here against the mounted node first, so its errors (file, line, step)
reach the terminal; the daemon checks it again before it runs anything."""
from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path

from mokkafs.daemon.paths import DEFAULT_MOUNTPOINT

POLL_S = 0.02


def _fail(msg: str, code: int = 1) -> int:
    print(f"mokka: {msg}", file=sys.stderr)
    return code


def _control(root: str) -> Path:
    return Path(root) / "node" / "scenario"


def _resolve(name: str) -> Path | None:
    """A file, or the name of a shipped scenario."""
    from mokkafs.daemon.scenario_runner import shipped_scenarios

    p = Path(name)
    if p.is_file():
        return p
    return shipped_scenarios().get(name.removesuffix(".yaml"))


def cmd_list(args) -> int:
    from mokkafs.model.scenario import ScenarioError, load_text
    from mokkafs.daemon.scenario_runner import shipped_scenarios

    for name, path in shipped_scenarios().items():
        try:
            s = load_text(path.read_bytes(), path.name).scenario
        except ScenarioError as e:
            print(f"{name:<24} INVALID: {e}")
            continue
        print(f"{name:<24} {s.description.strip().splitlines()[0] if s.description.strip() else ''}")
    return 0


def _check_against_node(root: Path, text: bytes, where: str, seed: int | None) -> str | None:
    """The daemon's own check, run here for its message; None if it passes (or the node's
    profile cannot be loaded here, when the daemon alone decides)."""
    from mokkafs.model import Node, compose
    from mokkafs.model.scenario import ScenarioError, expand, load_text
    from mokkafs.model.schema import ProfileError
    from mokkafs.model.profiles import load_profile

    try:
        loaded = load_text(text, where)
    except ScenarioError as e:
        return str(e)
    try:
        gpus = int((root / "node" / "gpu_count").read_text())
        profile = load_profile((root / "node" / "profile").read_text().strip())
    except (OSError, ValueError, ProfileError):
        return None
    node = Node(compose(profile, gpus=gpus), time.time())
    try:
        expand(loaded, seed, gpus, node.validate)
    except ScenarioError as e:
        return str(e)
    return None


def _state(root: str) -> dict[str, str]:
    text = _control(root).read_text()
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def cmd_run(args) -> int:
    from mokkafs.model.scenario import MAX_DURATION_S, MAX_SCENARIO_BYTES, request_bytes

    path = _resolve(args.file)
    if path is None:
        return _fail(f"{args.file}: no such file or shipped scenario (mokka scenario list)", 2)
    try:
        with open(path, "rb") as f:  # a regular file (_resolve); at most one byte past the cap is read
            text = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as e:
        return _fail(f"{path}: {e.strerror}", 2)
    if len(text) > MAX_SCENARIO_BYTES:
        return _fail(f"{path}: longer than {MAX_SCENARIO_BYTES} bytes", 2)
    if args.start is not None and args.start > time.time() + MAX_DURATION_S:
        return _fail(f"--start is more than {MAX_DURATION_S / 86400:g} days away", 2)
    problem = _check_against_node(Path(args.root), text, path.name, args.seed)
    if problem is not None:
        return _fail(problem, 2)
    request = request_bytes(text.decode(), seed=args.seed, speed=args.speed, start=args.start, file=path.name)
    try:
        fd = os.open(_control(args.root), os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, request)  # one write: the whole request, or nothing
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.EBUSY:
            return _fail(f"{_control(args.root)}: a scenario runs already; `mokka scenario stop` first", 2)
        return _fail(f"{_control(args.root)}: {e.strerror} (the daemon's log says why)", 2)
    if not args.wait:
        return 0
    while True:
        state = _state(args.root)
        if state.get("state") != "running":
            last = state.get("last", "")
            print(last)
            return 0 if "finished" in last else 1
        time.sleep(POLL_S)


def cmd_status(args) -> int:
    try:
        sys.stdout.write(_control(args.root).read_text())
    except OSError as e:
        return _fail(f"{_control(args.root)}: {e.strerror}")
    return 0


def cmd_stop(args) -> int:
    try:
        fd = os.open(_control(args.root), os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, b"stop\n")
        finally:
            os.close(fd)
    except OSError as e:
        return _fail(f"{_control(args.root)}: {e.strerror}", 2)
    return 0


def _seed(value: str) -> int:
    from mokkafs.model.events import InvalidCommand, whole_number
    from mokkafs.model.scenario import MAX_SEED

    try:
        return whole_number(value, "a seed", MAX_SEED)
    except InvalidCommand as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _speed(value: str) -> float:
    from mokkafs.model.scenario import MAX_SPEED

    try:
        speed = round(float(value), 3)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < speed <= MAX_SPEED:
        raise argparse.ArgumentTypeError(f"speed must be 0.001..{MAX_SPEED:g}")
    return speed


def _start(value: str) -> float:
    from mokkafs.model.events import InvalidCommand
    from mokkafs.model.scenario import parse_start

    try:
        return parse_start(value)
    except InvalidCommand as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub) -> None:
    sc = sub.add_parser("scenario", help="repeatable fault timelines: list, run, status, stop")
    ssub = sc.add_subparsers(dest="scenario_command", required=True)
    ls = ssub.add_parser("list", help="the shipped scenarios")
    ls.set_defaults(func=cmd_list)
    r = ssub.add_parser("run", help="run a scenario file (or a shipped one, by name) in the daemon")
    r.add_argument("file")
    r.add_argument("--root", default=DEFAULT_MOUNTPOINT)
    r.add_argument("--seed", type=_seed, help="instead of the file's seed")
    r.add_argument("--speed", type=_speed, default=1.0, help="run the timeline this many times faster")
    r.add_argument("--start", type=_start, help="the timeline's zero, a UTC time like 2026-12-03T17:00:00Z "
                   "(nodes given one start run in step); default: now")
    r.add_argument("--wait", action="store_true", help="return when it ends (0: finished, 1: stopped)")
    r.set_defaults(func=cmd_run)
    for name, func, text in (("status", cmd_status, "what runs, its step, what comes next"),
                             ("stop", cmd_stop, "stop the running scenario (its faults stay)")):
        p = ssub.add_parser(name, help=text)
        p.add_argument("--root", default=DEFAULT_MOUNTPOINT)
        p.set_defaults(func=func)

