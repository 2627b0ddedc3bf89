"""A unix socket address for a path of any length: sun_path holds 108 bytes, and a node mounted
under a long directory has its sockets past that. Such a path is reached through a descriptor of
its directory, /proc/self/fd/N/<name>, which the kernel resolves like any other path."""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

SUN_PATH_MAX = 107  # sockaddr_un.sun_path's 108 bytes, less the terminating NUL


@contextlib.contextmanager
def unix_address(path: str | os.PathLike) -> Iterator[str]:
    """An address for bind or connect that names unix socket `path`: the path itself when it
    fits, else /proc/self/fd/N/<name> through its directory, held open for the `with`. Raises
    ENAMETOOLONG when not even that fits (a file name of more than about 90 bytes)."""
    full = os.fspath(path)
    if len(os.fsencode(full)) <= SUN_PATH_MAX:
        yield full
        return
    directory, name = os.path.split(full)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > SUN_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, "AF_UNIX path too long", full)
        yield short
    finally:
        os.close(fd)


__all__ = ["unix_address", "SUN_PATH_MAX"]
