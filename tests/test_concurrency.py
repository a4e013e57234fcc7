"""4 processes x 5,000 rows into one table: nothing lost, nothing raised (SQLite WAL and PostgreSQL)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from litellm_energy_router.table import make_query, open_store

PROCS, ROWS, BATCH = 4, 5000, 10


def _writer(url: str, proc: int, errors) -> None:
    try:
        store = open_store(url)  # every process races to create the schema too
        # all processes upsert the same shared candidate and query (contended keys) ...
        store.write(
            [make_query("shared", "t", "shared query")], candidates=[{"name": "shared-cand"}, {"name": f"c{proc}"}]
        )
        for start in range(0, ROWS, BATCH):
            ids = range(start, start + BATCH)
            queries = [make_query(f"p{proc}-{i}", "t", f"query {proc} {i}") for i in ids]
            runs = [
                {
                    "query_id": f"p{proc}-{i}",
                    "candidate": f"c{proc}",
                    "source": "tournament",
                    "score": i % 2,
                    "energy_j": float(i),
                }
                for i in ids
            ]
            # ... and each batch also rewrites a contended row
            runs.append(
                {"query_id": "shared", "candidate": "shared-cand", "source": "production", "energy_j": float(proc)}
            )
            store.write(queries, runs)
        store.close()
    except BaseException as e:  # noqa: BLE001
        errors.put(f"process {proc}: {type(e).__name__}: {e}")


@pytest.mark.slow
def test_four_processes_lose_nothing(any_url):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(any_url, p, errors)) for p in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    errs = []
    while not errors.empty():
        errs.append(errors.get())
    assert errs == []
    assert all(p.exitcode == 0 for p in procs)
    store = open_store(any_url)
    rows = list(store.iter_runs())
    per = {}
    for r in rows:
        per[r["candidate"]] = per.get(r["candidate"], 0) + 1
    assert per == {**{f"c{p}": ROWS for p in range(PROCS)}, "shared-cand": 1}
    assert len({(r["query_id"], r["candidate"], r["source"]) for r in rows}) == PROCS * ROWS + 1
    # every value arrived intact
    assert sum(r["energy_j"] for r in rows if r["candidate"] != "shared-cand") == PROCS * sum(range(ROWS))
    store.close()
