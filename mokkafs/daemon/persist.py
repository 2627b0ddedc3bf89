"""The state directory: what survives a daemon restart, `kill -9` included.

    <state-dir>/node.json     which node this is (profile, GPU count, hostname); checked at start
    <state-dir>/gpuN.json     GPU N's faults, counters and pins; replaced atomically on each change
    <state-dir>/hcas.json     the InfiniBand ports' state and error counters (absent: all fresh)
    <state-dir>/events.log    the node event log, one JSON array per line, append-only
    <state-dir>/scenario.json the running scenario (its file, seed, speed, start, next step);
                              absent when none runs (mokkafs/daemon/scenario_runner.py)
    <state-dir>/previous/     what the directory held before `retire` (another node's files),
                              for reading; nothing restores from it

Each write completes (write to a temporary file, then rename) before the control write that
caused it returns, so a killed daemon loses nothing it acknowledged. Files are not fsynced: a
process crash is covered, a power cut may lose the last changes.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from mokkafs.model import Node, NodeConfig
from mokkafs.model.state import LOG_LIMIT, LogEntry, RestoreError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1

# Caps on what a state file may hold, checked before reading: a node's record is a few KiB;
# the event log is at most 2 * LOG_LIMIT model-written lines (under 1 KiB each).
MAX_RECORD_BYTES = 1 << 20
MAX_LOG_BYTES = 2 * LOG_LIMIT * 1024
MAX_MESSAGE = 300  # a StateError is one line of at most this many characters (plus the path)

# Opened this way, a symlink in place of a state file fails (ELOOP) instead of leading the
# daemon, as root, elsewhere, and a FIFO opens at once instead of blocking the start.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a new file, never through a link
_CREATING = ".creating"  # present while a fresh state directory is being written
PREVIOUS = "previous"  # where `retire` moves another node's files
_RETIRING = ".previous.new"  # `retire` fills it, then renames it to PREVIOUS
_LOCK = "daemon.lock"  # held by the daemon using the directory (mokkafs/daemon/lifetime.py)
_STATE_FILES = re.compile(r"gpu[0-9]+\.json|hcas\.json|events\.log")


def _has_history(record: object) -> bool:
    """Does a saved GPU record show an event that the log would have a line for?"""
    if not isinstance(record, dict):
        return False
    ecc = record.get("ecc")
    return bool(record.get("xid_counts") or record.get("last_xid") is not None or record.get("pins")
                or record.get("lost") or record.get("nvlink_down")
                or (isinstance(ecc, dict) and any(v for v in ecc.values() if not isinstance(v, (dict, list)))))


class StateError(Exception):
    """A state directory that cannot be used; the message says which file and why."""


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _refuse(path: Path, problem: str) -> StateError:
    return StateError(
        f"{path}: {_one_line(problem)}; fix or remove the state directory to start a fresh node"
    )


def check_state_dir(path: Path) -> None:
    """The state directory's rule: its last component is a real directory (not a symlink),
    owned by this user and writable by no one else; whoever could write into it could swap a
    state file under a daemon running as root. Created (0755) if absent."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
    except FileExistsError:
        pass  # a symlink or a file: refused below
    except OSError as e:
        raise StateError(f"{path}: cannot create state directory: {e.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{path}: the state directory is a symbolic link; give its target instead")
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path}: the state directory is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise StateError(f"{path}: the state directory must be owned by uid {os.geteuid()} and writable only by it")


def own_file_problem(st: os.stat_result) -> str | None:
    """Why an open state file may not be used, or None. A hard link (link count above 1) is
    another name of a file elsewhere, which a write would change; one owned by someone else is
    not what the daemon wrote. Symbolic links are refused at open (O_NOFOLLOW)."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links; a state file has one"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not the daemon's {os.geteuid()}"
    return None


def read_regular(path: Path, cap: int) -> bytes:
    """The contents of `path`, a regular file of at most `cap` bytes, or StateError."""
    try:
        fd = os.open(path, _READ)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(path, "is a symbolic link, not a state file") from None
        raise _refuse(path, f"unreadable ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        problem = own_file_problem(st)
        if problem:
            raise _refuse(path, problem)
        if st.st_size > cap:
            raise _refuse(path, f"is {st.st_size} bytes, more than the {cap} a state file may hold")
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > cap:  # grew while read
            raise _refuse(path, f"is more than the {cap} bytes a state file may hold")
        return data
    finally:
        os.close(fd)


def _write_tmp(path: Path | str, data: bytes) -> str:
    """`data` in a new temporary file beside `path`, returned; nothing is left behind when the
    write fails (a full disk keeps no half-written copy taking its last blocks)."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp")
    # A stale tmp (a crash mid-write, or a link someone planted) is removed, never written
    # through: O_EXCL|O_NOFOLLOW creates a new file or fails. Tried first, since there is
    # almost never one: a failed unlink before every save cost each event a syscall and an
    # exception.
    try:
        fd = os.open(tmp, _CREATE, 0o644)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, _CREATE, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(path, e) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return tmp


def _named(path: Path, e: OSError) -> OSError:
    """`e`, its message naming the file it is about (a full disk says which file it refused)."""
    return OSError(e.errno, f"{path}: {e.strerror or e}")


def _write_atomic(path: Path, data: bytes) -> None:
    os.replace(_write_tmp(path, data), path)  # rename replaces a symlink at `path`, never its target


def _log_line(entry: LogEntry) -> bytes:
    return json.dumps([entry.time, entry.gpu, entry.text]).encode() + b"\n"


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number a state file may hold")


def _parse_json(data: bytes):
    return json.loads(data, parse_constant=_no_constants)


def node_record(config: NodeConfig) -> dict:
    """What node.json holds for a node of `config`; a state directory whose node.json says
    otherwise belongs to another node and is refused (StateDir.open)."""
    return {"format": FORMAT_VERSION, "node": config.key}


def saved_record(path: Path) -> object | None:
    """What `<path>/node.json` holds, or None where there is none (a fresh directory);
    StateError if it cannot be read as the daemon wrote it."""
    if not os.path.lexists(path / "node.json"):
        return None
    return StateDir(path)._load_json("node.json")


def retire(path: Path) -> Path:
    """Move everything in state directory `path` (but its lock) into `path/previous`, replacing
    an older one there, so that the next daemon there makes a fresh node: for a node whose
    profile, GPU count or composition changed, whose old faults must not come back. Returns
    where they went. node.json moves last, so a retirement cut short leaves a directory that is
    still refused, and retired again at the next start. RuntimeError while a daemon uses it."""
    check_state_dir(path)
    try:
        fd = os.open(path / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StateError(f"{path / _LOCK}: cannot open ({e.strerror}); a symlink here is refused") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"{path} is in use by a mokka daemon; `mokka umount` it first") from None
        staging, previous = path / _RETIRING, path / PREVIOUS
        if os.path.lexists(staging):
            shutil.rmtree(staging)  # what a retirement cut short had moved: that node's, too
        os.mkdir(staging, 0o755)
        names = sorted(n for n in os.listdir(path) if n not in (PREVIOUS, _RETIRING, _LOCK))
        for name in sorted(names, key=lambda n: n == "node.json"):
            os.rename(path / name, staging / name)
        if os.path.isdir(previous) and not os.path.islink(previous):
            shutil.rmtree(previous)  # one generation is kept
        elif os.path.lexists(previous):
            os.unlink(previous)
        os.rename(staging, previous)
        return previous
    finally:
        os.close(fd)


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._log_lines = 0
        self._names: dict[str, str] = {}  # file name -> its path, as a string

    def _file(self, name: str) -> str:
        """The path of state file `name`, made once (every event writes two or three)."""
        path = self._names.get(name)
        if path is None:
            path = self._names[name] = str(self.path / name)
        return path

    def _load_json(self, name: str) -> object:
        path = self.path / name
        data = read_regular(path, MAX_RECORD_BYTES)
        try:
            return _parse_json(data)
        except (ValueError, RecursionError) as e:
            raise _refuse(path, f"unreadable state ({e})") from None

    def _exists(self, name: str) -> bool:
        return os.path.lexists(self.path / name)

    def open(self, node: Node) -> bool:
        """Create the directory for `node`, or restore `node` from it. True if restored."""
        check_state_dir(self.path)
        meta_path = self.path / "node.json"
        meta = node_record(node.config)
        if not self._exists("node.json"):
            if not self._exists(_CREATING):
                found = sorted(n for n in os.listdir(self.path) if _STATE_FILES.fullmatch(n))
                if found:
                    # A fresh node here would overwrite them; node.json says whose they are.
                    raise _refuse(meta_path, f"missing beside {', '.join(found[:4])}")
            self._create(node, meta)
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / _CREATING)  # a crash after node.json: creation was complete
        saved = self._load_json("node.json")
        if saved != meta:
            raise StateError(
                f"{meta_path}: this state directory holds node {_one_line(str(saved))}, not {meta}; "
                "use another --state-dir or remove this one"
            )
        gpus = [self._load_json(f"gpu{i}.json") for i in range(len(node.gpus))]
        entries = self._load_log(node)
        hcas = self._load_json("hcas.json") if self._exists("hcas.json") else None
        if self._exists("hcas.json") and not isinstance(hcas, list):
            raise _refuse(self.path / "hcas.json", f"not a list of HCA records ({type(hcas).__name__})")
        try:
            node.restore(gpus, entries)
            if hcas is not None:
                node.restore_hcas(hcas)
        except RestoreError as e:
            name = {"gpu": f"gpu{e.index}.json", "hca": "hcas.json", "log": "events.log"}[e.part]
            where = {"gpu": "", "hca": f"HCA {e.index}: ", "log": f"line {e.index}: "}[e.part]
            raise _refuse(self.path / name, f"{where}{e}") from None
        except (ValueError, TypeError) as e:
            raise _refuse(self.path / ("hcas.json" if hcas is not None else "node.json"), str(e)) from None
        if not entries and any(_has_history(g) for g in gpus):
            log.warning("%s: empty, yet the GPU records show past events: the event log was lost",
                        self.path / "events.log")
        return True

    def _create(self, node: Node, meta: dict) -> None:
        """A fresh node's files. `.creating` marks the files as not yet a state directory, so
        a daemon killed before node.json is written leaves something the next start redoes."""
        _write_atomic(self.path / _CREATING, b"")
        for i in range(len(node.gpus)):
            self.save_gpu(node, i)
        self.save_hcas(node)
        _write_atomic(self.path / "events.log", b"")
        _write_atomic(self.path / "node.json", json.dumps(meta).encode())
        os.unlink(self.path / _CREATING)

    def _load_log(self, node: Node) -> list[LogEntry]:
        """The saved log. A last line without its newline is one a crash cut short: skipped with
        a warning, and the file rewritten without it. Any complete line that is not what the
        daemon writes refuses the directory: it was changed by something else."""
        path = self.path / "events.log"
        if not self._exists("events.log"):
            return []
        data = read_regular(path, MAX_LOG_BYTES)
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        entries: list[LogEntry] = []
        first = max(0, len(lines) - LOG_LIMIT)
        for n, line in enumerate(lines[first:], first + 1):
            try:
                t, gpu, text = _parse_json(line)
                if not isinstance(t, (int, float)) or isinstance(t, bool):
                    raise ValueError("time: not a number")
                entry = LogEntry(float(t), gpu, text)
                node.check_log_entry(entry)
            except (ValueError, TypeError, RecursionError) as e:
                raise _refuse(path, f"line {n}: {e}") from None
            entries.append(entry)
        self._log_lines = len(lines)
        if torn:
            log.warning("%s: skipping unreadable event-log line %d, cut short by a crash", path, len(lines) + 1)
            _write_atomic(path, b"".join(map(_log_line, entries)))
            self._log_lines = len(entries)
        return entries

    def save_change(self, node: Node, gpus, hcas: bool, entries: Sequence[LogEntry]) -> None:
        """One applied event's files, all or none: the records of `gpus` (and the HCAs') are
        written aside, the log lines appended, and only then are the records renamed into place.
        On any failure (a full disk) every file is left as it was and OSError is raised, so the
        caller can roll the model back and the next start restores exactly what was there."""
        records = [(self._file(f"gpu{i}.json"), json.dumps(node.gpus[i].to_dict()).encode()) for i in gpus]
        if hcas:
            records.append((self._file("hcas.json"), json.dumps([h.to_dict() for h in node.hcas]).encode()))
        written: list[tuple[str, str]] = []
        try:
            for path, data in records:
                written.append((_write_tmp(path, data), path))
            self._append(entries)
        except BaseException:
            for tmp, _ in written:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        for tmp, path in written:
            os.replace(tmp, path)  # a rename takes no new blocks: it does not fail on a full disk
        self._compact(node)

    def save_gpu(self, node: Node, i: int) -> None:
        _write_atomic(self.path / f"gpu{i}.json", json.dumps(node.gpus[i].to_dict()).encode())

    def save_hcas(self, node: Node) -> None:
        _write_atomic(self.path / "hcas.json", json.dumps([h.to_dict() for h in node.hcas]).encode())

    def save_scenario(self, record: dict | None) -> None:
        """The running scenario's record, or None: none runs (the file is removed)."""
        if record is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / "scenario.json")
            return
        _write_atomic(self.path / "scenario.json", json.dumps(record).encode())

    def load_scenario(self) -> dict | None:
        """The record `save_scenario` left, or None; StateError if it is not a JSON object."""
        if not self._exists("scenario.json"):
            return None
        record = self._load_json("scenario.json")
        if not isinstance(record, dict):
            raise _refuse(self.path / "scenario.json", "not a scenario record")
        return record

    def append_log(self, node: Node, entries: Sequence[LogEntry]) -> None:
        self._append(entries)
        self._compact(node)

    def _append(self, entries: Sequence[LogEntry]) -> None:
        """Append `entries` whole, or leave the log as it was (OSError)."""
        if not entries:
            return
        data = b"".join(map(_log_line, entries))
        # Never through a link; a FIFO or device fails here (ENXIO) or at the check below.
        fd = os.open(
            self._file("events.log"),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o644,
        )
        try:
            st = os.fstat(fd)
            problem = own_file_problem(st)
            if problem:
                raise OSError(errno.EPERM, f"{self.path / 'events.log'} {problem}")
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError as e:
                # Lines cut short by a full disk would read as a crash's torn line at the next
                # start; cut them off (a truncation frees blocks, it needs none).
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, st.st_size)
                raise _named(self.path / "events.log", e) from None
        finally:
            os.close(fd)
        self._log_lines += len(entries)

    def _compact(self, node: Node) -> None:
        """Rewrite the log to the model's last lines once it holds twice as many; a failure
        (a full disk) only leaves it longer, so it is logged, not raised."""
        if self._log_lines > 2 * LOG_LIMIT:
            try:
                _write_atomic(self.path / "events.log", b"".join(map(_log_line, node.log)))
            except OSError as e:
                log.warning("%s: cannot compact the event log: %s", self.path / "events.log", e.strerror or e)
                return
            self._log_lines = len(node.log)
