"""What the kernel says of a calling process beyond its uid and gid: its supplementary groups and
its capabilities, read from `/proc/<pid>/status`. A caller the daemon cannot see (pid 0: another
pid namespace; gone already; an unreadable status) has none: every check fails closed."""
from __future__ import annotations

CAP_SYS_ADMIN = 21


def _status_field(pid: int, key: bytes) -> list[bytes] | None:
    """The words after `key:` in process `pid`'s status, or None."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key + b":"):
                    return line.split()[1:]
    except OSError:
        pass
    return None


def supplementary_groups(pid: int) -> frozenset[int]:
    try:
        return frozenset(int(g) for g in _status_field(pid, b"Groups") or ())
    except ValueError:
        return frozenset()


def administrator(pid: int) -> bool:
    """Whether `pid` holds CAP_SYS_ADMIN in its effective set: the real driver's check for a
    privileged call."""
    words = _status_field(pid, b"CapEff")
    try:
        return bool(words) and bool(int(words[0], 16) >> CAP_SYS_ADMIN & 1)
    except ValueError:
        return False
