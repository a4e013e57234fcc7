"""Reading an evaluation matrix file: the three forms (JSONL long or wide, CSV, LLMRouter's JSON; see
:mod:`.matrix_import`), streamed and validated into one :class:`MatrixRow` per query. A malformed file raises
:class:`MatrixFormatError` naming file, line and field. :mod:`.matrix_import` prices and writes the rows (and
re-exports these names).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from litellm_energy_router.errors import UserError, reading
from litellm_energy_router.table import text_hash

LONG_FIELDS = ("query_id", "task", "query", "model", "score", "prompt_tokens", "output_tokens")


class MatrixFormatError(UserError, ValueError):
    """A matrix file is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class MatrixRow:
    """One query of the matrix: per model (score, output tokens or None)."""

    query_id: str
    task: str
    text: str
    prompt_tokens: int | None
    scores: dict[str, tuple[float, int | None]]
    where: str
    model_where: dict[str, str] = field(default_factory=dict)  # long form: the line of each model's row


def _open(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _kind(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    for ext, kind in ((".jsonl", "jsonl"), (".csv", "csv"), (".json", "llmrouter")):
        if name.endswith(ext):
            return kind
    raise MatrixFormatError(f"{path}: unknown format (use .jsonl, .csv or LLMRouter's .json)")


def _score(raw: Any, where: str, model: str) -> float | None:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "nan")):
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise MatrixFormatError(f"{where}: field 'score' = {str(raw)[:40]!r} (model {model!r}): not a number") from None
    if math.isnan(v):
        return None
    if not 0.0 <= v <= 1.0:
        raise MatrixFormatError(f"{where}: field 'score' = {v!r} (model {model!r}): not in [0, 1]")
    return v


def _count(raw: Any, where: str, name: str) -> int | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise MatrixFormatError(f"{where}: field {name!r} = {str(raw)[:40]!r}: not a number") from None
    if not (math.isfinite(v) and v >= 0 and v == int(v)):
        raise MatrixFormatError(f"{where}: field {name!r} = {raw!r}: not a non-negative integer")
    return int(v)


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not v.strip():
        raise MatrixFormatError(f"{where}: field {key!r} = {str(v)[:40]!r}: missing or empty")
    return v


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with reading(path), _open(path) as fh:
        for i, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as e:
                    raise MatrixFormatError(f"{path}:{i}: not JSON ({e.msg})") from None


def _json_array(path: Path, chunk: int = 1 << 16) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level JSON array, decoded one at a time (the file is never read whole); the
    line number is where each element starts."""
    dec, buf, pos, line, started = json.JSONDecoder(), "", 0, 1, False
    with reading(path), _open(path) as fh:
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                line += buf[pos] == "\n"
                pos += 1
            if not started and pos < len(buf):
                if buf[pos] != "[":
                    raise MatrixFormatError(f"{path}:{line}: not a JSON array")
                started, pos = True, pos + 1
                continue
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                more = fh.read(chunk)
                if not more:
                    raise MatrixFormatError(f"{path}:{line}: not JSON ({e.msg})") from None
                buf, pos = buf[pos:] + more, 0
                continue
            yield line, obj
            line += buf.count("\n", pos, end)
            buf, pos = buf[end:], 0


def _llmrouter_tasks(path: Path) -> dict[str, str]:
    """LLMRouter's ``default_query_train.jsonl`` beside ``path``: the text hash of each query → its task."""
    side = path.parent / "default_query_train.jsonl"
    if not side.exists():
        raise MatrixFormatError(f"{path}: LLMRouter matrix needs {side.name} beside it (the tasks)")
    out: dict[str, str] = {}
    for i, obj in _json_lines(side):
        out.setdefault(text_hash(_text(obj, "query", f"{side}:{i}")), _text(obj, "task_name", f"{side}:{i}"))
    return out


def iter_matrix(path: str | Path, default_task: str | None = None) -> Iterator[MatrixRow]:
    """The queries of a matrix file, validated (scores in [0, 1], token counts integers). A long-form
    file's rows of the same query must be consecutive (as a per-query export writes them)."""
    path = Path(path)
    if not path.exists():
        raise MatrixFormatError(f"{path}: file not found")
    kind = _kind(path)
    if kind == "llmrouter":
        tasks = _llmrouter_tasks(path)
        for line, obj in _json_array(path):
            where = f"{path}:{line}"
            if not isinstance(obj, dict):
                raise MatrixFormatError(f"{where}: expected an object, got {type(obj).__name__}")
            text = _text(obj, "question", where)
            h = text_hash(text)
            task = tasks.get(h, default_task)
            if task is None:
                raise MatrixFormatError(
                    f"{where}: question has no task in default_query_train.jsonl (use --default-task)"
                )
            yield _wide(obj, f"llmrouter:{h[:16]}", task, text, where)
        return
    rows = _json_lines(path) if kind == "jsonl" else _csv_rows(path)
    pending: MatrixRow | None = None
    for line, obj in rows:
        where = f"{path}:{line}"
        if not isinstance(obj, dict):
            raise MatrixFormatError(f"{where}: expected an object, got {type(obj).__name__}")
        text, task = _text(obj, "query", where), _text(obj, "task", where)
        qid = str(obj.get("query_id") or "").strip() or text_hash(text)[:16]
        if "scores" in obj:
            if pending is not None:
                yield pending
                pending = None
            yield _wide(obj, qid, task, text, where)
            continue
        model = _text(obj, "model", where)
        s = _score(obj.get("score"), where, model)
        out = _count(obj.get("output_tokens"), where, "output_tokens")
        if pending is not None and pending.query_id != qid:
            yield pending
            pending = None
        if pending is None:
            pending = MatrixRow(qid, task, text, _count(obj.get("prompt_tokens"), where, "prompt_tokens"), {}, where)
        elif (pending.task, pending.text) != (task, text):  # one id, one query: not another's scores under it
            what = "task" if pending.task != task else "query text"
            raise MatrixFormatError(f"{where}: query_id {qid!r} has another {what} than at {pending.where}")
        if model in pending.scores:
            raise MatrixFormatError(f"{where}: model {model!r} twice for query_id {qid!r}")
        pending.scores[model] = (s, out)  # type: ignore[assignment]  (None = no label)
        pending.model_where[model] = where
    if pending is not None:
        yield pending


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    csv.field_size_limit(1 << 30)
    with reading(path), _open(path) as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("task", "query", "model", "score") if c not in (reader.fieldnames or [])]
        if missing:
            raise MatrixFormatError(f"{path}: missing column {missing[0]!r}")
        try:
            for row in reader:
                if None in row:
                    raise MatrixFormatError(f"{path}:{reader.line_num}: wrong number of fields")
                yield reader.line_num, row
        except csv.Error as e:
            raise MatrixFormatError(f"{path}:{reader.line_num}: CSV error: {e}") from None


def _wide(obj: Mapping[str, Any], qid: str, task: str, text: str, where: str) -> MatrixRow:
    scores, outs = obj.get("scores"), obj.get("output_tokens") or {}
    if not isinstance(scores, dict) or not scores or not isinstance(outs, dict):
        raise MatrixFormatError(f"{where}: field 'scores' must be a non-empty object model -> score")
    return MatrixRow(
        qid,
        task,
        text,
        _count(obj.get("prompt_tokens"), where, "prompt_tokens"),
        {
            str(m): (_score(v, where, str(m)), _count(outs.get(m), where, "output_tokens"))  # type: ignore[misc]
            for m, v in scores.items()
        },
        where,
    )
