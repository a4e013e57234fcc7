"""Retrain at scale: wall time, peak RSS and rows read of the real ``retrain`` as the table grows.

Builds tables of N queries (6 candidates each, plus one-candidate production rows with propensities,
10% of N) from the bundled RouterBench rows by copying them with distinct ids and perturbed text, runs
one ``run_retrain`` per size in a fresh process (SQLite; PostgreSQL for the largest with ``--pg``),
and prints per size: wall seconds, peak RSS (the retrain process's ru_maxrss), rows read, queries
trained on. Ends with

    queries=<largest> retrain_s=X peak_rss_mb=Y time_exponent=Z

Z: the log-log slope of retrain time against queries between the second (the first when only two are
given) and the largest size (10k and 100k by default). Targets on 2 cores: retrain_s <= 900, peak_rss_mb <= 4096, Z <= 0.3.

    python benchmarks/bench_retrain_scale.py                       # 2k, 10k, 30k, 100k, default training
    python benchmarks/bench_retrain_scale.py --quick               # CI: small sizes, tiny backbone
    python benchmarks/bench_retrain_scale.py --sizes 2000,10000 --train quick --budget 1000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PG_URL = os.environ.get("ENERGY_ROUTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _base_rows():
    from litellm_energy_router.profiling.routerbench import bundled_files, parse_files

    from litellm_energy_router.energy.profile import load_profile

    cands, queries, runs, _ = parse_files(bundled_files(), load_profile())
    by_q: dict[str, list] = {}
    for r in runs:
        by_q.setdefault(r.query_id, []).append(r)
    return cands, queries, by_q


def build_table(url: str, n: int, base, seed: int = 0, chunk: int = 1000) -> int:
    """Write ``n`` queries (copies of the bundled ones, ``#c<copy>`` ids, a variant line appended to
    the text) with all their runs, plus ``n // 10`` production queries with one run each (a uniformly
    chosen candidate, propensity 1/6). Returns the number of runs written."""
    from litellm_energy_router.table import open_store
    from litellm_energy_router.table.rows import text_hash

    cands, queries, by_q = base
    rng = random.Random(seed)
    store = open_store(url)
    written = 0
    try:
        store.add_candidates(cands)
        qs, rs = [], []
        for i in range(n):
            q = queries[i % len(queries)]
            copy = i // len(queries)
            text = q.text if copy == 0 else f"{q.text}\n(variant {copy})"
            qid = q.id if copy == 0 else f"{q.id}#c{copy}"
            qs.append(q.model_copy(update={"id": qid, "text": text, "text_hash": text_hash(text)}))
            rs.extend(r.model_copy(update={"query_id": qid}) for r in by_q[q.id])
            if i % 10 == 0:  # a production row: one candidate, chosen with probability 1/6
                r = rng.choice(by_q[q.id])
                pid = f"p{i}"
                qs.append(qs[-1].model_copy(update={"id": pid, "source": "production"}))
                rs.append(
                    r.model_copy(
                        update={
                            "query_id": pid,
                            "source": "production",
                            "propensity": 1 / len(by_q[q.id]),
                            "call_id": f"call-{seed}-{i}",
                            "energy_method": "estimate",
                        }
                    )
                )
            if len(qs) >= chunk:
                written += store.write(queries=qs, runs=rs).runs
                qs, rs = [], []
        if qs:
            written += store.write(queries=qs, runs=rs).runs
    finally:
        store.close()
    return written


_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
from litellm_energy_router.training.sampling import TrainingBudget
from litellm_energy_router.settings import load_settings
a = json.loads(sys.argv[1])
st = load_settings(None)
cfg = RetrainConfig(table_url=a["url"], pointer=Path(a["dir"]) / "router.json", min_new_rows=0, quick=a["quick"],
                    budget=TrainingBudget(max_queries=a["budget"]), embed_cache_dir=a.get("cache"),
                    lam=st.knob.lambda_, epsilon=st.router.epsilon)
t0 = time.time()
res = run_retrain(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
d = res.details
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"status": res.status, "seconds": time.time() - t0, "cpu_s": ru.ru_utime + ru.ru_stime, "train_queries": d.get("train_queries"),
                  "rows_read": d.get("data", {}).get("rows_read"), "timings": d.get("timings"),
                  "sampled": d.get("data", {}).get("sample", {}).get("sampled")}))
"""


def run_one(url: str, workdir: Path, quick: bool, budget: int, cache: str | None) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    arg = json.dumps({"url": url, "dir": str(workdir), "quick": quick, "budget": budget, "cache": cache})
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"retrain failed on {url} (exit {p.returncode})")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


def _pg_db() -> tuple[str, callable]:
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"er_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()

    return make_url(PG_URL).set(database=name).render_as_string(hide_password=False), drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2000,10000,30000,100000", help="queries per table, ascending")
    ap.add_argument("--train", choices=["default", "quick"], default="default", help="TrainConfig of the retrain")
    ap.add_argument("--budget", type=int, default=None, help="retrain.budget.max_queries (default: TrainingBudget's)")
    ap.add_argument("--pg", action=argparse.BooleanOptionalAction, default=True, help="PostgreSQL for the largest size")
    ap.add_argument("--quick", action="store_true", help="CI: sizes 200,800,2400, tiny backbone, budget 200")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    if a.quick:
        a.sizes, a.train, a.budget = "200,800,2400", "quick", a.budget or 200
    from litellm_energy_router.training.sampling import TrainingBudget

    budget = a.budget or TrainingBudget().max_queries
    sizes = sorted(int(s) for s in a.sizes.split(","))
    work = Path(a.workdir or tempfile.mkdtemp(prefix="er-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    base = _base_rows()
    print(f"bundled rows: {len(base[1])} queries; budget {budget} training queries; training {a.train}; work {work}")
    print(
        f"{'queries':>8} {'backend':>8} {'runs':>8} {'build_s':>8} {'retrain_s':>9} {'cpu_s':>7} {'peak_rss_mb':>11} "
        f"{'rows_read':>9} {'trained':>7}  stages"
    )
    results = []
    for n in sizes:
        pg = a.pg and n == sizes[-1]
        db = work / f"table-{n}.db"
        for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            f.unlink(missing_ok=True)
        url, drop = _pg_db() if pg else (f"sqlite:///{db}", lambda: None)
        try:
            t0 = time.time()
            runs = build_table(url, n, base)
            build_s = time.time() - t0
            r = run_one(url, work / f"ck-{n}", a.train == "quick", budget, str(work / "embed-cache"))
        finally:
            drop()
        peak = r["timings"]["peak_rss_mb"]
        stages = ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in r["timings"]["stages"].items())
        print(
            f"{n:>8} {'postgres' if pg else 'sqlite':>8} {runs:>8} {build_s:>8.0f} {r['wall_s']:>9.1f} {r['cpu_s']:>7.0f} {peak:>11.0f} "
            f"{r['rows_read']:>9} {r['train_queries']:>7}  {stages}",
            flush=True,
        )
        results.append((n, r["wall_s"], peak, r["cpu_s"]))
    lo = results[1] if len(results) > 2 else results[0]  # 10k of 2k, 10k, 30k, 100k
    hi = results[-1]
    slope = lambda i: math.log(hi[i] / lo[i]) / math.log(hi[0] / lo[0]) if hi[0] != lo[0] else float("nan")  # noqa: E731
    z = slope(1)
    print(
        f"log-log slope between {lo[0]} and {hi[0]} queries: wall time {z:.3f}, CPU time {slope(3):.3f} "
        "(CPU time is the steadier one on a shared machine)"
    )
    print(f"queries={hi[0]} retrain_s={hi[1]:.1f} peak_rss_mb={hi[2]:.0f} time_exponent={z:.3f}")


if __name__ == "__main__":
    main()
