"""The thin FUSE edge: pyfuse3 Operations over a `Tree`. Raises only `FUSEError`.

Files are rendered once at open() and served as slices of that snapshot with direct_io, so a
reader that reads in chunks never sees a torn value. A write to a control file is one command:
parsed by the entry's parser, applied by the controller, or refused with EINVAL.
"""
from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import pyfuse3

from mokkafs.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.vfs import CharDev, Ctx, Dir, Entry, File, Symlink, Tree, file_type

log = logging.getLogger(__name__)

CACHE_TIMEOUT_S = 300


@dataclass
class _Handle:
    path: str
    entry: File
    data: bytes


def _fuse_errors(handler):
    """The one place errors become FUSEError: a domain error carries its errno (InvalidCommand:
    EINVAL) and is logged in one line; anything else is a bug, logged with its traceback and
    answered with EIO, because an exception escaping a handler would stop pyfuse3's main loop."""

    @functools.wraps(handler)
    async def wrapper(self, *args):
        self.operations += 1
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except InvalidCommand as e:
            self.errors += 1
            log.warning("EINVAL %s: %s", handler.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except Exception:
            self.errors += 1
            log.exception("internal error in %s", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class MokkaOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, tree: Tree, controller: Controller, clock: Callable[[], float]) -> None:
        super().__init__()
        self.tree = tree
        self.controller = controller
        self.clock = clock
        self.mount_time_ns = int(clock() * 1e9)
        self._handles: dict[int, _Handle] = {}
        self._dirs: dict[int, list[tuple[str, int, Entry]]] = {}
        self._next_fh = itertools.count(1)
        self.errors = 0  # requests answered EINVAL/EIO by _fuse_errors (metrics count them)
        self.operations = 0  # requests handled, whatever the answer

    def _ctx(self) -> Ctx:
        return Ctx(self.controller.node, self.clock())

    def _entry(self, inode: int, ctx: Ctx) -> Entry:
        entry = self.tree.entry(inode, ctx)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entry

    def _attrs(self, inode: int, entry: Entry, ctx: Ctx) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        # Contents are rendered at open and never cached (direct_io). Names and attributes may
        # be cached only in directories whose children never change (gpuN/, node/, bridges):
        # the kernel's invalidation notices are asynchronous, so a name that can vanish or
        # appear with an event (a lost GPU's sysfs entry) is never cached, or a reader right
        # after the write could still see it. The root stays uncached so that probing it tells a
        # live mount from a dead one. (`mokka run` reads sysfs from the mirror, not from here.)
        timeout = CACHE_TIMEOUT_S if self.tree.in_stable_dir(inode, ctx) else 0
        attr.entry_timeout = timeout
        attr.attr_timeout = timeout
        kind = file_type(entry)
        if isinstance(entry, File):
            attr.st_mode = kind | entry.perm
            attr.st_size = entry.size
        elif isinstance(entry, Dir):
            attr.st_mode = kind | entry.mode
            attr.st_nlink = 2
        elif isinstance(entry, Symlink):
            attr.st_mode = kind | 0o777
            attr.st_size = len(entry.resolve(ctx))
        elif isinstance(entry, CharDev):
            attr.st_mode = kind | entry.mode
            attr.st_rdev = os.makedev(entry.major, entry.minor)
        attr.st_nlink = attr.st_nlink or 1
        attr.st_uid = 0
        attr.st_gid = 0
        attr.st_blksize = 4096
        attr.st_blocks = 0
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = self.mount_time_ns
        return attr

    @_fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        c = self._ctx()
        found = self.tree.lookup(parent_inode, os.fsdecode(name), c)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)  # not cached: an event may add the name
        inode, entry = found
        return self._attrs(inode, entry, c)

    @_fuse_errors
    async def getattr(self, inode, ctx=None):
        c = self._ctx()
        return self._attrs(inode, self._entry(inode, c), c)

    @_fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        c = self._ctx()
        entry = self._entry(inode, c)
        # `echo 79 > file` opens with O_TRUNC, which arrives here as a size change: a control
        # file has nothing to truncate, so accept it; anything else is not ours to change.
        if fields.update_size and not (isinstance(entry, File) and entry.write):
            raise pyfuse3.FUSEError(errno.EACCES)
        if fields.update_mode or fields.update_uid or fields.update_gid:
            raise pyfuse3.FUSEError(errno.EPERM)
        return self._attrs(inode, entry, c)

    @_fuse_errors
    async def readlink(self, inode, ctx):
        c = self._ctx()
        entry = self._entry(inode, c)
        if not isinstance(entry, Symlink):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(entry.resolve(c))

    @_fuse_errors
    async def opendir(self, inode, ctx):
        c = self._ctx()
        kids = self.tree.children(inode, c)
        if kids is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR if self.tree.entry(inode, c) else errno.ENOENT)
        parent = self.tree.path(inode)
        listing = [
            (name, self.tree.ino(f"{parent}/{name}" if parent else name), entry) for name, entry in kids.items()
        ]
        fh = next(self._next_fh)
        self._dirs[fh] = listing
        return fh

    @_fuse_errors
    async def readdir(self, fh, start_id, token):
        listing = self._dirs.get(fh)
        if listing is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        c = self._ctx()
        # Offsets are positions in the snapshot taken at opendir, so they stay stable.
        for offset, (name, inode, entry) in enumerate(listing[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(inode, entry, c), offset):
                return

    @_fuse_errors
    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    @_fuse_errors
    async def open(self, inode, flags, ctx):
        c = self._ctx()
        entry = self._entry(inode, c)
        if isinstance(entry, Dir):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if not isinstance(entry, File):
            # Device nodes are opened by the kernel's device driver, never by us; a simulated
            # /dev/nvidia0 has no driver behind it.
            raise pyfuse3.FUSEError(errno.ENXIO)
        accmode = flags & os.O_ACCMODE
        if accmode != os.O_RDONLY and entry.write is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        data = entry.read(c) if accmode != os.O_WRONLY else b""
        fh = next(self._next_fh)
        self._handles[fh] = _Handle(self.tree.path(inode), entry, data)
        # direct_io: reads come to us and return the snapshot as it is, whatever st_size says.
        # A file whose every render is exactly st_size bytes may use the page cache instead
        # (keep_cache=False still drops it at every open).
        return pyfuse3.FileInfo(fh=fh, direct_io=not entry.exact_size, keep_cache=False, nonseekable=False)

    @_fuse_errors
    async def read(self, fh, off, size):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return handle.data[off : off + size]

    @_fuse_errors
    async def write(self, fh, off, buf):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if handle.entry.write is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        try:
            self.controller.apply(handle.entry.write(bytes(buf)))
        except InvalidCommand as e:
            raise InvalidCommand(f"{handle.path}: {bytes(buf[:64])!r}: {e}") from None
        return len(buf)

    @_fuse_errors
    async def release(self, fh):
        self._handles.pop(fh, None)

    # No flush(): pyfuse3's default answers ENOSYS, after which the kernel stops sending FLUSH
    # on every close(), one round trip less per read of a control file.

    @_fuse_errors
    async def statfs(self, ctx):
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = 4096
        st.f_namemax = 255
        return st

    @_fuse_errors
    async def access(self, inode, mode, ctx):
        entry = self._entry(inode, self._ctx())
        if mode & os.W_OK and not (isinstance(entry, File) and entry.write):
            raise pyfuse3.FUSEError(errno.EACCES)
        # pyfuse3 answers EACCES when this returns a false value: chdir() into the mount (and
        # `cd` in ibstatus) goes through here.
        return True


