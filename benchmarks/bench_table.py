"""Table write throughput on SQLite and PostgreSQL, measured in one run.

    python benchmarks/bench_table.py [--rows 13302] [--single 2000] [--pg URL]

Bulk: the bundled RouterBench rows (2,217 queries x 6 candidates) written in one `write()` call.
Single: one run per `write()` call (a proxy callback's worst case without batching).
Last line: ``sqlite_rows_per_s=<bulk> postgres_rows_per_s=<bulk>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from litellm_energy_router.profiling.routerbench import bundled_files, parse_files
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from litellm_energy_router.energy import load_profile
from litellm_energy_router.table import make_query, open_store


def bench(url: str, parsed, single: int) -> tuple[float, float]:
    candidates, queries, runs, _ = parsed
    store = open_store(url)
    t0 = time.perf_counter()
    store.write(queries, runs, candidates=candidates)
    bulk = len(runs) / (time.perf_counter() - t0)
    store.write([make_query(f"single-{i}", "bench", f"q{i}") for i in range(single)])
    t0 = time.perf_counter()
    for i in range(single):
        store.write(
            runs=[{"query_id": f"single-{i}", "candidate": candidates[0].name, "source": "production", "energy_j": 1.0}]
        )
    one = single / (time.perf_counter() - t0)
    assert store.count_runs() == len(runs) + single
    store.close()
    return bulk, one


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--single", type=int, default=2000)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    parsed = parse_files(bundled_files(), load_profile())
    print(f"rows: {len(parsed[2])} runs, {len(parsed[1])} queries (bulk); {args.single} single-row upserts")
    with tempfile.TemporaryDirectory() as d:
        s_bulk, s_one = bench(f"sqlite:///{Path(d) / 'bench.db'}", parsed, args.single)
    print(f"sqlite   bulk {s_bulk:10.0f} rows/s   single-row upsert {s_one:8.0f} rows/s")
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    name = f"er_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        p_bulk, p_one = bench(
            make_url(args.pg).set(database=name).render_as_string(hide_password=False), parsed, args.single
        )
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    print(f"postgres bulk {p_bulk:10.0f} rows/s   single-row upsert {p_one:8.0f} rows/s")
    print(f"single_row sqlite_rows_per_s={s_one:.0f} postgres_rows_per_s={p_one:.0f}")
    print(f"sqlite_rows_per_s={s_bulk:.0f} postgres_rows_per_s={p_bulk:.0f}")


if __name__ == "__main__":
    main()
