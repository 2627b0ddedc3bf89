"""`mokka`: mount, unmount, inspect and break a simulated GPU node from the shell."""
from __future__ import annotations

import argparse
import errno
import functools
import gc
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typing import TYPE_CHECKING

from mokkafs.daemon.paths import DEAD_MOUNT_ERRNOS, DEFAULT_MOUNTPOINT, DEFAULT_STATE_DIR, is_mounted, pid_file

if TYPE_CHECKING:  # the daemon's modules are heavy; commands import them only when they need them
    from mokkafs.daemon.lifetime import Options

log = logging.getLogger("mokka")

READY_TIMEOUT_S = 30

# `mokka inject GPU KIND ...` writes to gpuN/<file>, or, for a setting, sends the command to the
# daemon's control socket (the state directory's, reached through the mount's driver/run/mokka);
# the kinds are the GPU commands of model/commands.py (spelled out here so that parsing arguments
# needs none of the model's imports).
INJECT_KINDS = ("accounting", "applications_clocks", "clear_accounting", "clear_ecc", "clocks", "compute_mode", "ecc",
                "ecc_mode", "locked_clocks", "locked_memory_clocks", "lost", "memory_used", "mig", "nvlink", "persistence",
                "power", "power_limit", "reset", "temperature", "throttle", "utilization", "xid")


def _fail(msg: str, code: int = 1) -> int:
    print(f"mokka: {msg}", file=sys.stderr)
    return code


LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LOG_MAX_BYTES = 1 << 20  # daemon.log is rotated at this size, with LOG_BACKUPS older copies kept
LOG_BACKUPS = 2


def _setup_logging(stream) -> None:
    logging.basicConfig(stream=stream, level=logging.INFO, format=LOG_FORMAT, force=True)


class _DaemonLog(logging.handlers.RotatingFileHandler):
    """daemon.log, capped in size (it is usually on tmpfs), and never opened through a link
    someone planted in the state directory."""

    def _open(self):
        from mokkafs.daemon.persist import own_file_problem

        # O_NONBLOCK: a FIFO planted here opens at once (and is refused) instead of hanging.
        fd = os.open(self.baseFilename,
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        problem = own_file_problem(os.fstat(fd))
        if problem:
            os.close(fd)
            raise OSError(errno.EPERM, problem)  # a hard link would be written through
        return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


def _setup_daemon_logging(logfile: Path) -> None:
    handler = _DaemonLog(logfile, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(handlers=[handler], level=logging.INFO, force=True)


def _group(value: str) -> int:
    """A group name or gid that exists on this machine."""
    import grp

    try:
        return grp.getgrgid(int(value)).gr_gid if value.isdigit() else grp.getgrnam(value).gr_gid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no group {value!r} on this machine") from None


def _serve_in_this_process(opts: Options, ready_fd: int | None) -> int:
    """Run the daemon here until unmounted; report readiness (or the error) on `ready_fd`."""
    import trio

    from mokkafs.daemon.lifetime import serve
    from mokkafs.daemon.persist import StateError
    from mokkafs.model.schema import ProfileError

    pipe = [ready_fd]  # reported at most once: a crash after "ready" must not write again

    def report(line: str) -> None:
        if pipe[0] is not None:
            os.write(pipe[0], line.encode())
            os.close(pipe[0])
            pipe[0] = None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(serve, on_ready=lambda: report("ready\n")), opts)

    expected = (ProfileError, StateError, RuntimeError, OSError)
    try:
        trio.run(main)
    except BaseException as e:
        # trio wraps what a nursery raises in exception groups; a start-up failure is one leaf.
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]
        if not isinstance(e, expected):
            log.exception("daemon failed")  # stderr goes nowhere in a forked daemon
            raise
        msg = _reason(e).replace("\n", "\n  ")
        log.error("%s", msg)
        report(f"error: {msg}\n")
        return 1
    return 0


def _reason(e: BaseException) -> str:
    """What a refused start says: an OSError as the file (or the rename's two files) it is
    about and the system's words, never `[Errno 21] Is a directory: 14`."""
    if not isinstance(e, OSError) or not e.strerror:
        return str(e)
    names = [str(n) for n in (e.filename, e.filename2) if isinstance(n, (str, bytes, os.PathLike))]
    return f"{' -> '.join(names)}: {e.strerror}" if names else e.strerror


def cmd_mount(args) -> int:
    # The imports below make some 44,000 objects the collector tracks, all living as long as
    # the daemon: its ~100 passes over them while they are made cost ~7 ms of mount -> ready.
    # Off until the forked daemon's start-up is done (lifetime._freeze_start_up turns it on);
    # on again here once the mount is refused, served in the foreground or handed to the daemon.
    gc.disable()
    try:
        return _mount(args)
    finally:
        gc.enable()


def _mount(args) -> int:
    from mokkafs.daemon.lifetime import Options, node_config
    from mokkafs.model.schema import ProfileError

    opts = Options(
        mountpoint=args.mountpoint,
        profile=args.profile,
        node=args.node,
        gpus=args.gpus,
        state_dir=args.state_dir,
        host_state_dir=args.host_state_dir,
        kmsg=args.kmsg,
        metrics=args.metrics,
        driver_version=args.driver_version,
        cuda_version=args.cuda_version,
        numa_nodes=args.numa_nodes,
        hcas=args.hcas,
        control_group=args.control_group,
    )
    if args.hostname:
        opts.hostname = args.hostname
    # Bad input is refused here, before anything is made (state directory, mount point) or
    # forked: one line naming the file and key, exit 2. The daemon takes the node checked here.
    try:
        opts.config = node_config(opts)
    except ProfileError as e:
        return _fail(" ".join(str(e).split()), 2)
    if args.foreground:
        _setup_logging(sys.stderr)
        return _serve_in_this_process(opts, None)
    made = _first_missing(Path(opts.state_dir))
    Path(opts.state_dir).mkdir(parents=True, exist_ok=True)
    logfile = Path(opts.state_dir) / "daemon.log"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon: its own session, output to the log file
        os.close(r)
        os.setsid()
        # Everything goes through the size-capped log handler; stray writes to fds 1 and 2
        # (which nothing bounds) go nowhere.
        try:
            _setup_daemon_logging(logfile)
        except OSError as e:
            os.write(w, f"error: {logfile}: {e.strerror} (a symlink, hard link or FIFO is refused)\n".encode())
            os._exit(1)
        devnull = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(devnull, n)
        os._exit(_serve_in_this_process(opts, w))
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        answer = pipe.read().decode(errors="replace")
    if answer.startswith("ready"):
        print(f"mokka: {opts.mountpoint} ready (log: {logfile})")
        return 0
    os.waitpid(pid, 0)
    reason = answer.removeprefix("error: ").strip()
    if not reason:
        return _fail(f"daemon exited before it was ready; see {logfile}")
    if made is not None:
        # The reason is said; a state directory this refused mount made is not left behind: its
        # contents are its daemon's; the parents made for it go only while empty (/run/mokka
        # may meanwhile hold another daemon's mounts/).
        import shutil

        shutil.rmtree(opts.state_dir, ignore_errors=True)
        for parent in Path(opts.state_dir).absolute().parents:
            if not parent.is_relative_to(made):
                break
            try:
                os.rmdir(parent)
            except OSError:
                break
    return _fail(reason)


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what mkdir -p would make)."""
    missing = None
    for p in (path.absolute(), *path.absolute().parents):
        if os.path.lexists(p):
            break
        missing = p
    return missing


def _alive(pid: int) -> bool:
    """True while `pid` runs; an exited daemon waiting to be reaped (a zombie) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmd_umount(args) -> int:
    mnt = args.mountpoint
    pidf = pid_file(mnt)
    try:
        pid = int(pidf.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pid = None
    deadline = time.monotonic() + 10
    while pid is not None and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        os.stat(mnt)
    except OSError as e:
        if e.errno not in DEAD_MOUNT_ERRNOS:
            return _fail(f"{mnt}: {e.strerror}")
    if is_mounted(mnt):
        res = subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, text=True)
        if res.returncode != 0:
            return _fail(f"{mnt}: {res.stderr.strip()}")
    return 0


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text().strip()


def cmd_status(args) -> int:
    root = Path(args.root)
    try:
        count = int(_read(root, "node/gpu_count"))
        profile = _read(root, "node/profile")
        driver = _read(root, "node/driver_version")
        cuda = _read(root, "node/cuda_version")
    except OSError as e:
        return _fail(f"{root}: not a mokkafs mount ({e.strerror})")
    print(f"{root}: {count} x {profile}, driver {driver}, CUDA {cuda}")
    header = f"{'GPU':<4} {'NAME':<24} {'BUS-ID':<17} {'TEMP':>5} {'POWER':>9} {'MEM-USED':>10} {'UTIL':>5}  {'HEALTH':<10} FAULTS"
    print(header)
    for i in range(count):
        info = dict(line.split(": ", 1) for line in _read(root, f"gpu{i}/info").splitlines())
        temp = _read(root, f"gpu{i}/temperature")
        power = _read(root, f"gpu{i}/power")
        mem = _read(root, f"gpu{i}/memory_used")
        util = _read(root, f"gpu{i}/utilization").split()[0]
        print(
            f"{i:<4} {info['name'][:24]:<24} {info['bus_id']:<17} {temp + 'C':>5} {power + 'W':>9} "
            f"{mem + 'MiB':>10} {util + '%':>5}  {info['health']:<10} {info['faults']}"
        )
    # Settings that differ from their defaults (gpuN/config marks them), one line per GPU.
    for i in range(count):
        try:
            changed = [line for line in _read(root, f"gpu{i}/config").splitlines() if "(default " in line]
        except OSError:
            continue  # a daemon from before settings existed
        if changed:
            print(f"gpu{i} settings: " + "; ".join(changed))
    # MIG, where it is not the default (off): mode, a pending change, and the layout.
    for i in range(count):
        try:
            line = _mig_summary(_read(root, f"gpu{i}/mig"))
        except OSError:
            continue  # a daemon from before MIG
        if line:
            print(f"gpu{i} MIG: {line}")
    return 0


def _mig_summary(text: str) -> str | None:
    """One line from `gpuN/mig` (docs/mig.md): None when MIG is off with nothing pending, or the
    board has none."""
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line and not line.startswith(" "))
    mode, pending = fields.get("mode"), fields.get("pending", fields.get("mode"))
    if mode not in ("enabled", "disabled") or (mode == "disabled" and pending == "disabled"):
        return None
    gis: list[list[str]] = []
    for line in text.splitlines():
        words = line.split()
        if line.startswith("gi "):
            gis.append([f"gi{words[1]} {words[words.index('profile') + 1]}", 0])
        elif line.startswith("  ci ") and gis:
            gis[-1][1] += 1
    out = mode + ("" if pending == mode else f" (pending {pending}: takes effect at the next GPU reset)")
    if mode == "enabled":
        listed = ", ".join(f"{name} ({n} ci)" for name, n in gis)
        out += f", {len(gis)} GPU instance{'' if len(gis) == 1 else 's'}" + (f": {listed}" if gis else "")
    return out


def cmd_inject(args) -> int:
    from mokkafs.model import commands
    from mokkafs.model.events import InvalidCommand

    # Parsed here by the vocabulary the daemon's control file uses, so a bad command is refused
    # with its reason before anything is written. No value: the verb's default (reset, lost).
    file = commands.VERBS["gpu"][args.kind].file
    where = f"gpu{args.gpu}/{file}" if file else f"gpu{args.gpu} {args.kind}"
    try:
        command = commands.command(commands.gpu(args.gpu), args.kind, " ".join(args.value) if args.value else None)
    except InvalidCommand as e:
        return _fail(f"{where}: {e}", 2)
    if command.path is None:
        return _send_control(args.root, str(command), where)
    path = Path(args.root) / command.path
    try:
        with open(path, "wb", buffering=0) as f:
            f.write(command.payload + b"\n")
    except OSError as e:
        return _fail(f"{path}: {e.strerror}", 2)
    return 0


def _send_control(root: str, line: str, where: str) -> int:
    """A setting, through the daemon's control socket beside the mounted node's state file;
    a refusal is said as a parse error is (`where: reason`)."""
    from mokkafs.cli.control_client import NoDaemon, send
    from mokkafs.daemon.control_protocol import control_path

    sock = control_path(Path(root) / "driver" / "run" / "mokka" / "state")
    try:
        reply = send(sock, line)
    except NoDaemon as e:
        return _fail(f"{e}; is a node mounted at {root}?", 2)
    return 0 if reply.ok else _fail(f"{where}: {reply.message or reply.status}", 2)


def _shipped_table(names: list[str], load, row, min_width: int = 0) -> int:
    """One line per shipped name: the name in a column as wide as the longest (at least
    `min_width`), then `row(load(name))`, or `INVALID: why` for one that does not load."""
    from mokkafs.model.schema import ProfileError

    width = max([min_width, *map(len, names)])
    for name in names:
        try:
            item = load(name)
        except ProfileError as e:
            print(f"{name:<{width}} INVALID: {e}")
            continue
        print(f"{name:<{width}} {row(item)}")
    return 0


def cmd_profiles(args) -> int:
    from mokkafs.model.profiles import available_profiles, load_profile

    def row(p) -> str:
        return (f"{p.product_name:<24} {p.architecture:<12} {p.memory.total_mib:>7} MiB "
                f"{p.power.default_limit_w:>6.0f} W  {_count(p.node.gpus, 'GPU')}, driver {p.node.driver_version}"
                f"{f', node {p.composition.name}' if p.composition else ''}")

    return _shipped_table(available_profiles(), load_profile, row)


def _count(n: int, noun: str, plural: str = "") -> str:
    """`1 GPU`, `8 GPUs`; `4 NVSwitches` given its plural."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def cmd_nodes(args) -> int:
    from mokkafs.model.profiles import available_compositions, load_composition

    def row(c) -> str:
        switches = _count(c.nvswitches, "NVSwitch", "NVSwitches") if c.nvswitches else "no NVSwitch"
        hcas = f"{c.hcas} x {c.hca.model}" if c.hca and c.hcas else "no HCA"
        return (f"{c.gpus:>2} {'GPU ' if c.gpus == 1 else 'GPUs'}  {c.cpu.numa_nodes} x {c.cpu.arch:<7}  {switches:<13}  "
                f"{hcas:<16} driver {c.driver_version}")

    return _shipped_table(available_compositions(), load_composition, row, min_width=14)


def cmd_profile_import(args) -> int:
    """Captures of a real node -> a profile file; refused (nothing written) when it would not load."""
    from mokkafs.model.profile_import import ImportRefused, import_profile
    from mokkafs.model.schema import ProfileError
    from mokkafs.model.profiles import load_profile, read_input

    try:
        # Bounded, regular files only: a FIFO or /dev/zero given as a capture is refused at once.
        files = [(path, read_input(Path(path), "capture", 64 << 20)) for path in args.captures]
        board = (args.fill_from, load_profile(args.fill_from)) if args.fill_from else None
        imported, profile, text = import_profile(files, args.name or Path(args.output).stem, board, args.driver_version)
    except OSError as e:
        return _fail(f"{e.filename}: {e.strerror}", 2)
    except (ImportRefused, ProfileError) as e:
        return _fail(str(e), 2)
    Path(args.output).write_text(text)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    for key, reason in imported.optional.items():
        print(f"not captured, left at the default: {key} ({reason})", file=sys.stderr)
    filled = f"; filled from {imported.fill_name}: {', '.join(imported.filled)}" if imported.filled else ""
    print(f"mokka: wrote {args.output} ({profile.product_name}){filled}")
    return 0


def cmd_profile_record(args) -> int:
    """This node, read live (NVML, nvidia-smi, sysfs) -> a profile file; nothing written on refusal."""
    from mokkafs.cli.profile_record import RecordRefused, record, write_atomically
    from mokkafs.model.schema import ProfileError
    from mokkafs.model.profiles import load_profile

    out = Path(args.output)
    node_out = args.node_out or str(out.with_name(f"{out.stem}.node.yaml"))
    if os.path.abspath(node_out) == os.path.abspath(args.output):
        return _fail(f"profile record: --node-out {node_out} is the profile's own file", 2)
    try:
        board = (args.fill_from, load_profile(args.fill_from)) if args.fill_from else None
        rec = record(args.name or out.stem, board, profile_file=os.path.basename(args.output),
                     node_file=os.path.relpath(node_out, os.path.dirname(os.path.abspath(args.output))))
        write_atomically({node_out: rec.composition.text, args.output: rec.text})
    except (RecordRefused, ProfileError) as e:
        return _fail(f"profile record: {e}", 2)
    except OSError as e:
        return _fail(f"{e.filename or args.output}: {e.strerror}", 2)
    for note in rec.imported.notes:
        print(f"note: {note}", file=sys.stderr)
    for key, reason in rec.imported.optional.items():
        print(f"not read, left at the default: {key} ({reason})", file=sys.stderr)
    filled = f"; filled from {rec.imported.fill_name}: {', '.join(rec.imported.filled)}" if rec.imported.filled else ""
    print(f"mokka: wrote {args.output} ({len(rec.node.gpus)} x {rec.profile.product_name}){filled}")
    print(f"mokka: wrote {node_out} (node composition {rec.composition.composition.name}); mount the two with "
          f"`mokka mount MNT --profile {args.output} --node {node_out}`")
    return 0


def cmd_run(args) -> int:
    from mokkafs.cli.run import run

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return run(args.root, cmd, args.gpus)


def cmd_agent(args) -> int:
    from mokkafs.agent import watch

    # The defaults live with the agent, which only this command imports (kubernetes is heavy).
    for name, default in (("mountpoint", watch.DEFAULT_MOUNTPOINT), ("state_dir", watch.DEFAULT_STATE_DIR),
                          ("cdi_spec", watch.DEFAULT_CDI_SPEC), ("nfd_features", watch.DEFAULT_NFD_FEATURES)):
        if getattr(args, name) is None:
            setattr(args, name, default)
    _setup_logging(sys.stderr)
    return watch.main(args)


def _absolute(path: str) -> str:
    if not path.startswith("/") or "\n" in path:
        raise argparse.ArgumentTypeError(f"{path!r}: an absolute path on one line")
    return os.path.normpath(path)


def _listen_address(spec: str) -> str:
    from mokkafs.daemon.metrics_server import parse_listen

    try:
        parse_listen(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


def cmd_env(args) -> int:
    """Shell exports that point NVML consumers at the node mounted at --root:
    eval "$(mokka env --root /mokka)"."""
    import shlex

    from mokkafs.render import native
    from mokkafs.daemon.shm.layout import state_path

    root = Path(args.root)
    try:
        state_dir = _read(root, "node/state_dir")
    except OSError:
        state_dir = DEFAULT_STATE_DIR  # a tree without node/state_dir: the daemon's default
    print(f"export MOKKA_STATE={shlex.quote(str(state_path(state_dir)))}")
    print(f"export LD_LIBRARY_PATH={shlex.quote(str(native.LIB_DIR))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    # nvidia-smi from the build, beside the NVML it loads, as the libraries are: a program started
    # in this shell then searches no FUSE directory for its libraries or commands. It reads the
    # node MOKKA_STATE names (docs/containers.md).
    smi_dir = native.LIB_DIR.parent / "bin"
    if not (smi_dir / "nvidia-smi").is_file():
        smi_dir = root / "driver" / "usr" / "bin"
    print(f"export PATH={shlex.quote(str(smi_dir))}:$PATH")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mokka", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    m = sub.add_parser("mount", help="mount a simulated node; returns once the tree is ready")
    m.add_argument("mountpoint", nargs="?", default=DEFAULT_MOUNTPOINT)
    m.add_argument("--profile", default="h100", help="a shipped profile name or a YAML file")
    m.add_argument("--node", metavar="COMPOSITION",
                   help="how the boards sit in the machine: a shipped composition (mokka profile nodes) or a YAML "
                        "file (default: the profile's composition)")
    m.add_argument("--gpus", type=int, help="GPU count (default: the composition's)")
    m.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    m.add_argument("--host-state-dir", type=_absolute, metavar="DIR",
                   help="the state directory as the host sees it, when this runs in a container that mounts it "
                        "elsewhere: what node/state_dir and driver/run/mokka name (default: --state-dir)")
    m.add_argument("--hostname", help="seeds UUIDs and serials (default: this host's name)")
    m.add_argument("--driver-version")
    m.add_argument("--cuda-version")
    m.add_argument("--numa-nodes", type=int, help="NUMA nodes the GPUs spread over (default: the profile's)")
    m.add_argument("--hcas", type=int, help="InfiniBand HCAs (default: the profile's)")
    m.add_argument("--kmsg", action="store_true", help="also write Xid lines to /dev/kmsg")
    m.add_argument(
        "--metrics",
        nargs="?",
        const="127.0.0.1:9400",
        type=_listen_address,
        metavar="[HOST:]PORT",
        help="serve dcgm-exporter-style /metrics (bare flag: 127.0.0.1:9400; :PORT binds all interfaces)",
    )
    m.add_argument(
        "--control-group",
        type=_group,
        metavar="GROUP",
        help="a group (name or gid) whose members may write control files too (default: root only)",
    )
    m.add_argument("-f", "--foreground", action="store_true")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount and stop the daemon")
    u.add_argument("mountpoint", nargs="?", default=DEFAULT_MOUNTPOINT)
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser("status", help="a table of GPUs, health and active faults")
    s.add_argument("--root", default=DEFAULT_MOUNTPOINT)
    s.set_defaults(func=cmd_status)

    i = sub.add_parser("inject", help="write a control file or a setting: mokka inject 0 xid 79, "
                                      "mokka inject 1 power_limit 400")
    i.add_argument("--root", default=DEFAULT_MOUNTPOINT)
    i.add_argument("gpu", type=int)
    i.add_argument("kind", choices=INJECT_KINDS)
    i.add_argument("value", nargs="*")
    i.set_defaults(func=cmd_inject)

    r = sub.add_parser("run", help="run a command that sees the node at /sys, /proc and /dev: mokka run -- lspci")
    r.add_argument("--root", default=DEFAULT_MOUNTPOINT)
    r.add_argument("--gpus", help="give CMD only these GPUs' device nodes, as a container gets them: "
                                  "indexes, GPU-/MIG- UUIDs or all, comma-separated (default: every node)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS]")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("env", help="exports for LD_LIBRARY_PATH, PATH and MOKKA_STATE: eval \"$(mokka env)\"")
    e.add_argument("--root", default=DEFAULT_MOUNTPOINT)
    e.set_defaults(func=cmd_env)

    g = sub.add_parser("agent", help="in a Kubernetes DaemonSet: mount, inject and run scenarios from Node annotations, report health")
    g.add_argument("--node-name", help="this Node's name (default: $NODE_NAME)")
    g.add_argument("--kubeconfig", help="default: in-cluster config, else ~/.kube/config")
    g.add_argument("--mountpoint", help="default: /var/lib/mokkafs/root (mokkafs.agent)")
    g.add_argument("--state-dir", help="default: /var/lib/mokkafs/state (mokkafs.agent)")
    g.add_argument("--host-mountpoint", type=_absolute,
                   help="--mountpoint as the host sees it, for the CDI spec (default: $MOKKA_HOST_MOUNTPOINT, "
                        "else --mountpoint; the DaemonSet sets it from its hostPath)")
    g.add_argument("--host-state-dir", type=_absolute,
                   help="--state-dir as the host sees it, for node/state_dir and the CDI spec (default: "
                        "$MOKKA_HOST_STATE_DIR, else --state-dir)")
    g.add_argument("--profile", help="default: label mokkafs.io/profile, else $MOKKA_PROFILE, else h100")
    g.add_argument("--gpus", help="default: label mokkafs.io/gpus, else $MOKKA_GPUS, else the profile's")
    g.add_argument("--node", help="a shipped composition (default: label mokkafs.io/node, else $MOKKA_NODE, "
                                  "else the profile's)")
    g.add_argument("--no-mount", action="store_true", help="use a node already mounted at --mountpoint")
    g.add_argument("--kmsg", action="store_true", help="also write Xid lines to /dev/kmsg")
    g.add_argument("--cdi-spec", help="'' to skip (default: /var/run/cdi/nvidia.yaml)")
    g.add_argument("--nfd-features", help="'' to skip (default: NFD's features.d/mokkafs)")
    g.add_argument("--resync", type=float, default=30.0, help="seconds between health checks and rewatches")
    g.add_argument("--namespace", help="where scenario ConfigMaps are read (default: $POD_NAMESPACE, else mokkafs)")
    g.set_defaults(func=cmd_agent)

    p = sub.add_parser("profiles", help="the shipped profiles, one line each (as `profile list`)")
    p.set_defaults(func=cmd_profiles)
    pr = sub.add_parser("profile", help="GPU profiles: list the shipped ones, import one from a real node's "
                                        "captures, record this node")
    prs = pr.add_subparsers(dest="profile_command", required=True)
    prs.add_parser("list", help="the shipped profiles, one line each").set_defaults(func=cmd_profiles)
    prs.add_parser("nodes", help="the shipped node compositions, one line each").set_defaults(func=cmd_nodes)
    pi = prs.add_parser("import", help="a profile from nvidia-smi -q -x (and -q, topo -m, nvlink -s, lspci) captures")
    pi.add_argument("captures", nargs="+", metavar="CAPTURE")
    pi.add_argument("-o", "--output", required=True, metavar="FILE")
    pi.add_argument("--name", help="the profile's name (default: FILE without .yaml)")
    pi.add_argument("--fill-from", metavar="PROFILE",
                    help="take what the captures lack from this board (same architecture)")
    pi.add_argument("--driver-version", help="the node's driver when the capture's branch is not modelled")
    pi.set_defaults(func=cmd_profile_import)
    prr = prs.add_parser("record", help="a profile of this node and its node composition, read live (NVML, "
                                         "nvidia-smi, CUDA, sysfs); read-only")
    prr.add_argument("-o", "--output", required=True, metavar="FILE")
    prr.add_argument("--node-out", metavar="FILE",
                     help="the node composition (bus ids, NUMA, CPUs, NVSwitches, HCAs) beside the profile "
                          "(default: FILE.node.yaml, FILE without .yaml); mount with --profile FILE --node this")
    prr.add_argument("--name", help="the profile's name (default: FILE without .yaml)")
    prr.add_argument("--fill-from", metavar="PROFILE",
                     help="take what the node cannot show (thermal.max_load_c...) from this board (same architecture)")
    prr.set_defaults(func=cmd_profile_record)

    from mokkafs.cli import scenario as scenario_cli

    scenario_cli.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`mokka status | head -1`): what it wanted it has, so stop quietly,
        # and point stdout at /dev/null so the interpreter's own flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return rc


def entry() -> int:
    """The `mokka` command and `python -m mokkafs.cli`: `main`, then nothing left for the
    interpreter's exit to collect. Its final garbage collections walk every object the command
    made or imported (pydantic's schemas, the node, trio): 80-95 ms after `mokka mount` had
    its answer, more than a tenth of mount -> ready. Frozen objects are still freed and every
    exit handler still runs; only those collections are skipped, in a process that is ending.
    Not in `main`, which tests call in their own long-lived process."""
    rc = main()
    gc.freeze()
    return rc

