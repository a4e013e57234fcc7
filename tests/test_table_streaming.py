"""Reading the table is chunked: memory while iterating does not grow with the number of rows."""

from __future__ import annotations

import tracemalloc

import pytest

from litellm_energy_router.table import open_store
from litellm_energy_router.table.rows import make_query

CANDS = [{"name": f"m{k}", "model": f"m{k}"} for k in range(4)]


def _fill(store, n_queries: int, start: int = 0) -> None:
    for lo in range(start, start + n_queries, 2500):
        qs = [
            make_query(f"q{i:07d}", f"t{i % 3}", f"question {i} " + "x" * 200, source="import")
            for i in range(lo, min(lo + 2500, start + n_queries))
        ]
        runs = [
            {
                "query_id": q.id,
                "candidate": c["name"],
                "source": "import",
                "score": float(i % 2),
                "energy_j": 10.0 + k,
                "latency_s": 0.1,
            }
            for i, q in enumerate(qs)
            for k, c in enumerate(CANDS)
        ]
        store.write(queries=qs, runs=runs)


def _peak_while_reading(store, batch: int) -> tuple[int, int]:
    tracemalloc.start()
    try:
        n = sum(1 for _ in store.iter_runs(batch=batch))
        return n, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_iter_runs_memory_is_flat_while_rows_grow(backend, request):
    url = request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url")
    store = open_store(url)
    try:
        store.add_candidates(CANDS)
        _fill(store, 5_000)  # 20k runs
        n_small, peak_small = _peak_while_reading(store, batch=1000)
        _fill(store, 15_000, start=5_000)  # 80k runs
        n_large, peak_large = _peak_while_reading(store, batch=1000)
    finally:
        store.close()
    assert (n_small, n_large) == (20_000, 80_000)
    # a reader holding every row would need ~4x the memory for 4x the rows; chunked reads stay flat
    assert peak_large < 1.5 * peak_small, (peak_small, peak_large)


def test_iter_runs_pages_keep_order_and_filters(sqlite_url):
    store = open_store(sqlite_url)
    try:
        store.add_candidates(CANDS)
        _fill(store, 300)
        ids = [r["id"] for r in store.iter_runs(batch=7, since_id=50)]
        assert ids == sorted(ids) and ids[0] == 51 and len(ids) == 1200 - 50
        assert {r["candidate"] for r in store.iter_runs(batch=7) if r["source"] == "import"} == {
            c["name"] for c in CANDS
        }
    finally:
        store.close()
