"""Export/import the table as one flat file (CSV or Parquet, chosen by the file suffix).

One line per run, with its query and candidate columns alongside (see :data:`FLAT_COLUMNS`), so a
file exported from one store (e.g. SQLite) imports into another (e.g. PostgreSQL) unchanged.
Import is one transaction (streamed: a batch of rows in memory at a time); a bad value raises an error naming file,
line, field, and nothing is written; an empty value never erases a stored one.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from pydantic import ValidationError

from litellm_energy_router.errors import one_line, reading, replacing
from litellm_energy_router.table.rows import BadRowError, Candidate, Query, Run
from litellm_energy_router.table.store import TableStore

CANDIDATE_COLUMNS = ["candidate", "model", "params_b", "active_params_b", "hardware"]
QUERY_COLUMNS = ["query_id", "task", "text", "text_hash", "reference", "query_source", "query_created"]
#: every run field but its key's query and candidate (in the query and candidate columns): an export holds the
#: whole row, so importing it over the same table changes nothing
RUN_COLUMNS = [f for f in Run.model_fields if f not in ("query_id", "candidate")]
FLAT_COLUMNS = QUERY_COLUMNS + CANDIDATE_COLUMNS + RUN_COLUMNS
_INT = {"prompt_tokens", "completion_tokens"}
_FLOAT = {
    "params_b",
    "active_params_b",
    "score",
    "latency_s",
    "ttft_s",
    "energy_j",
    "avg_power_w",
    "propensity",
    "created",
    "query_created",
    "energy_estimate_j",
    "energy_reference_j",
    "co2e_g",
}


def _fmt(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    raise BadRowError(f"{path}: unknown format (use a .csv or .parquet file name)")


def _flat_rows(store: TableStore) -> Iterable[dict[str, Any]]:
    for r in store.iter_runs():
        yield {k: r.get(k) for k in FLAT_COLUMNS}


def export_table(store: TableStore, path: str | Path, *, batch: int = 5000) -> int:
    """Write every run (joined with query and candidate) to ``path``, streamed (``batch`` rows in memory at a
    time), into a temporary file beside it moved into place at the end: an export that fails or is interrupted
    leaves ``path`` as it was. Returns the row count."""
    path = Path(path)
    fmt = _fmt(path)
    with replacing(path) as tmp:
        return _export(store, tmp, fmt, batch)


def _export(store: TableStore, path: Path, fmt: str, batch: int) -> int:
    n = 0
    if fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=FLAT_COLUMNS)
            w.writeheader()
            for row in _flat_rows(store):
                w.writerow({k: ("" if v is None else v) for k, v in row.items()})
                n += 1
        return n
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {c: pa.float64() if c in _FLOAT else pa.int64() if c in _INT else pa.string() for c in FLAT_COLUMNS}
    schema = pa.schema([(c, types[c]) for c in FLAT_COLUMNS])
    with pq.ParquetWriter(path, schema) as out:
        part: list[dict[str, Any]] = []
        for row in _flat_rows(store):
            part.append(row)
            if len(part) >= batch:
                out.write_table(pa.Table.from_pylist(part, schema=schema))
                n, part = n + len(part), []
        if part or not n:
            out.write_table(pa.Table.from_pylist(part, schema=schema))
            n += len(part)
    return n


def _records(path: Path, batch: int = 5000) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of the file, streamed: where is ``line N`` (the physical line a CSV record starts
    on: query texts may hold newlines) or ``row N`` (Parquet), for messages. The header is checked first."""
    if _fmt(path) == "csv":
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            _check_columns(path, reader.fieldnames or [])
            start = reader.line_num + 1
            for r in reader:
                yield f"line {start}", {k: (None if v == "" else v) for k, v in r.items()}
                start = reader.line_num + 1
        return
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    _check_columns(path, pf.schema_arrow.names)
    i = 0
    for part in pf.iter_batches(batch_size=batch):
        for r in part.to_pylist():
            i += 1
            yield f"row {i}", {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}


def _check_columns(path: Path, columns: Sequence[str]) -> None:
    """Refuse a file without a key column, or with a column the table does not have: a misspelt ``score`` would
    import every row without its label."""
    missing = [c for c in ("query_id", "task", "text_hash", "candidate", "source") if c not in columns]
    if missing:
        raise BadRowError(f"{path}: missing column {missing[0]!r}")
    unknown = [c for c in columns if c not in FLAT_COLUMNS]
    if unknown:
        raise BadRowError(
            f"{path}: unknown column {unknown[0]!r} (a table export's columns: {', '.join(FLAT_COLUMNS)})"
        )


def _parsed(path: Path, batch: int) -> Iterator[tuple[list[Candidate], list[Query], list[Run]]]:
    """The file's rows validated, ``batch`` runs at a time (each batch's candidates and queries once, from their
    first row in it); a bad value raises :class:`BadRowError` naming the file, line and field."""
    cands: dict[str, Candidate] = {}
    queries: dict[str, Query] = {}
    runs: list[Run] = []
    with reading(path):
        for where, r in _records(path, batch):
            try:
                _parse_row(r, cands, queries, runs)
            except ValidationError as e:
                raise BadRowError(one_line(e, f"{path}:{where}", whole="<row>")) from None
            except Exception as e:  # noqa: BLE001  (a missing value: KeyError)
                raise BadRowError(f"{path}:{where}: {e}") from None
            if len(runs) >= batch:
                yield list(cands.values()), list(queries.values()), runs
                cands, queries, runs = {}, {}, []
    if runs:
        yield list(cands.values()), list(queries.values()), runs


def _parse_row(r: dict[str, Any], cands: dict[str, Candidate], queries: dict[str, Query], runs: list[Run]) -> None:
    name, qid = r["candidate"], r["query_id"]
    if name not in cands:
        cands[name] = Candidate(name=name, **{k: r.get(k) for k in CANDIDATE_COLUMNS[1:]})
    if qid not in queries:
        q = {
            "id": qid,
            "task": r["task"],
            "text": r.get("text"),
            "text_hash": r["text_hash"],
            "reference": r.get("reference"),
            "source": r.get("query_source") or r["source"],
        }
        if r.get("query_created") is not None:
            q["created"] = r["query_created"]
        queries[qid] = Query.model_validate(q)
    run = {k: r.get(k) for k in RUN_COLUMNS if r.get(k) is not None}
    runs.append(Run.model_validate({"query_id": qid, "candidate": name, **run}))


def import_table(store: TableStore, path: str | Path, *, batch: int = 5000) -> int:
    """Upsert every row of an exported file; returns the number of runs. All or nothing: validated and written in
    one transaction, ``batch`` rows in memory at a time, so a bad row anywhere rolls back every batch before it. A
    value the file leaves empty (or a column it lacks: an export of an earlier release) never replaces one the table
    holds."""
    path = Path(path)
    if not path.exists():
        raise BadRowError(f"{path}: file not found")
    try:
        return store.write_batches(lambda: _parsed(path, batch), keep_stored=True).runs
    except BadRowError as e:
        if str(e).startswith(f"{path}:"):  # a bad value: it names the file, line and field already
            raise
        raise BadRowError(f"{path}: {e}") from None  # the table's refusal (a query id it holds for another query)
