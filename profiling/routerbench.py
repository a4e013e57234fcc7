"""Import RouterBench rows into the tournament table, with energy estimated from a profile.

RouterBench CSV format (as in RouterDC's ``routerbench_zs/*_train.csv``): the row key is the unnamed
first column (pandas' ``Unnamed: 0``), ``prompt`` is a Python list literal of strings, ``eval_name``
the task, and per model ``<model>`` (0/1 correctness, may be NaN), ``<model>|model_response`` (list
literal) and ``<model>|total_cost`` (USD). Files may be gzip-compressed (``.csv.gz``).

Token counts are tiktoken ``cl100k_base`` counts (RouterBench's own; exact against ``total_cost``),
computed offline with ``bpe-openai``. Energy is ``profile.estimate_j(prompt_tokens, output_tokens)``;
rows are written with ``energy_method="estimate"`` and ``source="import"``.

All files are parsed and validated before anything is written, and the write is one transaction, so a
malformed file never leaves a partial import.
"""

from __future__ import annotations

import ast
import csv
import gzip
import io
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from litellm_energy_router.energy.profile import EnergyProfile
from litellm_energy_router.errors import UserError, reading
from litellm_energy_router.table import Candidate, Query, Run, TableStore, text_hash

OPEN_MODELS: tuple[str, ...] = (
    "mistralai/mistral-7b-chat",
    "WizardLM/WizardLM-13B-V1.2",
    "mistralai/mixtral-8x7b-chat",
    "meta/code-llama-instruct-34b-chat",
    "zero-one-ai/Yi-34B-Chat",
    "meta/llama-2-70b-chat",
)
KEY_COLUMNS = ("", "Unnamed: 0")


class ImportFormatError(UserError, ValueError):
    """A RouterBench file is malformed; the message names the file, line and column."""


@dataclass
class ImportSummary:
    files: int = 0
    rows_read: int = 0
    queries: int = 0
    runs: int = 0
    skipped_pairs: int = 0
    skipped_queries: int = 0
    per_model: dict[str, int] = field(default_factory=dict)
    held_back: int = 0  # queries left out by ``keep``

    def line(self, url: str) -> str:
        return (
            f"imported {self.queries} queries, {self.runs} runs ({len(self.per_model)} models) from {self.files} "
            f"file(s) into {url}; skipped {self.skipped_pairs} (query, model) pairs with NaN correctness "
            f"({self.skipped_queries} queries with no label at all)"
            + (f"; held back {self.held_back} queries" if self.held_back else "")
            + "; energy_method=estimate source=import"
        )


def bundled_files() -> list[Path]:
    """The bundled RouterBench development rows (see ``data/routerbench/NOTICE.md``)."""
    root = resources.files("litellm_energy_router.data.routerbench")
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".csv.gz"))


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _literal_list(raw: str, where: str) -> list[str]:
    try:
        val = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ImportFormatError(f"{where}: not a Python list literal: {raw[:60]!r}") from None
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise ImportFormatError(f"{where}: expected a list of strings, got {type(val).__name__}: {raw[:60]!r}")
    return val


def _score(raw: str, where: str) -> float | None:
    if raw.strip() == "" or raw.strip().lower() == "nan":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ImportFormatError(f"{where}: correctness {raw!r} is not a number") from None
    if math.isnan(v):
        return None
    return v


@dataclass(frozen=True)
class Record:
    """One RouterBench row: its query and, per model with a label, (correctness, recorded response).
    ``where`` is ``file:line`` for error messages."""

    query_id: str
    task: str
    prompt: str
    answers: dict[str, tuple[float, str]]
    where: str


def _checked_header(path: Path, header: Sequence[str], models: Sequence[str]) -> tuple[str, list[str]]:
    """(the row-key column, the columns every row needs) of a RouterBench file's ``header``; else
    :class:`ImportFormatError` naming the file and the first missing column."""
    key_col = next((k for k in KEY_COLUMNS if k in header), None)
    if key_col is None:
        raise ImportFormatError(f"{path}: missing row-key column 'Unnamed: 0' (the unnamed first column)")
    needed = ["prompt", "eval_name"] + [c for m in models for c in (m, f"{m}|model_response")]
    missing = [c for c in needed if c not in header]
    if missing:
        raise ImportFormatError(
            f"{path}: missing column {missing[0]!r}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return key_col, needed


def check_headers(files: Sequence[str | Path], models: Sequence[str] = OPEN_MODELS) -> None:
    """Each file's header as :func:`iter_records` checks it, reading nothing else: a wrong file is refused before
    the table is opened (a failed import left an empty database behind)."""
    csv.field_size_limit(1 << 30)
    for f in files:
        path = Path(f)
        if not path.exists():
            raise ImportFormatError(f"{path}: file not found")
        with reading(path), _open_text(path) as fh:
            _checked_header(path, csv.DictReader(fh).fieldnames or [], models)


def iter_records(
    files: Sequence[str | Path], models: Sequence[str] = OPEN_MODELS, summary: ImportSummary | None = None
) -> Iterator[Record]:
    """Read and validate RouterBench rows one by one. Rows with no label for any of ``models`` are
    skipped (counted in ``summary``); a malformed file raises :class:`ImportFormatError`."""
    summary = summary if summary is not None else ImportSummary()
    csv.field_size_limit(1 << 30)
    seen: set[str] = set()
    for f in files:
        path = Path(f)
        if not path.exists():
            raise ImportFormatError(f"{path}: file not found")
        summary.files += 1
        with reading(path), _open_text(path) as fh:
            reader = csv.DictReader(fh)
            key_col, needed = _checked_header(path, reader.fieldnames or [], models)
            try:
                for row in reader:
                    line = reader.line_num
                    summary.rows_read += 1
                    if None in row or any(row.get(c) is None for c in needed):
                        raise ImportFormatError(f"{path}:{line}: wrong number of fields")
                    key = row[key_col].strip()
                    task = row["eval_name"].strip()
                    if not key or not task:
                        raise ImportFormatError(
                            f"{path}:{line}: column {'eval_name' if key else repr(key_col)} is empty"
                        )
                    prompt = "".join(_literal_list(row["prompt"], f"{path}:{line}: column 'prompt'"))
                    qid = f"routerbench:{task}:{key}"
                    answers: dict[str, tuple[float, str]] = {}
                    for m in models:
                        s = _score(row[m], f"{path}:{line}: column {m!r}")
                        if s is None:
                            summary.skipped_pairs += 1
                            continue
                        resp = "".join(
                            _literal_list(row[f"{m}|model_response"], f"{path}:{line}: column '{m}|model_response'")
                        )
                        answers[m] = (s, resp)
                    if not answers:
                        summary.skipped_queries += 1
                        continue
                    if qid in seen:
                        raise ImportFormatError(f"{path}:{line}: duplicate row key {key!r} for task {task!r}")
                    seen.add(qid)
                    yield Record(qid, task, prompt, answers, f"{path}:{line}")
            except csv.Error as e:
                raise ImportFormatError(f"{path}:{reader.line_num}: CSV error: {e}") from None


def parse_files(
    files: Sequence[str | Path],
    profile: EnergyProfile,
    models: Sequence[str] = OPEN_MODELS,
    *,
    profile_origin: str = "energy profile",
    progress: Callable[[int], None] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> tuple[list[Candidate], list[Query], list[Run], ImportSummary]:
    """Parse and validate RouterBench files; returns rows ready for :meth:`TableStore.write`.

    ``keep(query_id)`` selects the queries to import (default: all); the others are counted in
    ``summary.held_back`` and written nowhere (e.g. the demo's held-back traffic)."""
    from litellm_energy_router.tokens import cl100k

    enc = cl100k()
    entries = {m: profile.get(m, origin=profile_origin) for m in models}
    summary = ImportSummary()
    queries: list[Query] = []
    runs: list[Run] = []
    for rec in iter_records(files, models, summary):
        if keep is not None and not keep(rec.query_id):
            summary.held_back += 1
            continue
        try:
            n_prompt = len(enc.encode(rec.prompt))
            queries.append(
                Query(id=rec.query_id, task=rec.task, text=rec.prompt, text_hash=text_hash(rec.prompt), source="import")
            )
            for m, (s, resp) in rec.answers.items():
                n_out = len(enc.encode(resp))
                runs.append(
                    Run(
                        query_id=rec.query_id,
                        candidate=m,
                        source="import",
                        score=s,
                        prompt_tokens=n_prompt,
                        completion_tokens=n_out,
                        energy_j=entries[m].estimate_j(n_prompt, n_out),
                        energy_method="estimate",
                        gpu=entries[m].hardware,
                    )
                )
                summary.per_model[m] = summary.per_model.get(m, 0) + 1
        except ValueError as e:  # pydantic: a bad value in a built row
            raise ImportFormatError(f"{rec.where}: {str(e).splitlines()[0]}") from None
        if progress:
            progress(1)
    candidates = [
        Candidate(name=m, model=e.model, params_b=e.params_b, active_params_b=e.active_params_b, hardware=e.hardware)
        for m, e in entries.items()
    ]
    summary.queries = len(queries)
    summary.runs = len(runs)
    return candidates, queries, runs, summary


def import_routerbench(
    store: TableStore,
    files: Iterable[str | Path],
    profile: EnergyProfile,
    models: Sequence[str] = OPEN_MODELS,
    *,
    profile_origin: str = "energy profile",
    progress: Callable[[int], None] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> ImportSummary:
    """Parse ``files`` completely, then write candidates, queries and runs (only the queries ``keep``
    accepts, default all). Idempotent."""
    candidates, queries, runs, summary = parse_files(
        list(files), profile, models, profile_origin=profile_origin, progress=progress, keep=keep
    )
    store.write(queries, runs, candidates=candidates)
    return summary
