"""The tree as data: directories, files, symlinks and device nodes whose contents and children
are computed from the model when they are looked at. No FUSE here; `fuse_ops` serves a `Tree`.

Renderer modules (one per tree: `render/control.py`, `render/sysfs_pci.py`, ...) build `Dir`s
out of these entries. A `File` may carry a parser (`write`) that turns the bytes of one write
into an event; it never applies anything itself.
"""
from __future__ import annotations

import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mokkafs.model import Event, Node


@dataclass(frozen=True)
class Ctx:
    """What every render sees: the model and the instant being rendered."""

    node: Node
    now: float


class Entry:
    """Base of everything in the tree."""


@dataclass(frozen=True, eq=False)
class File(Entry):
    read: Callable[[Ctx], bytes]
    write: Callable[[bytes], Event] | None = None
    mode: int | None = None  # default: 0o644 with a parser, else 0o444
    # What stat reports; sysfs reports 4096 for attributes, procfs 0. None: the rendered length at
    # each stat, for a file that grows (an event log), so that `tail` seeks to its real end.
    size: int | None = 4096
    # True where every render is exactly `size` bytes (a binary config space): the kernel may
    # then serve one open's reads from its page cache, refilled at each open.
    exact_size: bool = False

    @property
    def perm(self) -> int:
        if self.mode is not None:
            return self.mode
        return 0o644 if self.write else 0o444


@dataclass(frozen=True, eq=False)
class Dir(Entry):
    children: Callable[[Ctx], Mapping[str, Entry]]
    mode: int = 0o555
    stable: bool = False  # True: the set of children never changes (the kernel may cache it)


@dataclass(frozen=True, eq=False)
class Symlink(Entry):
    target: Callable[[Ctx], str] | str

    def resolve(self, ctx: Ctx) -> str:
        return self.target if isinstance(self.target, str) else self.target(ctx)


@dataclass(frozen=True, eq=False)
class CharDev(Entry):
    major: int
    minor: int
    mode: int = 0o666


@dataclass(frozen=True, eq=False)
class SocketPlaceholder(Entry):
    """A unix socket's name with no listener of its own: the daemon binds a real socket over it
    (mount --bind) once the mount serves, so that the name is that socket in any bind of a
    directory above it, where a symlink to an absolute host path would dangle."""

    mode: int = 0o666


def static_dir(children: Mapping[str, Entry], mode: int = 0o555) -> Dir:
    """A directory whose children never change."""
    frozen = dict(children)
    return Dir(lambda ctx: frozen, mode, stable=True)


def lazy_static_dir(build: Callable[[], Mapping[str, Entry]], mode: int = 0o555) -> Dir:
    """A directory whose children never change, made at its first lookup or listing rather
    than when the tree is built (a mount answers sooner; most of sys/ is never looked at)."""
    made: dict[str, Entry] | None = None

    def children(ctx) -> Mapping[str, Entry]:
        # A plain closure rather than functools.cache, whose wrapper costs ~10 us to make: a
        # 64-GPU tree makes 260 of these at start.
        nonlocal made
        if made is None:
            made = dict(build())
        return made

    return Dir(children, mode, stable=True)


def text(render: Callable[[Ctx], str], **kw) -> File:
    """A file whose content is `render(ctx)` encoded as ASCII."""
    return File(lambda ctx: render(ctx).encode(), **kw)


def const(data: str | bytes, **kw) -> File:
    raw = data.encode() if isinstance(data, str) else data
    return File(lambda ctx: raw, **kw)


def file_type(entry: Entry) -> int:
    if isinstance(entry, Dir):
        return stat.S_IFDIR
    if isinstance(entry, Symlink):
        return stat.S_IFLNK
    if isinstance(entry, CharDev):
        return stat.S_IFCHR
    if isinstance(entry, SocketPlaceholder):
        return stat.S_IFSOCK
    return stat.S_IFREG


ROOT_INO = 1


@dataclass
class _Cached:
    generation: int
    entry: Entry | None
    children: Mapping[str, Entry] | None = None


@dataclass
class Tree:
    """Paths ↔ stable inode numbers, and entry resolution cached per model generation.

    The tree's shape depends only on the model's state (a lost GPU leaves sys/bus/pci), never on
    time, so a resolved entry stays valid until the next event bumps `node.generation`.
    """

    root: Dir
    _ino_of: dict[str, int] = field(default_factory=lambda: {"": ROOT_INO})
    _path_of: dict[int, str] = field(default_factory=lambda: {ROOT_INO: ""})
    _cache: dict[int, _Cached] = field(default_factory=dict)

    def ino(self, path: str) -> int:
        ino = self._ino_of.get(path)
        if ino is None:
            ino = len(self._path_of) + 1
            self._ino_of[path] = ino
            self._path_of[ino] = path
        return ino

    def path(self, ino: int) -> str | None:
        return self._path_of.get(ino)

    def entry(self, ino: int, ctx: Ctx) -> Entry | None:
        cached = self._cache.get(ino)
        if cached is not None and cached.generation == ctx.node.generation:
            return cached.entry
        path = self._path_of.get(ino)
        if path is None:
            return None
        if path == "":
            found: Entry | None = self.root
        else:
            parent, _, name = path.rpartition("/")
            kids = self.children(self.ino(parent), ctx)
            found = None if kids is None else kids.get(name)
        self._cache[ino] = _Cached(ctx.node.generation, found)
        return found

    def children(self, ino: int, ctx: Ctx) -> Mapping[str, Entry] | None:
        entry = self.entry(ino, ctx)
        if not isinstance(entry, Dir):
            return None
        cached = self._cache[ino]
        if cached.children is None:
            cached.children = entry.children(ctx)
        return cached.children

    def in_stable_dir(self, ino: int, ctx: Ctx) -> bool:
        """True if `ino` sits in a directory whose children never change, so the kernel may
        keep its name and attributes cached. The root itself sits in none (the daemon keeps
        its own attributes a second: fuse_ops.ROOT_ATTR_TIMEOUT_S)."""
        path = self._path_of.get(ino)
        if not path:
            return False
        parent = self.entry(self.ino(path.rpartition("/")[0]), ctx)
        return isinstance(parent, Dir) and parent.stable

    def lookup(self, parent_ino: int, name: str, ctx: Ctx) -> tuple[int, Entry] | None:
        kids = self.children(parent_ino, ctx)
        if kids is None or name not in kids:
            return None
        parent = self._path_of[parent_ino]
        ino = self.ino(f"{parent}/{name}" if parent else name)
        return ino, kids[name]

    def resolve(self, path: str, ctx: Ctx) -> Entry | None:
        """The entry at a slash-separated path (no leading slash), following no symlinks."""
        ino = ROOT_INO
        entry: Entry | None = self.root
        for part in filter(None, path.split("/")):
            found = self.lookup(ino, part, ctx)
            if found is None:
                return None
            ino, entry = found
        return entry
