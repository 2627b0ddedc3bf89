"""The state directory: what survives a daemon restart, `kill -9` included.

    <state-dir>/node.json     which node this is (profile, GPU count, hostname); checked at start
    <state-dir>/gpuN.json     GPU N's faults, counters and pins; replaced atomically on each change
    <state-dir>/hcas.json     the InfiniBand ports' state and error counters (absent: all fresh)
    <state-dir>/events.log    the node event log, one JSON array per line, append-only

Each write completes (write to a temporary file, then rename) before the control write that
caused it returns, so a killed daemon loses nothing it acknowledged. Files are not fsynced: a
process crash is covered, a power cut may lose the last changes.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from mokkafs.model.node import LOG_LIMIT, LogEntry, Node

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class StateError(Exception):
    """A state directory that cannot be used; the message says which file and why."""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _log_line(entry: LogEntry) -> bytes:
    return json.dumps([entry.time, entry.gpu, entry.text]).encode() + b"\n"


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._log_lines = 0

    def _load_json(self, name: str) -> object:
        path = self.path / name
        try:
            return json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            raise StateError(
                f"{path}: unreadable state ({e}); fix or remove the state directory to start a fresh node"
            ) from None

    def open(self, node: Node) -> bool:
        """Create the directory for `node`, or restore `node` from it. True if restored."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(f"{self.path}: cannot create state directory: {e.strerror}") from None
        meta_path = self.path / "node.json"
        meta = {"format": FORMAT_VERSION, "node": node.config.key}
        if not meta_path.exists():
            for i in range(len(node.gpus)):
                self.save_gpu(node, i)
            self.save_hcas(node)
            _write_atomic(meta_path, json.dumps(meta).encode())
            (self.path / "events.log").write_bytes(b"")
            return False
        saved = self._load_json("node.json")
        if saved != meta:
            raise StateError(
                f"{meta_path}: this state directory holds node {saved}, not {meta}; "
                "use another --state-dir or remove this one"
            )
        gpus = [self._load_json(f"gpu{i}.json") for i in range(len(node.gpus))]
        entries = self._load_log()
        hcas = self._load_json("hcas.json") if (self.path / "hcas.json").exists() else None
        try:
            node.restore(gpus, entries)
        except ValueError as e:
            raise StateError(f"{self.path}: saved GPU state is invalid: {e}") from None
        if hcas is not None:
            try:
                node.restore_hcas(hcas)
            except (ValueError, TypeError) as e:
                raise StateError(f"{self.path / 'hcas.json'}: saved HCA state is invalid: {e}") from None
        return True

    def _load_log(self) -> list[LogEntry]:
        path = self.path / "events.log"
        entries: list[LogEntry] = []
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return entries
        except OSError as e:
            raise StateError(f"{path}: unreadable event log: {e.strerror}") from None
        for n, line in enumerate(lines[-LOG_LIMIT:], 1):
            try:
                t, gpu, text = json.loads(line)
                entries.append(LogEntry(float(t), None if gpu is None else int(gpu), str(text)))
            except (ValueError, TypeError):
                # A line cut short by a crash mid-append: the log is history, the rest stands.
                log.warning("%s: skipping unreadable event-log line %d", path, n)
        self._log_lines = len(lines)
        return entries

    def save_gpu(self, node: Node, i: int) -> None:
        _write_atomic(self.path / f"gpu{i}.json", json.dumps(node.gpus[i].to_dict()).encode())

    def save_hcas(self, node: Node) -> None:
        _write_atomic(self.path / "hcas.json", json.dumps([h.to_dict() for h in node.hcas]).encode())

    def append_log(self, node: Node, entries: list[LogEntry]) -> None:
        if not entries:
            return
        data = b"".join(map(_log_line, entries))
        with open(self.path / "events.log", "ab") as f:
            f.write(data)
        self._log_lines += len(entries)
        if self._log_lines > 2 * LOG_LIMIT:
            _write_atomic(self.path / "events.log", b"".join(map(_log_line, node.log)))
            self._log_lines = len(node.log)
