"""Import an evaluation matrix (query, task, per-model score) into the tournament table.

Three forms are read, chosen by the file name (docs/profiling.md, "Importing an evaluation matrix"):

* **JSONL** (``.jsonl``, optionally ``.gz``), one object per line: ``{"query_id", "task", "query", "model",
  "score"}`` (one line per (query, model): the *long* form) or ``{"query_id", "task", "query", "scores":
  {model: score, ...}}`` (one line per query). Optional: ``prompt_tokens``, ``output_tokens`` (long form) or
  ``output_tokens: {model: n}`` (wide form). ``query_id`` may be left out (then the text's hash is the key).
* **CSV** (``.csv``, optionally ``.gz``): the long form's columns, one row per (query, model).
* **LLMRouter** (``.json``: a JSON array of ``{"question", "scores": {model: score}}``, LLMRouter's
  ``train.json``), its tasks joined from ``default_query_train.jsonl`` in the same folder (``task_name`` of
  the same ``query`` text; a question without one gets task ``--default-task`` or is an error).

``models`` maps a matrix model name to a candidate name (the energy profile's entry); a model in the file
that the mapping lacks is an error naming file, line and model. A score must be a number in [0, 1]
(empty / NaN: no label, skipped and counted). Energy per run is the profile's **estimate**:
prompt tokens (given, else cl100k of the query) × J/prompt token + output tokens × J/output token, with the
output tokens given in the file or, when it has none, the candidate's chat-length prior
(:func:`~litellm_energy_router.energy.profile.chat_output_tokens`); such a run keeps
``completion_tokens`` empty and says so in ``grade_note``.

Reading streams the file twice, never holding it whole: a first pass validates every line (so a bad
file writes nothing), the second writes the rows in batches of :data:`BATCH` queries (each batch one
upsert transaction; re-running an interrupted import completes it, upserts are idempotent).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from litellm_energy_router.energy.profile import EnergyProfile, chat_output_tokens
from litellm_energy_router.errors import UserError, one_line
from litellm_energy_router.table import Candidate, Query, Run, TableStore, text_hash

BATCH = 500  # queries per write transaction
LONG_FIELDS = ("query_id", "task", "query", "model", "score", "prompt_tokens", "output_tokens")
PRIOR_NOTE = "energy: output tokens unknown, candidate's chat-length prior"


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


@dataclass
class MatrixSummary:
    queries: int = 0
    runs: int = 0
    skipped_pairs: int = 0
    prior_runs: int = 0
    per_candidate: dict[str, int] = field(default_factory=dict)
    held_back: int = 0

    def line(self, url: str) -> str:
        return (
            f"imported {self.queries} queries, {self.runs} runs ({len(self.per_candidate)} candidates) into {url}; "
            f"skipped {self.skipped_pairs} (query, model) pairs without a score; {self.prior_runs} runs priced "
            f"with the chat-length prior (no output tokens)"
            + (f"; held back {self.held_back} queries" if self.held_back else "")
            + "; energy_method=estimate source=import"
        )


def parse_map(specs: list[str] | None, where: str = "--map") -> dict[str, str]:
    """``["a=x,b=y", "c=z"]`` → ``{a: x, b: y, c: z}``; a spec without ``=`` is an error."""
    out: dict[str, str] = {}
    for spec in specs or []:
        for item in spec.split(","):
            if not item.strip():
                continue
            model, sep, cand = item.partition("=")
            if not sep or not model.strip() or not cand.strip():
                raise MatrixFormatError(f"{where}: {item.strip()!r} is not model=candidate")
            out[model.strip()] = cand.strip()
    if len(set(out.values())) != len(out):
        dup = next(c for c in out.values() if list(out.values()).count(c) > 1)
        raise MatrixFormatError(f"{where}: candidate {dup!r} is the target of two models")
    return out


def _open(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


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
    if not (v >= 0 and v == int(v)):
        raise MatrixFormatError(f"{where}: field {name!r} = {raw!r}: not a non-negative integer")
    return int(v)


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not v.strip():
        raise MatrixFormatError(f"{where}: field {key!r} = {str(v)[:40]!r}: missing or empty")
    return v


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with _open(path) as fh:
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
    with _open(path) as fh:
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
        if model in pending.scores:
            raise MatrixFormatError(f"{where}: model {model!r} twice for query_id {qid!r}")
        pending.scores[model] = (s, out)  # type: ignore[assignment]  (None = no label)
        pending.model_where[model] = where
    if pending is not None:
        yield pending


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    csv.field_size_limit(1 << 30)
    with _open(path) as fh:
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


def _runs(
    row: MatrixRow,
    models: Mapping[str, str],
    profile: EnergyProfile,
    prior: Mapping[str, float],
    enc: Any,
    summary: MatrixSummary,
) -> tuple[Query, list[Run]]:
    """The query and runs of ``row`` (unknown model: an error naming the line)."""
    pt = row.prompt_tokens if row.prompt_tokens is not None else len(enc.encode(row.text))
    runs = []
    for model, (score, out) in row.scores.items():
        cand = models.get(model)
        if cand is None:
            where = row.model_where.get(model, row.where)
            raise MatrixFormatError(f"{where}: model {model!r} has no candidate (map it with --map {model}=CANDIDATE)")
        if score is None:
            summary.skipped_pairs += 1
            continue
        e = profile.models[cand]
        n_out = out if out is not None else prior[cand]
        summary.prior_runs += out is None
        runs.append(
            Run(
                query_id=row.query_id,
                candidate=cand,
                source="import",
                score=score,
                prompt_tokens=pt,
                completion_tokens=out,
                energy_j=e.estimate_j(pt, n_out),
                energy_method="estimate",
                gpu=e.hardware,
                grade_note=None if out is not None else PRIOR_NOTE,
            )
        )
    return Query(id=row.query_id, task=row.task, text=row.text, text_hash=text_hash(row.text), source="import"), runs


def _checked_runs(row: MatrixRow, *args: Any) -> tuple[Query, list[Run]]:
    try:
        return _runs(row, *args)
    except ValueError as e:
        if isinstance(e, MatrixFormatError):
            raise
        raise MatrixFormatError(
            f"{row.where}: {one_line(e, row.where).split(': ', 1)[1]}"
            if hasattr(e, "errors")
            else f"{row.where}: {str(e).splitlines()[0]}"
        ) from None


def import_matrix(
    store: TableStore,
    path: str | Path,
    profile: EnergyProfile,
    models: Mapping[str, str] | None = None,
    *,
    default_task: str | None = None,
    profile_origin: str = "energy profile",
    keep: Callable[[MatrixRow], bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MatrixSummary:
    """Validate ``path`` in one streaming pass, then write it in batches of :data:`BATCH` queries.
    ``models``: matrix model → candidate (default: each model name as its own candidate, which the profile
    must hold). ``keep(row)`` selects the queries written (others are counted in ``held_back``)."""
    from litellm_energy_router.tokens import cl100k

    if models is None:  # identity over the models the file names (first pass)
        models = {m: m for r in iter_matrix(path, default_task) for m in r.scores}
    for cand in models.values():
        profile.get(cand, origin=profile_origin)
    prior, _ = chat_output_tokens(sorted(set(models.values())), profile)
    enc, check = cl100k(), MatrixSummary()
    seen: set[str] = set()
    for row in iter_matrix(path, default_task):  # pass 1: validate everything, write nothing
        if row.query_id in seen:
            raise MatrixFormatError(
                f"{row.where}: query_id {row.query_id!r} appears twice (its rows must be consecutive)"
            )
        seen.add(row.query_id)
        _checked_runs(row, models, profile, prior, enc, check)
    del seen
    summary = MatrixSummary()
    cands = [
        Candidate(
            name=c,
            model=profile.models[c].model,
            params_b=profile.models[c].params_b,
            active_params_b=profile.models[c].active_params_b,
            hardware=profile.models[c].hardware,
        )
        for c in sorted(set(models.values()))
    ]
    store.write(candidates=cands)
    queries: list[Query] = []
    runs: list[Run] = []

    def flush() -> None:
        if queries:
            store.write(queries, runs)
            if progress:
                progress(len(queries))
            queries.clear()
            runs.clear()

    for row in iter_matrix(path, default_task):  # pass 2: write in batches
        if keep is not None and not keep(row):
            summary.held_back += 1
            continue
        q, rs = _checked_runs(row, models, profile, prior, enc, summary)
        if not rs:
            continue
        queries.append(q)
        runs.extend(rs)
        summary.queries += 1
        summary.runs += len(rs)
        for r in rs:
            summary.per_candidate[r.candidate] = summary.per_candidate.get(r.candidate, 0) + 1
        if len(queries) >= BATCH:
            flush()
    flush()
    return summary
