"""The writer's local spool: append-only JSONL files replayed exactly once when the table returns.

Layout, in ``writer.spool_dir``:

* ``spool-<host>-<pid>-<start>.jsonl`` — one file per writer process, held with an exclusive
  ``flock`` while the process lives. One record per line: ``{"k": "row", "q": query, "r": run,
  "c": candidate}`` (validated table rows) or ``{"k": "pending", ...}`` (a request whose energy was
  not resolved yet: written when the in-memory queue is full).
* ``<spool file>.offset`` — bytes of that file already written to the table, replaced atomically
  (write + rename) after each committed batch. A fully replayed file is truncated (own file) or
  deleted (a file left by a dead process, adopted when its lock is free).
* ``rejected.jsonl`` — lines that cannot be parsed (a torn write after a crash) or rows the table
  rejects; kept for inspection, never silently lost.

Exactly once: a record is replayed from its committed offset; the table's upsert on (query_id,
candidate, source) makes a batch repeated after a crash between commit and offset update harmless
(the row count stays exact).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator


@dataclass
class Chunk:
    """Records read from one spool file: the byte offset to commit once they are in the table."""

    path: Path
    records: list[dict[str, Any]]
    end_offset: int


class Spool:
    """Append-only spool directory (thread-safe)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"spool-{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}.jsonl"
        self.own = self.dir / name
        self._lock = threading.RLock()
        self._fh: IO[str] | None = None
        self._adopted: dict[Path, IO[str]] = {}
        self.rejected_path = self.dir / "rejected.jsonl"
        self.appended = 0
        self.rejected = 0

    # -- writing ----------------------------------------------------------------------------------
    def _open_own(self) -> IO[str]:
        if self._fh is None:
            fh = open(self.own, "a+", encoding="utf-8")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fh = fh
        return self._fh

    def append(self, records: list[dict[str, Any]], *, sync: bool = True) -> None:
        """Append records (one JSON line each) to this process's file; ``sync`` fsyncs."""
        if not records:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        with self._lock:
            fh = self._open_own()
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
            self.appended += len(records)

    def reject(self, lines: list[str], reason: str) -> None:
        with self._lock, open(self.rejected_path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps({"reason": reason, "line": line}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            self.rejected += len(lines)

    # -- replay -----------------------------------------------------------------------------------
    @staticmethod
    def _offset_path(p: Path) -> Path:
        return p.with_name(p.name + ".offset")

    def _offset(self, p: Path) -> int:
        try:
            return int(self._offset_path(p).read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _adopt_orphans(self) -> None:
        for p in sorted(self.dir.glob("spool-*.jsonl")):
            if p == self.own or p in self._adopted:
                continue
            try:
                fh = open(p, "r+", encoding="utf-8")
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()  # its writer is alive
                continue
            self._adopted[p] = fh

    def _files(self) -> list[Path]:
        return [*sorted(self._adopted), self.own]

    def _sizes(self) -> Iterator[tuple[Path, int, int]]:
        """(file, size in bytes, committed offset in bytes) of every spool file that exists, adopted
        ones first (call with the lock held)."""
        self._adopt_orphans()
        for p in self._files():
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                continue
            yield p, size, self._offset(p)

    def backlog_records(self) -> int:
        """Approximate records not yet replayed (counts lines; for metrics)."""
        n = 0
        with self._lock:
            for p, size, off in self._sizes():
                if size > off:
                    with open(p, "rb") as f:
                        f.seek(off)
                        n += f.read().count(b"\n")
        return n

    def has_backlog(self) -> bool:
        with self._lock:
            return any(size > off for _, size, off in self._sizes())

    def read_chunk(self, max_records: int) -> Chunk | None:
        """Up to ``max_records`` complete records after the committed offset of the oldest file with
        a backlog; unparsable lines go to ``rejected.jsonl``."""
        with self._lock:
            for p, size, off in self._sizes():
                if size <= off:
                    self._finish(p, size)
                    continue
                records: list[dict[str, Any]] = []
                bad: list[str] = []
                pos = off
                with open(p, "rb") as f:
                    f.seek(off)
                    while len(records) < max_records:
                        line = f.readline()
                        if not line:
                            break
                        if not line.endswith(b"\n"):
                            if p == self.own:
                                break  # being written: wait for the newline
                            pos += len(line)  # torn write of a dead process
                            bad.append(line.decode("utf-8", "replace"))
                            break
                        pos += len(line)
                        try:
                            rec = json.loads(line)
                            if not isinstance(rec, dict) or rec.get("k") not in ("row", "pending"):
                                raise ValueError("not a spool record")
                            records.append(rec)
                        except ValueError:
                            bad.append(line.decode("utf-8", "replace").rstrip("\n"))
                if bad:
                    self.reject(bad, f"unparsable line in {p.name}")
                if not records:
                    self.commit(Chunk(p, [], pos))
                    continue
                return Chunk(p, records, pos)
        return None

    def commit(self, chunk: Chunk) -> None:
        """Mark a chunk as written to the table (atomic offset update)."""
        with self._lock:
            op = self._offset_path(chunk.path)
            tmp = op.with_name(op.name + ".tmp")
            tmp.write_text(str(chunk.end_offset))
            os.replace(tmp, op)
            try:
                size = chunk.path.stat().st_size
            except FileNotFoundError:
                return
            if chunk.end_offset >= size:
                self._finish(chunk.path, size)

    def _finish(self, p: Path, size: int) -> None:
        """A fully replayed file: truncate ours, delete an adopted one."""
        op = self._offset_path(p)
        if p == self.own:
            if self._fh is not None and size > 0:
                self._fh.truncate(0)
                self._fh.seek(0)
                op.unlink(missing_ok=True)
            return
        fh = self._adopted.pop(p, None)
        p.unlink(missing_ok=True)
        op.unlink(missing_ok=True)
        if fh is not None:
            fh.close()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                size = self.own.stat().st_size if self.own.exists() else 0
                if size == 0 or self._offset(self.own) >= size:
                    self.own.unlink(missing_ok=True)
                    self._offset_path(self.own).unlink(missing_ok=True)
                self._fh.close()
                self._fh = None
            for fh in self._adopted.values():
                fh.close()
            self._adopted.clear()
