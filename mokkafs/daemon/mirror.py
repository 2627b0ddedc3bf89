"""A plain-directory mirror of the node's `sys/`, `proc/` and `dev/` trees, for `mokka run`.

Real tools walk sysfs with thousands of small opens (lspci -vvv: ~2000 system calls), and each
one through FUSE is a round trip to this daemon. None of these trees depends on time, only on
the model's state, so the daemon renders them with the same renderers into
`<state-dir>/mirror/` at start and again on every event, before the write that caused the event
returns; `mokka run` binds the mirror at the real paths, where tools read it at page-cache
speed. The FUSE tree under the mount point stays the one computed on read.

Updates are in place and per entry (a file is replaced by rename, a vanished directory removed),
so bind mounts of the mirror's directories see them at once, as they would see a hot-unplug in
real sysfs. An event that changes only MIG layouts re-renders only what those are rendered
into, the capability files and the `nvidia-caps` device nodes (`MIG_TREES`): a MIG create
then costs a few dozen entries, not the whole tree; one that changes only which GPUs are on the
bus re-renders only their host bridges' subtrees, the bus's links and `proc/driver/nvidia/gpus`
(`lost_trees`). The first, whole mirror is written off the event loop after the mount is ready
(thousands of files for a big node) into `mirror.new/` and renamed into place when complete;
until then `mokka run` binds the mount itself, and so it does for good where the first write
finds no room (the daemon has said "ready" and runs on) or the mirror's directory is replaced
or removed behind the daemon (never written through: it removes what is there). An update cut
short (a full disk) is finished by the next event's.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import trio

from mokkafs.model import Node, Outcome
from mokkafs.render.vfs import CharDev, Ctx, Dir, Entry, File, Symlink, Tree

log = logging.getLogger(__name__)

TREES = ("sys", "proc", "dev")
# Entries that depend on the host at the moment they are read, not on the model: `mokka run`
# binds them from the mount itself, so the mirror leaves them out.
LIVE = frozenset({"proc/modules"})

# The only entries a MIG layout is rendered into (render/proc_nvidia.py, render/dev.py): when
# nothing else of `Node.device_tree_state` changed, the mirror re-renders just these.
MIG_TREES = ("proc/driver/nvidia/capabilities", "dev/nvidia-caps")

# The only entries whether GPU i is on the bus is rendered into (render/sysfs_pci.py: its device
# directory and its bridges' link state under its host bridge, the bus's device and driver links;
# render/proc_nvidia.py: proc/driver/nvidia/gpus, and the MIG capabilities a lost GPU loses): when
# only GPUs' bus presence (and MIG layouts) changed, the mirror re-renders just these, not the whole
# tree (a GPU falling off the bus or coming back cost the loop ~7 ms at 8 GPUs, ~15 ms at 64,
# rendering and comparing thousands of entries to change a few dozen).
BUS_TREES = ("sys/bus/pci", "proc/driver/nvidia/gpus") + MIG_TREES


def lost_trees(node: Node, gpus) -> tuple[str, ...]:
    """The mirror's subtrees that GPUs `gpus` going off the bus or coming back change."""
    bridges = sorted({fn.host_bridge for fn in node.layout.functions if fn.kind == "gpu" and fn.index in gpus})
    return tuple(f"sys/devices/{b}" for b in bridges) + BUS_TREES


# What an entry is on disk: ("d", mode) | ("f", mode, bytes) | ("l", target) | ("c", mode, rdev)
Item = tuple


def mirror_path(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / "mirror"


def render(tree: Tree, ctx: Ctx, tops: tuple[str, ...] = TREES) -> dict[str, Item]:
    """Every entry under `tops` (paths from the root, `sys` or `proc/driver/nvidia/capabilities`),
    by relative path, parents before children; a top that does not exist has no entries."""
    out: dict[str, Item] = {}
    for top in tops:
        entry: Entry | None = tree.root
        for name in top.split("/"):
            entry = entry.children(ctx).get(name) if isinstance(entry, Dir) else None
            if entry is None:
                break
        if entry is not None:
            _walk(entry, top, ctx, out)
    return out


def _walk(entry: Entry, path: str, ctx: Ctx, out: dict[str, Item]) -> None:
    if path in LIVE:
        return
    if isinstance(entry, Dir):
        out[path] = ("d", entry.mode)
        for name, child in entry.children(ctx).items():
            _walk(child, f"{path}/{name}", ctx, out)
    elif isinstance(entry, File):
        out[path] = ("f", entry.perm, entry.read(ctx))
    elif isinstance(entry, Symlink):
        out[path] = ("l", entry.resolve(ctx))
    elif isinstance(entry, CharDev):
        out[path] = ("c", entry.mode, os.makedev(entry.major, entry.minor))


def _under(tops: tuple[str, ...]) -> Callable[[str], object]:
    """Whether a relative path is one of `tops` or below one: a compiled pattern's match, which
    `filter` calls at C speed over the mirror's thousands of paths (a Python predicate per path
    cost a partial update ~1 ms at 8 GPUs before it had changed anything)."""
    return re.compile("(?:" + "|".join(map(re.escape, tops)) + ")(?:/|$)").match


def _identity(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the directory at `path`, never through a link; None for anything else."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _remove_path(path: Path) -> None:
    """Remove whatever is at `path` without following a link there: a symlink is unlinked, its
    target untouched; rmtree does not descend into links below a real directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


class Mirror:
    def __init__(self, tree: Tree, path: Path, clock: Callable[[], float]) -> None:
        self.tree = tree
        self.path = Path(path)
        self.clock = clock
        self._items: dict[str, Item] = {}
        self._rendered_state: tuple | None = None
        self._ready = False
        self._made: tuple[int, int] | None = None  # (st_dev, st_ino) of the directory it wrote
        # Set once `run` is done with the first, whole write: the mirror is in place, or the
        # disk had no room for it and the daemon runs without one.
        self.ready = trio.Event()

    def start(self, node: Node) -> None:
        """Write the whole mirror now, replacing whatever an earlier daemon left there."""
        self._clear()
        self.path.mkdir(parents=True)
        self._made = _identity(self.path)
        self._ready = True
        self.sync(node)

    async def run(self, node: Node, after: trio.Event | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """`start`, with the file writing in a worker thread so the mount serves meanwhile.
        The model is only read on the event loop: the thread writes a finished rendering.
        `after`: render only once it is set (the daemon has said "ready": rendering every
        file of sys/, proc/ and dev/ is 25-50 ms of the event loop, which a mount need not
        wait for)."""
        self._clear()
        task_status.started()
        if after is not None:
            await after.wait()
        state, items = node.device_tree_state(), render(self.tree, Ctx(node, self.clock()))
        staging = self.path.with_name(self.path.name + ".new")
        # A daemon stopped meanwhile (SIGTERM) leaves at once, not after the whole write (seconds
        # at 64 GPUs, after its unmount); the thread stops at its next entry and the next start
        # clears what it made. A mirror is never put in place for a node that no longer serves.
        stop = threading.Event()
        try:
            await trio.to_thread.run_sync(self._write_all, staging, items, stop, abandon_on_cancel=True)
            os.rename(staging, self.path)
        except trio.Cancelled:
            stop.set()
            raise
        except OSError as e:
            # The daemon said "ready" already: a state disk with room for the state but not for
            # the mirror's thousands of files must not stop it now.
            log.warning("%s: cannot write it (%s); the daemon runs without a mirror, and `mokka run` "
                        "reads the mount itself", self.path, e)
            with contextlib.suppress(OSError):
                _remove_path(staging)  # the space it took, back to the state's writes
            self.ready.set()
            return
        self._items, self._rendered_state, self._ready = items, state, True
        self._made = _identity(self.path)
        try:
            self.sync(node)  # whatever events changed while the thread wrote
        except OSError as e:  # as an event's update would be: the next event's finishes it
            log.warning("%s: cannot bring it up to date (%s); the next event does", self.path, e)
        log.info("%s: mirror of %d entries ready", self.path, len(items))
        self.ready.set()

    def _clear(self) -> None:
        self._items, self._rendered_state, self._ready = {}, None, False
        for leftover in (self.path, self.path.with_name(self.path.name + ".new")):
            _remove_path(leftover)

    @staticmethod
    def _write_all(base: Path, items: dict[str, Item], stop: threading.Event | None = None) -> None:
        """The whole mirror into `base`, which nothing reads until it is renamed into place:
        each entry is made where it belongs, without a temporary file and a rename. Returns
        early once `stop` is set."""
        base.mkdir(parents=True)
        for rel, item in items.items():
            if stop is not None and stop.is_set():
                return
            _create(base / rel, item)

    def __call__(self, node: Node, outcome: Outcome) -> None:
        """Controller subscriber: what changed is read off the node (`device_tree_state`)."""
        self.sync(node)

    def sync(self, node: Node) -> None:
        if not self._ready:
            return  # the first, whole write is still under way; `run` catches up after it
        # Most events (pins, ECC, Xids other than 79) leave these trees as they are: skip the
        # render (3 ms at 8 GPUs) unless what they are rendered from changed.
        state = node.device_tree_state()
        if state == self._rendered_state:
            return
        if _identity(self.path) != self._made:
            self._abandon()
            return
        ctx = Ctx(node, self.clock())
        last = self._rendered_state
        # Until this update is done, the mirror is no state's rendering: an update cut short (a
        # full disk) leaves the next one to compare everything, even if the node went back to
        # `last` meanwhile (a GPU lost, then reset). `_items` says what is on disk, entry by entry.
        self._rendered_state = None
        if last is not None and state[:-1] == last[:-1]:
            # Only MIG layouts changed (the state's last part): re-render their two small trees.
            self._update(render(self.tree, ctx, MIG_TREES), _under(MIG_TREES))
        elif last is not None and state[1] == last[1] and len(state[0]) == len(last[0]):
            # GPUs went off the bus or came back (and MIG layouts, perhaps): their trees only.
            tops = lost_trees(node, {i for i, (a, b) in enumerate(zip(state[0], last[0])) if a != b})
            self._update(render(self.tree, ctx, tops), _under(tops))
        else:
            self._update(render(self.tree, ctx), None)
        self._rendered_state = state

    def _abandon(self) -> None:
        """The mirror's directory is not the one this daemon wrote (removed, or replaced by a
        link or another directory): writing through the path would write wherever a link points,
        as root. What is there is removed (a link, not its target) and the daemon runs on without
        a mirror; `mokka run` binds the mount itself, never a tree nobody keeps up to date."""
        log.warning("%s: replaced or removed since the daemon wrote it; the daemon removes what is there "
                    "and runs without a mirror (`mokka run` reads the mount itself)", self.path)
        self._items, self._rendered_state, self._ready = {}, None, False
        _remove_path(self.path)

    def _update(self, new: dict[str, Item], covers: Callable[[str], object] | None) -> None:
        """Make the entries `covers` selects (None: all) what `new` says (`new` holds exactly those)."""
        if covers is None:
            old = dict(self._items)  # a copy at C speed: the whole mirror is thousands of entries
        else:
            items = self._items
            old = {rel: items[rel] for rel in filter(covers, items)}
        # Removals first, deepest first, so a vanished directory goes with what it held.
        for rel in sorted((p for p in old if new.get(p, (None,))[0] != old[p][0]), reverse=True):
            self._remove(rel, old[rel])
            del self._items[rel]
        items = self._items
        for rel, item in new.items():  # parents come before their children
            if old.get(rel) != item:
                self._write(rel, item, replace=rel in old and old[rel][0] == item[0])
                items[rel] = item  # on disk now, whatever fails after it

    def _remove(self, rel: str, item: Item) -> None:
        _remove_path(self.path / rel)  # may have gone with a directory removed before it

    def _write(self, rel: str, item: Item, replace: bool) -> None:
        target = self.path / rel
        kind = item[0]
        if kind == "d":
            if replace:
                os.chmod(target, item[1])
            else:
                os.mkdir(target, item[1])
            return
        tmp = target.with_name(f".{target.name}.mokka-tmp")
        _remove_path(tmp)  # a stale one is removed, never written through
        _create(tmp, item)
        os.replace(tmp, target)  # readers see the old entry or the new one, never a torn one


def _create(path: Path, item: Item) -> None:
    """Make `item` at `path`, where nothing is: O_EXCL, so never through something planted there."""
    kind = item[0]
    if kind == "d":
        os.mkdir(path, item[1])
    elif kind == "f":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, item[1])
        try:
            os.write(fd, item[2])
            os.fchmod(fd, item[1])  # not masked by the umask
        finally:
            os.close(fd)
    elif kind == "l":
        os.symlink(item[1], path)
    else:
        os.mknod(path, stat.S_IFCHR | item[1], item[2])
        os.chmod(path, item[1])
