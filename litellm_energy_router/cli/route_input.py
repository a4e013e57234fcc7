"""What ``energy-router route --input`` reads: the prompts users have, as (row key, task, text) rows.

* ``.txt`` (or any other name): one plain-text prompt per line (blank lines skipped);
* ``.jsonl``: one JSON object per line with ``prompt`` (a string) or ``messages`` (a chat list, routed on
  the same text as a served request: :func:`~litellm_energy_router.litellm_glue.request_text.query_text`),
  and optionally ``id`` and ``eval_name`` (or ``task``); a line that is a bare chat list or string works too;
* ``.json``: one chat ``messages`` list, or a list of the JSONL objects;
* ``.csv`` / ``.csv.gz``: a ``prompt`` column (plain text, or RouterBench's Python list literal
  ``"['What is 2+2?']"``) or a ``messages`` column (chat JSON), optional ``eval_name`` and row key
  (``Unnamed: 0``, ``id``).

A bad file raises :class:`RouteInputError`: one line naming the file, the line and the problem.
"""

from __future__ import annotations

import ast
import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any, Iterator

from litellm_energy_router.errors import UserError, reading

Row = tuple[str, "str | None", str]
FORMATS_HELP = (
    'prompts: .txt (one per line), .jsonl ({"prompt"} or {"messages"} per line, optional id, '
    "eval_name), .json (a chat messages list or a list of those objects), .csv[.gz] (column prompt, "
    "plain or RouterBench's list literal, or messages; optional eval_name)"
)


class RouteInputError(UserError, ValueError):
    """A prompt file ``route`` cannot read; ``str(err)`` is one line naming file and line."""


def read_route_input(path: Path) -> list[Row]:
    """(row key, eval_name or None, text to route on) per prompt of ``path``."""
    name = path.name.lower()
    try:
        if name.endswith((".csv", ".csv.gz")):
            rows = list(_csv_rows(path))
        elif name.endswith(".jsonl"):
            rows = [
                _record(path, n, _json(path, n, line), str(n - 1))
                for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1)
                if line.strip()
            ]
        elif name.endswith(".json"):
            rows = _json_file(path)
        else:
            rows = [
                (str(i), None, line)
                for i, line in enumerate(ln for ln in path.read_text(encoding="utf-8-sig").splitlines() if ln.strip())
            ]
    except UnicodeDecodeError as e:
        raise RouteInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not rows:
        raise RouteInputError(f"{path}: no prompts ({FORMATS_HELP})")
    return rows


def _json(path: Path, n: int | None, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        where = f"{path}:{n}" if n is not None else f"{path}:{e.lineno}"
        raise RouteInputError(f"{where}: not valid JSON ({e.msg})") from None


def _json_file(path: Path) -> list[Row]:
    doc = _json(path, None, path.read_text(encoding="utf-8-sig"))
    if isinstance(doc, list) and doc and all(isinstance(m, dict) and "role" in m for m in doc):
        return [_record(path, 1, {"messages": doc}, "0")]
    if not isinstance(doc, list):
        doc = [doc]
    return [_record(path, i + 1, rec, str(i)) for i, rec in enumerate(doc)]


def _record(path: Path, n: int, rec: Any, default_key: str) -> Row:
    """One JSON prompt record (object, chat list or string) as a row."""
    from litellm_energy_router.litellm_glue.request_text import query_text

    where = f"{path}:{n}"
    if isinstance(rec, str):
        return default_key, None, rec
    if isinstance(rec, list):
        rec = {"messages": rec}
    if not isinstance(rec, dict):
        raise RouteInputError(f"{where}: expected an object with 'prompt' or 'messages', got {type(rec).__name__}")
    task = rec.get("eval_name", rec.get("task"))
    if task is not None and not isinstance(task, str):
        raise RouteInputError(f"{where}: field 'eval_name' = {str(task)[:40]!r}: not a string")
    key = str(rec.get("id", default_key))
    if isinstance(rec.get("prompt"), str):
        return key, task, rec["prompt"]
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise RouteInputError(f"{where}: needs 'prompt' (a string) or 'messages' (a list of chat messages)")
    text = query_text(messages=msgs)
    if not text:
        raise RouteInputError(f"{where}: 'messages' hold no text to route on")
    return key, task, text


def _prompt_cell(raw: str) -> str:
    """A CSV ``prompt`` cell: RouterBench's list literal (``"['...']"``) joined, else the plain text."""
    if raw.startswith("[") and raw.endswith("]"):
        try:
            parts = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw  # plain text that happens to be bracketed
        if isinstance(parts, list) and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return raw


def _csv_rows(path: Path) -> Iterator[Row]:
    csv.field_size_limit(1 << 30)
    raw = gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")
    with reading(path), io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        col = "prompt" if "prompt" in header else "messages" if "messages" in header else None
        if col is None:
            raise RouteInputError(f"{path}: missing column 'prompt' (or 'messages'); {FORMATS_HELP}")
        key_i = next((header.index(k) for k in ("Unnamed: 0", "", "id", "sample_id") if k in header), None)
        c_i, t_i = header.index(col), header.index("eval_name") if "eval_name" in header else None
        for n, rec in enumerate(reader, start=2):
            if len(rec) != len(header):
                raise RouteInputError(f"{path}:{n}: {len(rec)} fields, the header has {len(header)}")
            key = rec[key_i] if key_i is not None else str(n - 2)
            task = rec[t_i] if t_i is not None else None
            if col == "prompt":
                yield key, task, _prompt_cell(rec[c_i])
            else:
                yield _record(path, n, {"messages": _json(path, n, rec[c_i]), "id": key, "eval_name": task}, key)
