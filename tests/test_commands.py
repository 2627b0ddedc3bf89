"""The command vocabulary (model/commands.py) — command text to events, bad input to its
reason, and every surface (control files, `mokka inject`, Node annotations, scenario lines)
accepting exactly the same commands."""
from __future__ import annotations

import os
import re

import pytest

from mokkafs.cli import main as cli
from mokkafs.agent import grammar
from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.commands import NODE, VERBS, command, gpu, hca, parse_line, parse_target, parse_write
from mokkafs.model.config import Configure
from mokkafs.model.events import IbPortCommand, InjectEcc, InjectXid, NvLinkCommand, Pin, Reset, SetLost
from mokkafs.model.profiles import load_profile
from mokkafs.render.control import gpu_dir, node_dir
from mokkafs.render.infiniband import control_dir
from mokkafs.render.vfs import File

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0

# --- the vocabulary: text -> events ---------------------------------------------------------------

GOOD = [
    ("gpu=0 xid 79", InjectXid(0, 79)),
    ("gpu=2 ecc sbe 5 dram", InjectEcc(2, "sbe", 5, "dram")),
    ("gpu=1 ecc dbe 2", InjectEcc(1, "dbe", 2, "dram")),
    ("gpu=1 ecc sbe 1000000 texture_shm", InjectEcc(1, "sbe", 1_000_000, "texture_shm")),
    ("gpu=0 temperature 90", Pin(0, "temperature", (90,))),
    ("gpu=0 temperature auto", Pin(0, "temperature", None)),
    ("gpu=0 power 650", Pin(0, "power", (650,))),
    ("gpu=0 utilization 90 40", Pin(0, "utilization", (90, 40))),
    ("gpu=0 clocks 1410 2619", Pin(0, "clocks", (1410, 2619))),
    ("gpu=0 memory_used 40000", Pin(0, "memory_used", (40000,))),
    ("gpu=0 throttle none", Pin(0, "throttle", ())),
    ("gpu=0 throttle hw_thermal_slowdown", Pin(0, "throttle", ("hw_slowdown", "hw_thermal_slowdown"))),
    ("gpu=1 lost 1", SetLost(1, True)),
    ("gpu=1 lost 0", SetLost(1, False)),
    ("gpu=1 lost", SetLost(1, True)),  # the verb's default
    ("gpu=0 nvlink 3 down", NvLinkCommand(0, 3, "down")),
    ("gpu=0 nvlink 17 errors 5", NvLinkCommand(0, 17, "errors", 5)),
    ("gpu=5 reset 1", Reset(5)),
    ("gpu=5 reset", Reset(5)),
    ("gpu=5 reset idle", Reset(5, idle=True)),  # NVIDIA's reset: refused while a process is on it
    ("node reset", Reset(None)),
    ("node reset 1", Reset(None)),
    ("hca=1 port down", IbPortCommand(None, 1, 1, "down")),
    ("hca=0 port errors 4", IbPortCommand(None, 0, 1, "errors", "symbol_error", 4)),
    ("hca=0 port errors VL15_dropped 2", IbPortCommand(None, 0, 1, "errors", "VL15_dropped", 2)),
    ("gpu=1 power_limit 500", Configure(1, "power_limit", 500.0)),
    ("gpu=1 power_limit 450.5", Configure(1, "power_limit", 450.5)),
    ("gpu=1 power_limit default", Configure(1, "power_limit", None)),
    ("gpu=0 persistence 0", Configure(0, "persistence", False)),
    ("gpu=2 compute_mode exclusive_process", Configure(2, "compute_mode", "exclusive_process")),
    ("gpu=2 compute_mode prohibited", Configure(2, "compute_mode", "prohibited")),
    ("gpu=3 locked_clocks 1500 1500", Configure(3, "locked_clocks", (1500, 1500))),
    ("gpu=3 locked_clocks default", Configure(3, "locked_clocks", None)),
]

GPU_VERBS = ("accounting, applications_clocks, clear_accounting, clear_ecc, clocks, compute_mode, ecc, ecc_mode, "
             "locked_clocks, locked_memory_clocks, lost, memory_used, mig, nvlink, persistence, power, power_limit, "
             "reset, temperature, throttle, utilization, xid")
BAD = [
    ("", "empty command or control characters"),
    ("gpu=0", "expected a command after gpu=0"),
    ("gpu=0 xid", "xid needs arguments: CODE (1..999)"),
    ("gpu=0 ecc", "ecc needs arguments: sbe|dbe COUNT [LOCATION]"),
    ("gpu=0 frob 1", f"unknown command 'frob' for gpu=0; known: {GPU_VERBS}"),
    ("node xid 79", "unknown command 'xid' for node; known: reset"),
    ("hca=0 xid 79", "unknown command 'xid' for hca=0; known: port"),
    ("gpu=01 xid 79", "target must be 'gpu=N', 'node' or 'hca=N', got 'gpu=01'"),
    ("xid 79", "target must be 'gpu=N', 'node' or 'hca=N', got 'xid'"),
    ("gpu=0 xid 0", "Xid must be 1..999, got 0"),
    ("gpu=0 xid 1000", "Xid must be at most 999, got 1000"),
    ("gpu=0 xid 0x4f", "Xid must be a decimal number, got '0x4f'"),
    ("gpu=0 xid 79 80", "Xid must be a decimal number, got '79 80'"),
    ("gpu=0  xid 79", "stray whitespace"),
    ("gpu=0 xid 79 ", "stray whitespace"),
    ("gpu=0 xid 7\t9", "empty command or control characters"),
    ("gpu=0 temperature 9\u00b0", "command is not ASCII"),
    ("gpu=0 xid " + "7" * 300, "command longer than 256 bytes"),
    ("gpu=0 ecc tbe 1", "ECC kind must be sbe or dbe, got 'tbe'"),
    ("gpu=0 ecc sbe 0", "ECC count must be 1..1000000, got 0"),
    ("gpu=0 ecc sbe 5 moon", "ECC location must be one of l1, l2, dram, register, texture, texture_shm, cbu, sram"),
    ("gpu=0 temperature 201", "temperature must be at most 200, got 201"),
    ("gpu=0 utilization 90", "expected 2 number(s) or 'auto'"),
    ("gpu=0 throttle sideways", "unknown throttle reason 'sideways'"),
    ("gpu=0 lost 2", "expected 0 or 1"),
    ("gpu=0 nvlink 18 down", "link must be at most 17, got 18"),
    ("gpu=0 nvlink 0 sideways", "expected 'L up', 'L down', 'L errors N' or 'L reset_errors'"),
    ("gpu=0 reset 2", "expected 1"),
    ("node reset 0", "expected 1"),
    ("hca=0 port sideways", "expected 'down', 'up', 'errors N' or 'errors COUNTER N'"),
    ("hca=0 port errors moon 1", "unknown counter 'moon'"),
    ("gpu=1 power_limit 5e2", "power limit must be watts (at most 3 decimals) or 'default', got '5e2'"),
    ("gpu=1 power_limit 500.0001", "power limit must be watts (at most 3 decimals)"),
    ("gpu=1 power_limit 0", "power limit must be above 0 and at most 100000 W, got 0.0"),
    ("gpu=1 power_limit", "power_limit needs arguments: W|default"),
    ("gpu=0 persistence on", "expected 0 or 1"),
    ("gpu=2 compute_mode turbo", "compute mode must be one of default, exclusive_thread, prohibited, exclusive_process"),
]


@pytest.mark.parametrize("line,event", GOOD, ids=[line for line, _ in GOOD])
def test_a_command_line_makes_its_event(line, event):
    parsed = parse_line(line)
    assert parsed.event == event
    assert parse_line(str(parsed)) == parsed  # the canonical spelling reads back
    assert parse_line(line.split(" ", 1)[1], parsed.target).event == event  # a scenario step's form


@pytest.mark.parametrize("line,reason", BAD, ids=[line[:40] for line, _ in BAD])
def test_a_bad_command_line_says_why(line, reason):
    with pytest.raises(InvalidCommand) as e:
        parse_line(line)
    assert str(e.value).startswith(reason), str(e.value)


def test_a_scenario_step_error_names_its_file_and_line():
    step = {"gpu": 0, "command": "ecc sbe 5 moon"}
    with pytest.raises(InvalidCommand) as e:
        parse_line(step["command"], gpu(step["gpu"]), where="faults.yaml:12")
    assert str(e.value) == (
        "faults.yaml:12: ECC location must be one of l1, l2, dram, register, texture, texture_shm, cbu, sram"
    )
    assert parse_line("xid 79", gpu(0), where="faults.yaml:13").event == InjectXid(0, 79)
    with pytest.raises(InvalidCommand, match=r"^faults.yaml:14: a command is text, got int$"):
        parse_line(79, gpu(0), where="faults.yaml:14")


def test_targets():
    assert parse_target("gpu=12") == gpu(12) and str(gpu(12)) == "gpu=12"
    assert parse_target("node") is NODE and parse_target("hca=3") == hca(3)
    with pytest.raises(InvalidCommand, match=r"^no gpu4, the node has 4 GPUs \(0..3\)$"):
        parse_target("gpu=4", gpus=4)
    with pytest.raises(InvalidCommand, match=r"^no hca8, the node has 8 HCAs \(0..7\)$"):
        parse_target("hca=8", hcas=8)
    with pytest.raises(InvalidCommand, match=r"^target must be 'gpu=N' or 'node', got 'hca=0'$"):
        parse_target("hca=0", kinds=("gpu", "node"))
    with pytest.raises(InvalidCommand, match="bad gpu index -1"):
        gpu(-1)
    assert gpu(3).directory == "gpu3" and hca(2).directory == "ib/mlx5_2" and NODE.directory == "node"


def test_a_control_write_is_the_arguments_with_one_optional_newline():
    assert parse_write(gpu(0), "xid", b"79\n") == InjectXid(0, 79)
    for data, reason in [(b"79\n\n", "empty command or control characters"), (b"\xff", "command is not ASCII"),
                         (b"7" * 256 + b"\n", "command longer than 256 bytes"), (b"", "empty command")]:
        with pytest.raises(InvalidCommand, match=re.escape(reason)):
            parse_write(gpu(0), "xid", data)
    with pytest.raises(InvalidCommand):  # no default on a file: an empty write is not `reset 1`
        parse_write(gpu(0), "reset", b"\n")


# --- every surface accepts exactly the same commands -----------------------------------------------

# (target, verb, arguments): commands that parse and fit a 4-GPU H100 node, then ones that do
# not, for either reason. Framing (whitespace around an annotation's commands, newlines in a
# control write) is each surface's own and tested with it.
SHARED = [
    *[tuple(line.split(" ", 2)) for line, _ in GOOD if len(line.split(" ")) > 2 and not line.startswith("gpu=5")],
    ("gpu=2", "reset", "1"), ("gpu=0", "xid", "0"), ("gpu=0", "xid", "abc"), ("gpu=0", "xid", "79 80"), ("gpu=1", "ecc", "dbe"),
    ("gpu=1", "ecc", "tbe 1"), ("gpu=1", "ecc", "sbe 1 moon"), ("gpu=2", "temperature", "201"),
    ("gpu=2", "utilization", "90"), ("gpu=2", "throttle", "bogus"), ("gpu=3", "lost", "2"),
    ("gpu=3", "nvlink", "18 down"), ("gpu=3", "nvlink", "0 sideways"), ("gpu=0", "reset", "2"),
    ("gpu=0", "clocks", "19999 2619"), ("gpu=0", "memory_used", "999999"), ("gpu=0", "power", "10001"),
    ("node", "reset", "0"), ("hca=1", "port", "sideways"), ("hca=1", "port", "errors moon 1"),
    ("gpu=1", "power_limit", "100"), ("gpu=1", "power_limit", "800"), ("gpu=1", "power_limit", "5e2"),
    ("gpu=0", "persistence", "2"), ("gpu=2", "compute_mode", "exclusive_thread"), ("gpu=2", "compute_mode", "turbo"),
    ("gpu=3", "locked_clocks", "100 1500"), ("gpu=3", "locked_clocks", "1500 1400"), ("gpu=3", "locked_clocks", "1500"),
    ("gpu=1", "ecc_mode", "0"), ("gpu=1", "ecc_mode", "2"), ("gpu=2", "accounting", "1"), ("gpu=2", "accounting", "yes"),
    ("gpu=0", "applications_clocks", "2619 1500"), ("gpu=0", "applications_clocks", "1000 1500"),
    ("gpu=0", "applications_clocks", "2619 2000"), ("gpu=3", "locked_memory_clocks", "2619 2619"),
    ("gpu=3", "locked_memory_clocks", "1000 2619"), ("gpu=1", "clear_ecc", "volatile"), ("gpu=1", "clear_ecc", "aggregate"),
    ("gpu=1", "clear_ecc", "all"), ("gpu=2", "clear_accounting", "1"), ("gpu=2", "clear_accounting", "0"),
    ("gpu=0", "nvlink", "3 reset_errors"), ("gpu=0", "nvlink", "18 reset_errors"),
    # MIG: state-independent lines only (the socket applies what it accepts; disabling a disabled GPU changes nothing)
    ("gpu=0", "mig", "disable"), ("gpu=0", "mig", "create_gi 19:9"), ("gpu=0", "mig", "explode"),
    ("gpu=1", "mig", "create 5g.50gb"), ("gpu=1", "mig", "create_gi 3g.40gb:2"),
]


def _outcome(call, node: Node):
    """('ok', event) once the event also fits `node`, or ('error', reason)."""
    try:
        event = call()
        node.validate(event)
        return ("ok", event)
    except InvalidCommand as e:
        return ("error", str(e))


def _daemon_for_settings(tmp_path, config):
    """The control socket where `mokka inject --root tmp_path` looks for it (the driver root's
    run/mokka), serving a node of its own; for the commands that have no control file."""
    from conftest import ServedInThread

    from mokkafs.daemon.control_socket import ControlSocket, control_path
    from mokkafs.daemon.clock import WallClock
    from mokkafs.daemon.controller import Controller

    state_dir = tmp_path / "driver" / "run" / "mokka"
    state_dir.mkdir(parents=True)
    controller = Controller(Node(config, T0), None, WallClock())
    control = ControlSocket(control_path(state_dir / "state"), controller, lambda caller: caller.uid == 0, WallClock())
    return control, ServedInThread(control.serve)


def _socket_outcome(control, line: str):
    """What the control socket answers `line` with, as ('ok', event) or ('error', reason)."""
    from mokkafs.daemon.control_socket import Caller

    reply = control.handle(Caller(os.getpid(), 0, 0), line.encode() + b"\n")
    return ("ok", parse_line(line).event) if reply.ok else ("error", reply.message)


def test_every_surface_accepts_exactly_the_same_commands(tmp_path, capsys, expect_log):
    config = compose(load_profile("h100"), gpus=4)
    node = Node(config, T0)
    control, service = _daemon_for_settings(tmp_path, config)
    expect_log(r"ctl\.sock: (invalid_argument|not_supported) from uid 0")
    try:
        _every_surface(tmp_path, capsys, config, node, control)
    finally:
        service.stop()


def _every_surface(tmp_path, capsys, config, node, control):
    files = {"node": node_dir().children(None)}
    files.update({f"gpu={i}": gpu_dir(i).children(None) for i in range(4)})
    hcas = [e for n, e in control_dir(config).children(None).items() if n.startswith("mlx5_")]  # not ib/fabric
    files.update({f"hca={j}": d.children(None) for j, d in enumerate(hcas)})
    driven = {(parse_target(t).kind, verb) for t, verb, _ in SHARED}
    assert driven == {(kind, verb) for kind, verbs in VERBS.items() for verb in verbs}, "every verb is driven"
    for target_text, verb, args in SHARED:
        target = parse_target(target_text)
        v = VERBS[target.kind][verb]
        results = {"scenario line": _outcome(lambda: parse_line(f"{verb} {args}", target).event, node)}
        if v.file is not None:
            results["control file"] = _outcome(lambda: files[target_text][v.file].write(args.encode() + b"\n"), node)
        else:  # a setting: the control socket takes it, as from NVML
            results["control socket"] = _socket_outcome(control, f"{target_text} {verb} {args}")
        if target.kind != "hca":  # annotations reach GPUs and the node
            try:
                (cmd,) = grammar.parse_injection(f"{target_text} {verb}={args}", config)
                results["annotation"] = ("ok", cmd.event)
                assert cmd.path == (v.file and f"{target.directory}/{v.file}") and cmd.payload == args.encode()
            except InvalidCommand as e:
                prefix = f"'{target_text} {verb}={args}': "
                assert str(e).startswith(prefix)
                results["annotation"] = ("error", str(e)[len(prefix):])
        if target.kind == "gpu" and v.file is None:  # a setting: `mokka inject` sends it to the socket
            rc = cli.main(["inject", "--root", str(tmp_path), str(target.index), verb, *args.split(" ")])
            err = capsys.readouterr().err
            prefix = f"mokka: {target.directory} {verb}: "
            assert rc == 0 or (rc == 2 and err.startswith(prefix)), err
            results["mokka inject"] = ("ok", parse_line(f"{target_text} {verb} {args}").event) if rc == 0 else \
                ("error", err[len(prefix):].rstrip("\n"))
        elif target.kind == "gpu":  # `mokka inject` reaches GPUs; it parses, the daemon checks the fit
            (tmp_path / target.directory).mkdir(exist_ok=True)
            written = tmp_path / target.directory / v.file
            written.unlink(missing_ok=True)
            rc = cli.main(["inject", "--root", str(tmp_path), str(target.index), verb, *args.split(" ")])
            err = capsys.readouterr().err
            if rc == 0:
                assert written.read_bytes() == args.encode() + b"\n"
                results["mokka inject"] = _outcome(lambda: parse_write(target, verb, written.read_bytes()), node)
            else:
                prefix = f"mokka: {target.directory}/{v.file}: "
                assert rc == 2 and err.startswith(prefix), err
                results["mokka inject"] = ("error", err[len(prefix):].rstrip("\n"))
        assert len(set(results.values())) == 1, (target_text, verb, args, results)


def test_every_writable_file_is_a_command_of_the_vocabulary():
    config = compose(load_profile("h100"), gpus=1)
    gpu_files = {n for n, e in gpu_dir(0).children(None).items() if isinstance(e, File) and e.write}
    node_files = {n for n, e in node_dir().children(None).items() if isinstance(e, File) and e.write}
    (port_dir, *_) = control_dir(config).children(None).values()
    port_files = {n for n, e in port_dir.children(None).items() if isinstance(e, File) and e.write}
    assert gpu_files == {v.file for v in VERBS["gpu"].values()} - {None}  # settings: the control socket
    assert node_files == {v.file for v in VERBS["node"].values()}
    assert port_files == {v.file for v in VERBS["hca"].values()}
    assert sorted(cli.INJECT_KINDS) == sorted(VERBS["gpu"])


def test_mokka_inject_without_a_value_takes_only_a_default(tmp_path, capsys):
    (tmp_path / "gpu0").mkdir()
    assert cli.main(["inject", "--root", str(tmp_path), "0", "reset"]) == 0
    assert (tmp_path / "gpu0" / "reset").read_bytes() == b"1\n"
    assert cli.main(["inject", "--root", str(tmp_path), "0", "temperature"]) == 2
    assert capsys.readouterr().err == "mokka: gpu0/temperature: temperature needs arguments: C|auto\n"
    assert not (tmp_path / "gpu0" / "temperature").exists()


def test_command_spelling():
    cmd = command(gpu(2), "ecc", "sbe 5 l2")
    assert (str(cmd), cmd.path, cmd.payload) == ("gpu=2 ecc sbe 5 l2", "gpu2/inject_ecc", b"sbe 5 l2")
    assert command(hca(1), "port", "down").path == "ib/mlx5_1/port1"
    assert command(NODE, "reset", None).path == "node/reset"
