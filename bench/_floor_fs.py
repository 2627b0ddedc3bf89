"""The floor under any pyfuse3 file system: one file, answered with no work at all. Benches
read it the way they read mokkafs, so a ratio to it shows what mokkafs adds to FUSE itself."""
from __future__ import annotations

import errno
import os
import stat
import sys

import pyfuse3
import trio

DATA = b"29\n"
FILE_INO = 2


class FloorOps(pyfuse3.Operations):
    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.st_mode = (stat.S_IFDIR | 0o555) if inode == pyfuse3.ROOT_INODE else (stat.S_IFREG | 0o444)
        a.st_size = 4096
        a.entry_timeout = a.attr_timeout = 300
        return a

    async def getattr(self, inode, ctx=None):
        return self._attr(inode)

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode != pyfuse3.ROOT_INODE or name != b"temperature":
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(FILE_INO)

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode, direct_io=True)

    async def read(self, fh, off, size):
        return DATA[off : off + size]

    async def release(self, fh):
        pass


def main() -> None:
    pyfuse3.init(FloorOps(), sys.argv[1], set(pyfuse3.default_options))
    os.write(int(sys.argv[2]), b"ready\n")
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


if __name__ == "__main__":
    main()
