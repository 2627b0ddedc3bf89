"""One daemon lifetime, top to bottom: load the node, restore its state, mount, serve until a
signal or an unmount, tear down in reverse order."""
from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import signal
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import trio

from mokkafs.daemon.clock import Clock, TrioClock
from mokkafs.daemon.control_socket import ControlSocket, control_path
from mokkafs.daemon.controller import Controller
from mokkafs.daemon.fuse_ops import MokkaOperations
from mokkafs.daemon.kmsg import KmsgWriter
from mokkafs.daemon.mirror import Mirror, mirror_path
from mokkafs.daemon.node_socket import NodeSocket, node_socket_path
from mokkafs.daemon.paths import DEAD_MOUNT_ERRNOS, DEFAULT_MOUNTPOINT, DEFAULT_STATE_DIR, is_mounted, pid_file
from mokkafs.model import Node, compose
from mokkafs.model.identity import NodeConfig
from mokkafs.daemon.persist import StateDir, StateError, check_state_dir
from mokkafs.model.profiles import load_profile
from mokkafs.daemon.host_modules import HostModules
from mokkafs.render.tree import root
from mokkafs.daemon.scenario_runner import ScenarioRunner
from mokkafs.daemon.shm.layout import state_path
from mokkafs.daemon.shm.proctable import ProcessTable, procs_path
from mokkafs.daemon.shm.publisher import TICK_S, Publisher
from mokkafs.daemon.socket_bind import SocketBind, may_bind
from mokkafs.render.driver import PERSISTENCED_SOCKET
from mokkafs.render.vfs import Tree

log = logging.getLogger(__name__)



@dataclass
class Options:
    mountpoint: str = DEFAULT_MOUNTPOINT
    profile: str = "h100"
    node: str | None = None  # a composition: a shipped name or a YAML file (default: the profile's)
    gpus: int | None = None
    state_dir: str = DEFAULT_STATE_DIR
    # The state directory as processes outside this mount namespace reach it (a container whose
    # hostPath differs from its mountPath): what node/state_dir and driver/run/ name. None: state_dir.
    host_state_dir: str | None = None
    hostname: str = field(default_factory=socket.gethostname)
    driver_version: str | None = None
    cuda_version: str | None = None
    numa_nodes: int | None = None
    hcas: int | None = None
    kmsg: bool = False
    allow_other: bool = True
    metrics: str | None = None  # [HOST:]PORT to serve /metrics on (mokkafs.daemon.metrics_server)
    control_group: int | None = None  # gid that may write control files besides root
    tick_s: float = TICK_S  # how often time-varying values are republished and CUDA records folded
    # The node, composed already: `mokka mount` checks the profile and composition before it
    # makes anything or forks, and hands the daemon what it checked. None: composed in `build`.
    config: NodeConfig | None = None


def clear_stale_mount(mountpoint: str) -> None:
    """A daemon killed without unmounting leaves a mount whose every access fails ENOTCONN;
    detach it so the new daemon can mount in its place."""
    try:
        # statfs always reaches the daemon (the kernel caches no answer to it), so a dead
        # daemon's mount answers ENOTCONN here even where attributes are cached.
        os.statvfs(mountpoint)
    except OSError as e:
        if e.errno not in DEAD_MOUNT_ERRNOS:
            return
        log.warning("%s: clearing stale mount left by a dead daemon", mountpoint)
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            os.stat(mountpoint)


def node_config(opts: Options) -> NodeConfig:
    """The node `opts` describe: its profile in its composition with the overrides. Raises
    ProfileError naming the file and key; reads nothing but the profile and composition."""
    return compose(
        load_profile(opts.profile),
        node=opts.node,
        gpus=opts.gpus,
        driver_version=opts.driver_version,
        cuda_version=opts.cuda_version,
        numa_nodes=opts.numa_nodes,
        hcas=opts.hcas,
        hostname=opts.hostname,
    )


def build(
    opts: Options, clock: Callable[[], float], scenario_status: Callable[[float], str] | None = None,
    bind_node_socket: bool = False,
) -> tuple[Controller, Tree, bool]:
    """The node, its restored state and its tree; no mounting. Raises ProfileError/StateError.
    `bind_node_socket`: the daemon will bind the node's socket into the driver root."""
    config = opts.config if opts.config is not None else node_config(opts)
    node = Node(config, clock())
    state = StateDir(Path(opts.state_dir))
    restored = state.open(node)
    controller = Controller(node, state, clock)
    shown = opts.host_state_dir or os.path.abspath(opts.state_dir)
    tree = Tree(root(config, state_dir=shown, scenario_status=scenario_status,
                     host_modules=HostModules(), bind_node_socket=bind_node_socket))
    return controller, tree, restored


async def _flush_refusals(ops: MokkaOperations, clock: Clock) -> None:
    """Summaries of rate-limited refusals are logged once their window ends, even when no
    further refusal comes to trigger them. With no window open nothing can come due: wait for
    a refusal rather than wake every second."""
    while True:
        ops.refused = trio.Event()
        if not ops.limiter:
            await ops.refused.wait()
        await clock.sleep(1)
        ops.flush_refusals()


async def _freeze_start_up(mirror: Mirror) -> None:
    """Move what start-up made (profile, node, tree, the mirror's rendering: some 50,000
    objects) out of the collector's sight. A full collection would otherwise walk all of them,
    a 30-70 ms pause on the event loop that a control write or a reader can land in; what
    start-up made lives as long as the daemon. `serve` turns the collector off for the start
    itself (building the tree set off one such collection, ~30 ms of every mount -> ready at 8
    GPUs): it comes back on here, with what start-up made frozen first."""
    gc.freeze()
    gc.enable()
    await mirror.ready.wait()
    gc.freeze()


async def _watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            pyfuse3.terminate()
            return


def _mount_options(opts: Options) -> set[str]:
    options = set(pyfuse3.default_options)
    options.add("fsname=mokkafs")
    options.add("subtype=mokkafs")
    # The kernel checks the modes and owners we report on every open (control files are root's,
    # or the control group's); the daemon checks the caller again in open() (docs/security.md).
    options.add("default_permissions")
    if opts.allow_other:
        options.add("allow_other")
    return options


@contextlib.contextmanager
def state_lock(state_dir: str):
    """One daemon per state directory: a second one would publish into the same state file,
    reap the same process table and take over its socket. Held for the daemon's life."""
    check_state_dir(Path(state_dir))
    lock = Path(state_dir) / "daemon.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StateError(f"{lock}: cannot open ({e.strerror}); a symlink here is refused") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StateError(f"{lock}: not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"{state_dir} is in use by another mokka daemon; `mokka umount` it first") from None
    try:
        yield
    finally:
        os.close(fd)


@dataclass
class Daemon:
    """The parts of a running daemon, for its lifetime and for tests that drive it directly."""

    controller: Controller
    tree: Tree
    restored: bool
    clock: Clock
    publisher: Publisher
    procs: ProcessTable
    ops: MokkaOperations
    mirror: Mirror
    control: ControlSocket
    metrics: tuple[str, int] | None = None  # where /metrics is served
    scenarios: ScenarioRunner | None = None
    node_socket: NodeSocket | None = None


async def start(
    opts: Options,
    clock: Clock,
    stack: contextlib.ExitStack,
    nursery: trio.Nursery,
    mount: Callable[[MokkaOperations], None] | None = None,
    bind_node_socket: bool = False,
    served: trio.Event | None = None,
) -> Daemon:
    """Build the node and start every service of the daemon on `clock`, in order: the state
    file and the process table before the mount (a consumer that finds the tree must find
    them), `mount(ops)` (the kernel's; None to call the operations directly), then what serves
    the mounted node. Teardown goes on `stack`, tasks into `nursery`. `bind_node_socket`: the
    tree has a socket placeholder where the caller binds the node's socket once the mount serves.
    `served`: set by the caller once it has said the node is ready; work that need not come
    before (the mirror's first rendering) waits for it."""
    scenarios = ScenarioRunner(clock)
    controller, tree, restored = build(opts, clock, scenarios.status, bind_node_socket)
    scenarios.attach(controller)
    node = controller.node
    # The publisher hears of each event first: a waiter in nvmlEventSetWait wakes before the
    # other views (kernel log, mirror) and persistence do their work.
    publisher = Publisher(state_path(opts.state_dir), clock, opts.tick_s)
    publisher.open()
    stack.callback(publisher.close)
    controller.subscribers.append(publisher)
    await nursery.start(publisher.run, node)
    if opts.kmsg:
        writer = KmsgWriter()
        stack.callback(writer.close)
        controller.subscribers.append(writer)
    # CUDA processes (their records) fold into the model on their own tick, and at once
    # when a process first takes a context or memory on a GPU.
    procs = ProcessTable(procs_path(state_path(opts.state_dir)), clock, opts.tick_s)
    procs.open()
    stack.callback(procs.close)
    nursery.start_soon(procs.run, controller)
    await nursery.start(procs.serve, controller)

    ops = MokkaOperations(tree, controller, clock, control_gid=opts.control_group)
    stack.callback(ops.flush_refusals, True)  # no refusal count is lost at unmount
    # Setters (NVML's, `mokka inject`'s) come in here, under the control files' rule.
    control = ControlSocket(control_path(state_path(opts.state_dir)), controller, ops.may_write, clock)
    stack.callback(control.flush_refusals, True)
    await nursery.start(control.serve)
    # A container made from NVIDIA's CDI spec reaches the node through the driver root's
    # run/nvidia-persistenced/socket, which is this socket or links here (docs/containers.md).
    node_socket = NodeSocket(node_socket_path(opts.state_dir), state_path(opts.state_dir), clock, control)
    await nursery.start(node_socket.serve)
    if mount is not None:
        mount(ops)

    # Services that serve the mounted node start here.
    # The plain-directory mirror of sys/, proc/ and dev/ that `mokka run` binds; its
    # first, whole write happens in the background (the mount serves meanwhile).
    mirror = Mirror(tree, mirror_path(opts.state_dir), clock)
    controller.subscribers.append(mirror)
    await nursery.start(mirror.run, node, served)
    bound = None
    if opts.metrics is not None:
        from mokkafs.daemon import metrics_server as metrics

        server = metrics.MetricsServer(controller, lambda: (ops.operations, ops.errors), clock)
        stack.callback(server.refusals.flush, True)
        bound = await nursery.start(metrics.serve, opts.metrics, server)
    nursery.start_soon(_flush_refusals, ops, clock)
    # Last: a scenario left running by a previous daemon resumes on a node that serves.
    await nursery.start(scenarios.run)
    return Daemon(controller, tree, restored, clock, publisher, procs, ops, mirror, control, bound, scenarios,
                  node_socket)


async def _bind_node_socket(stack: contextlib.ExitStack, node_socket: NodeSocket, target: Path) -> None:
    """Bind the node's socket over the driver root's placeholder, and again whenever the
    NodeSocket binds a new one; unbound at teardown before the FUSE unmount (`stack` is LIFO).
    The mount must serve already: the bind looks its target up in the mount, from a worker
    thread (the loop serves that lookup meanwhile)."""
    if not node_socket.path.is_socket():
        return  # it could not listen and said so; the daemon runs on, the placeholder refuses callers
    bind = SocketBind(node_socket.path, target)
    stack.callback(bind.unbind)
    try:
        await trio.to_thread.run_sync(bind.bind, abandon_on_cancel=True)
    except OSError as e:
        raise RuntimeError(f"{target}: cannot bind the node's socket there ({e}); a pod given the driver "
                           "root alone would find no node") from None

    async def rebound() -> None:
        try:
            await trio.to_thread.run_sync(bind.bind, abandon_on_cancel=True)
        except OSError as e:
            log.warning("%s: %s; pods given the driver root alone find no node", target, e)

    node_socket.rebound = rebound


async def serve(
    opts: Options, task_status=trio.TASK_STATUS_IGNORED, clock: Clock | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Mount and serve the node until a signal or an unmount. `on_ready` is called once the
    tree answers (`mokka mount` tells its parent then), before start-up's deferred work."""
    mountpoint = opts.mountpoint
    clock = TrioClock() if clock is None else clock
    with contextlib.ExitStack() as stack:
        # Refuse before touching anything a running daemon owns (state, table, socket, mount).
        stack.enter_context(state_lock(opts.state_dir))
        clear_stale_mount(mountpoint)
        os.makedirs(mountpoint, exist_ok=True)
        if is_mounted(mountpoint):
            raise RuntimeError(f"{mountpoint} is already a mount point; `mokka umount {mountpoint}` first")
        # Resolve the pid file's name before mounting: realpath() would stat the mount
        # point, and a FUSE daemon that stats its own mount before serving deadlocks.
        pidf = pid_file(mountpoint)

        def mount(ops: MokkaOperations) -> None:
            pyfuse3.init(ops, mountpoint, _mount_options(opts))
            stack.callback(pyfuse3.close, unmount=True)
            pidf.parent.mkdir(parents=True, exist_ok=True)
            pidf.write_text(f"{os.getpid()}\n")
            stack.callback(lambda: pidf.unlink(missing_ok=True))

        # Root binds the node's socket into the driver root (mokkafs/daemon/socket_bind.py).
        binds = may_bind()
        sock_target = Path(os.path.abspath(mountpoint), "driver", PERSISTENCED_SOCKET)

        async def serve_fuse(done: trio.CancelScope) -> None:
            await pyfuse3.main()
            done.cancel()

        gc.disable()  # until _freeze_start_up: no full collection over what the start is making
        stack.callback(gc.enable)  # a start that fails turns it back on too
        async with trio.open_nursery() as nursery:
            served = trio.Event()
            daemon = await start(opts, clock, stack, nursery, mount, bind_node_socket=binds, served=served)
            nursery.start_soon(_watch_signals)
            nursery.start_soon(_freeze_start_up, daemon.mirror)
            node = daemon.controller.node
            log.info(
                "%s: %d x %s (%s), state %s%s",
                mountpoint,
                len(node.gpus),
                node.profile.name,
                node.profile.product_name,
                opts.state_dir,
                " (restored)" if daemon.restored else "",
            )
            nursery.start_soon(serve_fuse, nursery.cancel_scope)
            if binds:
                # Before "ready": a consumer started right after finds the socket.
                await _bind_node_socket(stack, daemon.node_socket, sock_target)
            task_status.started()
            if on_ready is not None:
                on_ready()
            served.set()
