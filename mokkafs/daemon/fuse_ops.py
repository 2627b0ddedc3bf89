"""The thin FUSE edge: pyfuse3 Operations over a `Tree`. Raises only `FUSEError`.

Files are rendered once at open() and served as slices of that snapshot with direct_io, so a
reader that reads in chunks never sees a torn value; a file that grows (an event log) read past
the snapshot's end gives what was appended since. A write to a control file is one command:
parsed by the entry's parser, applied by the controller, or refused with EINVAL. Only root (and
the control group) may open one for writing; the kernel checks the modes too (docs/security.md).
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
import trio

from mokkafs.daemon.caller import supplementary_groups
from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.daemon.ratelimit import RateLimiter, RefusalLog, Summary
from mokkafs.render.vfs import CharDev, Ctx, Dir, Entry, File, SocketPlaceholder, Symlink, Tree, file_type

log = logging.getLogger(__name__)

CACHE_TIMEOUT_S = 300
# The mount root's own attributes (a directory whose mode and owner never change): with
# default_permissions the kernel needs them on every path walk from the mount point, one GETATTR
# round trip per open when they are not kept. Kept for a second, a dead daemon's mount still
# says ENOTCONN to everything but a stat of the root itself, and to that too a second later;
# stale-mount detection asks statfs, which the kernel never caches.
ROOT_ATTR_TIMEOUT_S = 1.0
# A refusal's log line quotes at most this much of its reason: the reason may echo the input.
MAX_REASON = 300


@dataclass
class _Handle:
    path: str
    entry: File
    data: bytes
    writable: bool = False


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
            self._refuse(e.errno, handler.__name__, None, str(e))
        except Exception:
            self.errors += 1
            # A bug, but one a caller may be able to repeat: its traceback is rate-limited too.
            if self._limit(("EIO", handler.__name__, None)):
                log.exception("internal error in %s", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class MokkaOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(
        self,
        tree: Tree,
        controller: Controller,
        clock: Callable[[], float],
        control_gid: int | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__()
        self.tree = tree
        self.controller = controller
        self.clock = clock
        self.control_gid = control_gid  # besides root, who may write control files (--control-group)
        self.refusals = RefusalLog(clock, _log_summary, limiter)
        self.limiter = self.refusals.limiter
        self.refused = trio.Event()  # set at each refusal; whoever waits on it replaces it
        self.mount_time_ns = int(clock() * 1e9)
        self._handles: dict[int, _Handle] = {}
        self._dirs: dict[int, list[tuple[str, int, Entry]]] = {}
        self._next_fh = itertools.count(1)
        self.errors = 0  # requests answered EINVAL/EIO by _fuse_errors (metrics count them)
        self.operations = 0  # requests handled, whatever the answer

    def _ctx(self) -> Ctx:
        return Ctx(self.controller.node, self.clock())

    # --- refusals: one log line per file and cause, then a count (mokkafs.daemon.ratelimit) ---------

    def _limit(self, key) -> bool:
        """True if a refusal of kind `key` should log its line now; logs the summaries due."""
        first = self.refusals.first(key)
        self.refused.set()
        return first

    def flush_refusals(self, everything: bool = False) -> None:
        """Log the summaries of windows that ended (the daemon calls this every second while
        any is open, and with `everything` at unmount so that no count is lost)."""
        self.refusals.flush(everything)

    def _refuse(self, err: int, where: str, path: str | None, reason: str):
        self.errors += 1
        cause = errno.errorcode.get(err, str(err))
        if self._limit((cause, where, path)):
            if len(reason) > MAX_REASON:
                reason = reason[:MAX_REASON] + "..."
            log.warning("%s %s%s: %s", cause, where, f" {path}" if path else "", reason)
        raise pyfuse3.FUSEError(err) from None

    # --- who may write ---------------------------------------------------------------------

    def may_write(self, ctx) -> bool:
        """Root, or a member of the control group, by the kernel's word on the caller: its
        fsuid and fsgid, and its supplementary groups (read only when they decide it). Without
        a request context (a call from inside the daemon's process) nobody is assumed."""
        if ctx is None:
            return False
        if ctx.uid == 0:
            return True
        if self.control_gid is None:
            return False
        return ctx.gid == self.control_gid or self.control_gid in supplementary_groups(ctx.pid)

    def _check_write(self, inode: int, entry: Entry, ctx, where: str) -> None:
        path = self.tree.path(inode)
        if not (isinstance(entry, File) and entry.write):
            self._refuse(errno.EACCES, where, path, "not writable")
        if not self.may_write(ctx):
            who = "no caller" if ctx is None else f"uid {ctx.uid} gid {ctx.gid} pid {ctx.pid}"
            rule = "root only" if self.control_gid is None else f"root and group {self.control_gid} only"
            self._refuse(errno.EACCES, where, path, f"{who} may not write ({rule})")

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
        # after the write could still see it; the root's own attributes are kept a second
        # (ROOT_ATTR_TIMEOUT_S). (`mokka run` reads sysfs from the mirror, not from here.)
        # A file that grows (an event log: `size` None) keeps its name but not its attributes: a
        # kept st_size would be the length at the last look, and `tail -f` (which reads only
        # when stat says the file grew) would wait out CACHE_TIMEOUT_S for the next line.
        timeout = CACHE_TIMEOUT_S if self.tree.in_stable_dir(inode, ctx) else 0
        attr.entry_timeout = timeout
        if inode == pyfuse3.ROOT_INODE:
            attr.attr_timeout = ROOT_ATTR_TIMEOUT_S
        else:
            attr.attr_timeout = 0 if isinstance(entry, File) and entry.size is None else timeout
        kind = file_type(entry)
        attr.st_gid = 0
        if isinstance(entry, File):
            mode = entry.perm
            if entry.write is not None and self.control_gid is not None:
                # The group may write what root may write, and the kernel sees it so.
                mode |= (mode & 0o200) >> 3
                attr.st_gid = self.control_gid
            attr.st_mode = kind | mode
            attr.st_size = entry.size if entry.size is not None else len(entry.read(ctx))
        elif isinstance(entry, Dir):
            attr.st_mode = kind | entry.mode
            attr.st_nlink = 2
        elif isinstance(entry, Symlink):
            attr.st_mode = kind | 0o777
            attr.st_size = len(entry.resolve(ctx))
        elif isinstance(entry, CharDev):
            attr.st_mode = kind | entry.mode
            attr.st_rdev = os.makedev(entry.major, entry.minor)
        elif isinstance(entry, SocketPlaceholder):
            attr.st_mode = kind | entry.mode
        attr.st_nlink = attr.st_nlink or 1
        attr.st_uid = 0
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
        if fields.update_mode or fields.update_uid or fields.update_gid:
            raise pyfuse3.FUSEError(errno.EPERM)
        if fields.update_size:
            self._check_write(inode, entry, ctx, "truncate")
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
        writable = accmode != os.O_RDONLY
        if writable:
            # The kernel checked the modes already (default_permissions); this holds where it
            # did not, or where a mount was made without it.
            self._check_write(inode, entry, ctx, "open")
        data = entry.read(c) if accmode != os.O_WRONLY else b""
        fh = next(self._next_fh)
        self._handles[fh] = _Handle(self.tree.path(inode), entry, data, writable)
        # direct_io: reads come to us and return the snapshot as it is, whatever st_size says.
        # A file whose every render is exactly st_size bytes may use the page cache instead
        # (keep_cache=False still drops it at every open).
        return pyfuse3.FileInfo(fh=fh, direct_io=not entry.exact_size, keep_cache=False, nonseekable=False)

    @_fuse_errors
    async def read(self, fh, off, size):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if off + size > len(handle.data) and handle.entry.size is None and not handle.writable:
            # A file that grows (an event log), read at its end: what was appended since the
            # open follows, as in a log file (`tail -f` keeps its descriptor and reads on from
            # where it was). Only growth: a log that has dropped its oldest lines since is not
            # the snapshot with more at its end, and the snapshot stays whole.
            now = handle.entry.read(self._ctx())
            if len(now) > len(handle.data) and now.startswith(handle.data):
                handle.data = now
        return handle.data[off : off + size]

    @_fuse_errors
    async def write(self, fh, off, buf):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if handle.entry.write is None or not handle.writable:
            raise pyfuse3.FUSEError(errno.EBADF)  # only a handle open() let write may write
        try:
            self.controller.apply(handle.entry.write(bytes(buf)))
        except InvalidCommand as e:
            self._refuse(e.errno, "write", handle.path, f"{bytes(buf[:64])!r}: {e}")
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
        if mode & os.W_OK:
            self._check_write(inode, entry, ctx, "access")
        # pyfuse3 answers EACCES when this returns a false value: chdir() into the mount (and
        # `cd` in ibstatus) goes through here.
        return True


def _log_summary(summary: Summary) -> None:
    cause, where, path = summary.key
    log.warning("%s %s%s: %s", cause, where, f" {path}" if path else "", summary.line())
