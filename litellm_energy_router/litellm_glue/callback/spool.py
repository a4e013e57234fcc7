"""The writer's local spool: append-only JSONL segments, replayed once, oldest first, when the table
returns (a chunk of records, a segment's bookkeeping and the parse of a line: :mod:`.spool_segment`).

Layout, in ``writer.spool_dir`` (0700; every file 0600, see :mod:`.private_files`):

* ``spool-<host>-<pid>-<start ms>-<seq>.jsonl`` — segments of one writer process, each held with an
  exclusive ``flock`` while that process lives; a new segment starts when the current one reaches
  1/8 of the cap (64 KiB..64 MiB). One record per line: ``{"k": "row", "q": query, "r": run, "c":
  candidate}`` (validated table rows) or ``{"k": "pending", <PendingRow fields>, "h": text hash}`` (a
  request spilled from a full queue before its energy was known; its ``text`` is null unless
  ``privacy.store_text``). A segment left by a dead process (its lock free) is adopted and replayed.
* ``<segment>.offset`` — bytes of that segment already in the table, replaced atomically (temporary
  file fsynced, renamed, directory fsynced) after each committed chunk. A fully replayed segment is
  deleted.
* ``rejected.jsonl`` — rows the table rejects and unparsable lines (a torn write after a crash; kept
  verbatim only with ``privacy.store_text``, else their length and salted hash).

Replay streams each segment once: a held descriptor read in 1 MiB blocks from the committed offset,
never from the start again; the backlog is counted in memory (a segment adopted from a dead process is
counted once, when adopted). ``writer.spool_max_mb`` caps the files: whole segments are dropped,
oldest first, and their rows counted (``energy_router_spool_dropped_rows_total``). A failed append is
cut back (the file truncated to its length before) and raised, so the caller keeps its records; it is
counted (``energy_router_spool_write_errors_total``) and logged, and appends fail fast for a backoff.

Exactly once: a record is replayed from its committed offset; the writer's inserts leave an existing
row untouched, so a chunk replayed again after a crash between the table's commit and the offset
update changes nothing (feedback included).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from litellm_energy_router.litellm_glue.callback.private_files import (
    append_durably,
    fsync_dir,
    open_private,
    private_dir,
    write_all,
    write_atomic,
)
from litellm_energy_router.litellm_glue.callback.spool_segment import Chunk, Segment, parse_record
from litellm_energy_router.metrics import (
    SPOOL_DROPPED_ROWS,
    SPOOL_WRITE_ERRORS,
    RateLimitedWarning,
)
from litellm_energy_router.table import text_hash

log = logging.getLogger("litellm_energy_router.litellm_glue.callback")

BLOCK = 1 << 20
MIN_SEGMENT, MAX_SEGMENT = 64 << 10, 64 << 20


class SpoolWriteError(OSError):
    """The spool cannot be written now (a recent write failed; retried after a backoff)."""


class Spool:
    """Append-only spool directory (thread-safe).

    Args:
        directory: the spool directory (created 0700).
        max_bytes: cap on the segments' total size.
        keep_text: keep unparsable lines verbatim in ``rejected.jsonl`` (``privacy.store_text``).
        salt: salt of the hash that replaces such a line otherwise.
        retry_max_s: longest backoff after a failed append, seconds.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 1 << 30,
        keep_text: bool = False,
        salt: str = "",
        retry_max_s: float = 5.0,
    ) -> None:
        self.dir = private_dir(directory)
        self.max_bytes = int(max_bytes)
        self.segment_bytes = min(max(self.max_bytes // 8, MIN_SEGMENT), MAX_SEGMENT)
        self.keep_text, self.salt, self.retry_max_s = keep_text, salt, retry_max_s
        self._prefix = f"spool-{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}"
        self._seq = 0
        self._lock = threading.RLock()
        self._segs: dict[Path, Segment] = {}
        self._active: Segment | None = None
        self._out: Chunk | None = None  # returned by read_chunk, not committed yet
        self.retry_at, self._retry_delay = 0.0, 0.1
        self._warn, self._error = RateLimitedWarning(log, 30.0), RateLimitedWarning(log, 30.0, logging.ERROR)
        self.rejected_path = self.dir / "rejected.jsonl"
        self.appended = self.rejected = self.dropped = self.write_errors = self.bytes_read = 0
        self.scan()

    # -- writing ----------------------------------------------------------------------------------
    def append(self, records: list[dict[str, Any]], *, sync: bool = True) -> None:
        """Append records (one JSON line each); ``sync`` fsyncs. Raises ``OSError`` (nothing written)
        when the disk refuses, and :class:`SpoolWriteError` during the backoff after such a failure."""
        if not records:
            return
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with self._lock:
            if time.monotonic() < self.retry_at:
                raise SpoolWriteError(f"spool {self.dir} not writable (retrying)")
            seg = None
            try:
                self._make_room(len(data))
                seg = self._writable(len(data))
                write_all(seg.fd, data)
                if sync:
                    os.fsync(seg.fd)
            except OSError as e:
                if seg is not None:
                    self._cut_back(seg)
                self._write_failed(e, f"{len(records)} rows kept in memory")
                raise
            self._retry_delay = 0.1
            seg.size += len(data)
            seg.records += len(records)
            self.appended += len(records)

    def _writable(self, n: int) -> Segment:
        seg = self._active
        if seg is not None and seg.size > 0 and seg.size + n > self.segment_bytes:
            self._active = None  # sealed: replayed, then deleted
        if self._active is None:
            self._seq += 1
            path = self.dir / f"{self._prefix}-{self._seq:06d}.jsonl"
            fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._active = self._segs[path] = Segment(path, fd, own=True)
            fsync_dir(self.dir)
        return self._active

    def _cut_back(self, seg: Segment) -> None:
        """Drop the part of a failed append that reached the file: no torn line before the next record."""
        try:
            os.ftruncate(seg.fd, seg.size)
        except OSError as e:
            log.error("energy-router: spool %s: cannot cut back a failed write (%s)", seg.path.name, e)

    def _write_failed(self, err: OSError, what: str) -> None:
        SPOOL_WRITE_ERRORS.inc()
        self.write_errors += 1
        self.retry_at = time.monotonic() + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, self.retry_max_s)
        self._error(
            "spool-write",
            "energy-router: spool %s not writable: %s (%s; %d failed writes so far)",
            self.dir,
            err,
            what,
            self.write_errors,
        )

    def _make_room(self, n: int) -> None:
        """Drop whole segments, oldest first, until ``n`` more bytes fit under the cap."""
        total = sum(s.size for s in self._segs.values())
        while total + n > self.max_bytes:
            victims = [s for s in self._ordered() if s.size > 0]
            if not victims:
                return
            v = victims[0]
            total -= v.size
            lost = v.records
            self._forget(v)
            if lost:
                self.dropped += lost
                SPOOL_DROPPED_ROWS.inc(lost)
                self._warn(
                    "spool-cap",
                    "energy-router: spool %s over writer.spool_max_mb (%.0f MiB): dropped %d oldest rows (%d so far)",
                    self.dir,
                    self.max_bytes / 2**20,
                    lost,
                    self.dropped,
                )

    def reject(self, entries: list[Any], reason: str, *, key: str = "row") -> None:
        """Keep entries (rows as dicts, or lines) in ``rejected.jsonl`` with the reason."""
        data = "".join(json.dumps({"reason": reason, key: e}, default=str) + "\n" for e in entries)
        with self._lock:
            try:
                append_durably(self.rejected_path, data.encode())
            except OSError as e:
                self._write_failed(e, f"{len(entries)} rejected entries not kept")
                return
            self.rejected += len(entries)

    def _reject_lines(self, lines: list[bytes], name: str) -> None:
        shown: list[Any] = [
            ln.decode("utf-8", "replace")
            if self.keep_text
            else {"bytes": len(ln), "sha256": text_hash(ln.decode("utf-8", "replace"), self.salt)}
            for ln in lines
        ]
        self.reject(shown, f"unparsable line in {name}", key="line")

    # -- replay -----------------------------------------------------------------------------------
    @staticmethod
    def _offset_path(p: Path) -> Path:
        return p.with_name(p.name + ".offset")

    def _ordered(self) -> list[Segment]:
        """Oldest first: segments adopted from dead processes, then ours in sequence."""
        return sorted(self._segs.values(), key=lambda s: (s.own, s.path.name))

    def scan(self) -> None:
        """Adopt the segments of dead processes (their lock is free); counts their records once."""
        with self._lock:
            for p in sorted(self.dir.glob("spool-*.jsonl")):
                if p not in self._segs:
                    self._adopt(p)

    def _adopt(self, p: Path) -> None:
        try:
            fd = open_private(p, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            if st.st_nlink == 0:
                raise FileNotFoundError(p)  # its writer finished and deleted it meanwhile
        except OSError:
            os.close(fd)  # its writer is alive
            return
        try:
            off = int(self._offset_path(p).read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            off = 0
        off = min(max(off, 0), st.st_size)
        seg = Segment(p, fd, own=False, size=st.st_size, offset=off, saved=off, read_pos=off)
        seg.records = self._count(seg)
        self._segs[p] = seg

    def _count(self, seg: Segment) -> int:
        n, pos, last = 0, seg.offset, b"\n"
        while pos < seg.size:
            block = os.pread(seg.fd, min(BLOCK, seg.size - pos), pos)
            if not block:
                break
            n += block.count(b"\n")
            pos += len(block)
            last = block[-1:]
        self.bytes_read += pos - seg.offset
        return n + (last != b"\n")  # a torn last line is a record too (rejected when read)

    def backlog_records(self) -> int:
        """Records in the spool not yet in the table."""
        with self._lock:
            return sum(s.records for s in self._segs.values())

    def has_backlog(self) -> bool:
        with self._lock:
            return self._out is not None or any(s.offset < s.size for s in self._segs.values())

    def read_chunk(self, max_records: int) -> Chunk | None:
        """Up to ``max_records`` records after the committed offset of the oldest segment with a
        backlog (the same chunk again until it is committed); unparsable lines go to
        ``rejected.jsonl``."""
        with self._lock:
            if self._out is not None:
                return self._out
            for seg in self._ordered():
                if seg.offset >= seg.size:
                    if seg is not self._active or seg.size > 0:
                        self._forget(seg)
                    continue
                chunk = self._next_chunk(seg, max_records)
                if chunk is not None:
                    self._out = chunk
                    return chunk
            return None

    def _next_chunk(self, seg: Segment, max_records: int) -> Chunk | None:
        records: list[dict[str, Any]] = []
        bad: list[bytes] = []
        end = seg.offset
        while len(records) < max_records:
            while not seg.lines and self._fill(seg):
                pass
            if not seg.lines:
                break
            line, end = seg.lines.popleft()
            rec = parse_record(line)
            if rec is not None:
                records.append(rec)
            elif line.strip():
                bad.append(line)
            else:
                seg.records -= 1
        if bad:
            seg.records -= len(bad)
            self._reject_lines(bad, seg.path.name)
        if records:
            return Chunk(seg.path, records, end)
        if end > seg.offset:
            self._advance(seg, end)
        return None

    def _fill(self, seg: Segment) -> bool:
        """Read the next block of ``seg`` into its lines; ``False`` at its end."""
        if seg.read_pos >= seg.size:
            if seg.tail and not seg.own:  # the torn last line of a dead process
                seg.lines.append((seg.tail, seg.size))
                seg.tail = b""
                return True
            return False
        block = os.pread(seg.fd, min(BLOCK, seg.size - seg.read_pos), seg.read_pos)
        if not block:
            return False
        self.bytes_read += len(block)
        seg.read_pos += len(block)
        parts = (seg.tail + block).split(b"\n")
        seg.tail = parts.pop()
        pos = seg.read_pos - len(seg.tail) - sum(len(p) + 1 for p in parts)
        for p in parts:
            pos += len(p) + 1
            seg.lines.append((p, pos))
        return True

    def commit(self, chunk: Chunk) -> None:
        """Mark a chunk as written to the table (offset saved atomically; a replayed segment deleted)."""
        with self._lock:
            if self._out is chunk:
                self._out = None
            seg = self._segs.get(chunk.path)
            if seg is None or chunk.end_offset <= seg.offset:
                return  # dropped by the cap meanwhile
            seg.records -= chunk.count
            self._advance(seg, chunk.end_offset)

    def _advance(self, seg: Segment, end: int) -> None:
        seg.offset = end
        if end >= seg.size:
            self._forget(seg)
        else:
            self._save_offset(seg)

    def _save_offset(self, seg: Segment) -> None:
        try:
            write_atomic(self._offset_path(seg.path), str(seg.offset).encode())
            seg.saved = seg.offset
        except OSError as e:  # replay goes on; at worst a chunk is replayed again after a crash
            self._write_failed(e, f"offset of {seg.path.name} not saved")

    def _forget(self, seg: Segment) -> None:
        """Delete a segment (replayed, or dropped by the cap) and its offset."""
        self._segs.pop(seg.path, None)
        if self._active is seg:
            self._active = None
        if self._out is not None and self._out.path == seg.path:
            self._out = None
        seg.path.unlink(missing_ok=True)
        self._offset_path(seg.path).unlink(missing_ok=True)
        os.close(seg.fd)
        fsync_dir(self.dir)

    def close(self) -> None:
        """Delete replayed segments, save the others' offsets, release every lock."""
        with self._lock:
            for seg in list(self._segs.values()):
                if seg.offset >= seg.size:
                    self._forget(seg)
                    continue
                if seg.offset != seg.saved:
                    self._save_offset(seg)
                os.close(seg.fd)
            self._segs.clear()
            self._active = self._out = None
