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
The files are read and validated by :mod:`.matrix_files` (``MatrixFormatError``, ``MatrixRow``,
``iter_matrix`` and ``LONG_FIELDS`` are importable from here too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from litellm_energy_router.energy.profile import EnergyProfile, chat_output_tokens
from litellm_energy_router.errors import one_line
from litellm_energy_router.table import BadRowError, Candidate, Query, Run, TableStore, text_hash

from .matrix_files import LONG_FIELDS as LONG_FIELDS
from .matrix_files import MatrixFormatError, MatrixRow, iter_matrix

BATCH = 500  # queries per write transaction
PRIOR_NOTE = "energy: output tokens unknown, candidate's chat-length prior"


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


def _validate(path: str | Path, default_task: str | None, priced: tuple[Any, ...]) -> None:
    """Pass 1: check every row of ``path`` (``priced``: models, profile, prior, encoder); write nothing."""
    check = MatrixSummary()
    seen: set[str] = set()
    for row in iter_matrix(path, default_task):
        if row.query_id in seen:
            raise MatrixFormatError(
                f"{row.where}: query_id {row.query_id!r} appears twice (its rows must be consecutive)"
            )
        seen.add(row.query_id)
        _checked_runs(row, *priced, check)


def _candidates(profile: EnergyProfile, models: Mapping[str, str]) -> list[Candidate]:
    return [
        Candidate(
            name=c,
            model=profile.models[c].model,
            params_b=profile.models[c].params_b,
            active_params_b=profile.models[c].active_params_b,
            hardware=profile.models[c].hardware,
        )
        for c in sorted(set(models.values()))
    ]


def _write_rows(
    store: TableStore,
    path: str | Path,
    default_task: str | None,
    priced: tuple[Any, ...],
    keep: Callable[[MatrixRow], bool] | None,
    progress: Callable[[int], None] | None,
    summary: MatrixSummary,
) -> None:
    """Pass 2: write the kept rows of ``path`` in batches of :data:`BATCH` queries, counting into ``summary``."""
    queries: list[Query] = []
    runs: list[Run] = []

    wheres: list[str] = []  # the file and line of each query of the batch

    def flush() -> None:
        if queries:
            try:
                store.write(queries, runs)
            except BadRowError as e:  # a query id the table holds for another query: name its line
                i = getattr(e, "index", None)
                raise BadRowError(f"{wheres[i]}: {e}" if i is not None else f"{path}: {e}") from None
            wheres.clear()
            if progress:
                progress(len(queries))
            queries.clear()
            runs.clear()

    for row in iter_matrix(path, default_task):
        if keep is not None and not keep(row):
            summary.held_back += 1
            continue
        q, rs = _checked_runs(row, *priced, summary)
        if not rs:
            continue
        queries.append(q)
        wheres.append(row.where)
        runs.extend(rs)
        summary.queries += 1
        summary.runs += len(rs)
        for r in rs:
            summary.per_candidate[r.candidate] = summary.per_candidate.get(r.candidate, 0) + 1
        if len(queries) >= BATCH:
            flush()
    flush()


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
    priced = (models, profile, prior, cl100k())
    _validate(path, default_task, priced)  # pass 1: validate everything, write nothing
    summary = MatrixSummary()
    store.write(candidates=_candidates(profile, models))
    _write_rows(store, path, default_task, priced, keep, progress, summary)  # pass 2: write in batches
    return summary
