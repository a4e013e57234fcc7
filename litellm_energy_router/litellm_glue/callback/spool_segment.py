"""The spool's records and segments (:mod:`.spool`): a :class:`Chunk` of records read from one segment with
the byte offset to commit once they are in the table, a segment's bookkeeping (:class:`Segment`: its
descriptor, size, committed, saved and read offsets in bytes, records after the committed offset, lines read
and not yet returned), and the parse of one spooled line (:func:`parse_record`: a ``"row"`` or ``"pending"``
record, else None). :mod:`.spool` re-exports :class:`Chunk`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Chunk:
    """Records read from one spool segment: the byte offset to commit once they are in the table."""

    path: Path
    records: list[dict[str, Any]]
    end_offset: int
    count: int = 0  # records read (``records`` may be rewritten, e.g. spilled rows resolved)

    def __post_init__(self) -> None:
        self.count = self.count or len(self.records)


@dataclass(eq=False)
class Segment:
    """One spool segment as :class:`~.spool.Spool` tracks it (offsets and sizes in bytes)."""

    path: Path
    fd: int
    own: bool
    size: int = 0  # bytes in the file
    offset: int = 0  # bytes already in the table
    saved: int = 0  # offset in the .offset file
    records: int = 0  # records after ``offset``
    read_pos: int = 0  # bytes read so far
    tail: bytes = b""  # a partial line read
    lines: deque[tuple[bytes, int]] = field(default_factory=deque)  # (line, offset after it) read, not returned


def parse_record(line: bytes) -> dict[str, Any] | None:
    """One spooled line as its record (a ``"row"`` or ``"pending"`` one), None when it is not one."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and rec.get("k") in ("row", "pending") else None
