"""The demo loop's steps on the table: a clean start (:func:`prepare`), the import of the bundled rows
minus the held-back queries, serving those through litellm.Router, and their labels (feedback on the
production rows, replayed shadow rows). :mod:`litellm_energy_router.demo.loop` runs them in order.

Every energy number here is an **estimate** (bundled profile x cl100k token counts, ``energy_method=estimate``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from litellm_energy_router.demo.config import MARKER, DemoConfig, DemoError, Out
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.table import Run, open_store


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///") :])
    return None


def prepare(cfg: DemoConfig, out: Out) -> None:
    """Start from an empty table and a clean workdir. What an earlier demo run left (its marker in the
    workdir names the table) is removed; any other non-empty table, or checkpoints in a workdir no demo
    run made, are refused."""
    marker = cfg.workdir / MARKER
    try:
        marker_db = json.loads(marker.read_text()).get("db") if marker.exists() else None
    except (ValueError, AttributeError):
        marker_db = None
    db_path = _sqlite_path(cfg.db)
    if db_path is not None:
        db_path.parent.mkdir(parents=True, exist_ok=True)  # the demo's own SQLite file may name a new directory
    store = open_store(cfg.db)
    try:
        n = store.count_runs()
    finally:
        store.close()
    if n and marker_db != cfg.db:
        raise DemoError(
            f"--db {cfg.db}: the table already holds {n} runs not written by a demo run in {cfg.workdir}; "
            "the demo needs its own table (pass another --db)"
        )
    if marker_db is None and (cfg.pointer.exists() or cfg.versions.exists()):
        raise DemoError(f"--workdir {cfg.workdir}: holds router checkpoints no demo run wrote; pass another --workdir")
    if n:
        path = _sqlite_path(cfg.db)
        if path is None:
            raise DemoError(
                f"--db {cfg.db}: holds an earlier demo run; the demo only resets SQLite tables (empty it or pass another --db)"
            )
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        out(f"removed the earlier demo run's table {path}")
    if marker_db is not None:
        for p in (cfg.versions, cfg.workdir / "spool", cfg.workdir / "retrain"):
            shutil.rmtree(p, ignore_errors=True)
        for f in (cfg.pointer, cfg.workdir / "pareto.png", cfg.workdir / "summary.json"):
            f.unlink(missing_ok=True)
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"db": cfg.db, "started": time.time()}))


def label_production(
    db: str, served: list[Any], grade: Callable[[int, str], float | None]
) -> dict[str, dict[str, Any]]:
    """Feedback for every served call: its production row's score := the recorded correctness of the
    served candidate (``grade(index, candidate)``). Returns the production rows by call id, as labelled."""
    from litellm_energy_router.feedback import apply_feedback

    store = open_store(db)
    try:
        rows = {r["call_id"]: r for r in store.iter_runs(sources=["production"])}
        for s in served:
            r = rows.get(s.call_id)
            if r is None:
                raise DemoError(f"table {db}: no production row for call {s.call_id} (the callback did not record it)")
            score = grade(s.index, r["candidate"])
            if score is not None:
                apply_feedback(store, s.call_id, score)
        return {r["call_id"]: r for r in store.iter_runs(sources=["production"])}
    finally:
        store.close()


def served_matrices(
    recs: list[Any], candidates: list[str], profile: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt tokens[n], completion tokens[n, K], correctness Y[n, K], estimated J E[n, K]) of the records
    (``profile``: the energy profile, default the bundled one)."""
    from litellm_energy_router.tokens import count_prompt_tokens

    profile = profile or load_profile()
    pt = np.array([count_prompt_tokens(r.prompt) for r in recs], dtype=np.int64)
    ct = np.array([[count_prompt_tokens(r.answers[c][1]) for c in candidates] for r in recs], dtype=np.int64)
    Y = np.array([[r.answers[c][0] for c in candidates] for r in recs], dtype=np.float64)
    E = np.array(
        [
            [profile.estimate_j(c, int(pt[i]), int(ct[i, k])) for k, c in enumerate(candidates)]
            for i in range(len(recs))
        ],
        dtype=np.float64,
    )
    return pt, ct, Y, E


def write_shadow_rows(
    db: str, prod_rows: list[dict[str, Any]], mats: tuple, candidates: list[str], profile: Any = None
) -> int:
    """Replayed shadow rows: for each production row (as the table holds it) and its query's row of ``mats``
    (:func:`served_matrices`), one run per candidate (``source=shadow``, recorded correctness, estimated J)
    carrying the production row's context, as a shadow tournament writes them. Returns the rows written."""
    pt, ct, Y, E = mats
    profile = profile or load_profile()
    hw = {c: profile.get(c).hardware for c in candidates}
    runs = [
        Run(
            query_id=r["query_id"],
            candidate=c,
            source="shadow",
            score=float(Y[i, k]),
            prompt_tokens=int(pt[i]),
            completion_tokens=int(ct[i, k]),
            energy_j=float(E[i, k]),
            energy_method="estimate",
            gpu=hw[c],
            context=r.get("context"),
        )
        for i, r in enumerate(prod_rows)
        for k, c in enumerate(candidates)
    ]
    store = open_store(db)
    try:
        store.write(runs=runs)
    finally:
        store.close()
    return len(runs)


def serving_settings(cfg: DemoConfig) -> Any:
    from litellm_energy_router.settings import Settings

    return Settings.model_validate(
        {
            "table": {"url": cfg.db},
            "router": {"checkpoint": str(cfg.pointer), "epsilon": cfg.epsilon, "timeout_ms": 5000},
            "knob": {"lambda": cfg.lam_value},
            "energy": {"meter": "estimate"},
            "privacy": {"store_text": True},  # the demo keeps query text so retrain can learn from served queries
            "writer": {"spool_dir": str(cfg.workdir / "spool"), "flush_interval_s": 0.2},
        }
    )


def held_back(cfg: DemoConfig) -> tuple[list[Any], list[Any]]:
    """(all bundled records, the held-back ones: stable hash of the query id, salt ``demo``)."""
    from litellm_energy_router.profiling.routerbench import bundled_files, iter_records
    from litellm_energy_router.training.data import holdout_split

    records = list(iter_records(bundled_files()))
    _, test_idx = holdout_split([r.query_id for r in records], cfg.holdout_fraction, salt="demo")
    return records, [records[i] for i in test_idx]


def import_bundled(cfg: DemoConfig, out: Out) -> tuple[Any, list[Any], list[Any]]:
    """Step 1: import the bundled rows minus the held-back queries. Returns (import result, held-back records, served records)."""
    from litellm_energy_router.profiling.routerbench import (
        bundled_files,
        import_routerbench,
    )
    from litellm_energy_router.training.data import holdout_split

    files = bundled_files()
    records, held = held_back(cfg)
    held_ids = {r.query_id for r in held}
    keep_ids = {r.query_id for r in records} - held_ids
    if cfg.quick:  # a smaller table keeps both quick trainings short
        _, sub = holdout_split(sorted(keep_ids), cfg.quick_import_fraction, salt="demo-quick")
        keep_ids = {sorted(keep_ids)[i] for i in sub}
    store = open_store(cfg.db)
    try:
        imp = import_routerbench(
            store, files, load_profile(), keep=lambda q: q in keep_ids, profile_origin="bundled energy profile"
        )
    finally:
        store.close()
    out(
        f"[1/6] {imp.line(cfg.db)}".replace(
            f"held back {imp.held_back} queries",
            f"held back {len(held)} queries to serve"
            + (f", {imp.held_back - len(held)} left out (--quick)" if cfg.quick else ""),
        )
    )
    return imp, held, held[: cfg.quick_queries] if cfg.quick else held


def serve_held_back(
    cfg: DemoConfig, hb: Any, serve_recs: list[Any], candidates: list[str]
) -> tuple[list[Any], dict[str, int], Any, int]:
    """Step 3: the held-back queries through litellm.Router; a progress line every few seconds."""
    import torch

    from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
    from litellm_energy_router.demo.serve import serve

    n, done, t0 = len(serve_recs), [0], time.time()

    def progress(k: int) -> None:
        done[0] += k
        hb.beat(lambda: f"      served {done[0]}/{n} ({time.time() - t0:.0f} s)")

    threads = torch.get_num_threads()
    with LocalBackend(ReplayAnswers(serve_recs)) as backend:
        calls, counts = serve(
            [r.prompt for r in serve_recs],
            candidates,
            backend.base_url,
            serving_settings(cfg),
            concurrency=cfg.concurrency,
            progress=progress,
        )
        grade = backend.answers.grade
        unknown = backend.answers.unknown
    torch.set_num_threads(threads)  # the serving runtime pins torch to one thread; training wants them all
    return calls, counts, grade, unknown


def label_served(
    cfg: DemoConfig, calls: list[Any], serve_recs: list[Any], candidates: list[str], grade: Any
) -> tuple[list[dict], int, tuple]:
    """Step 4: feedback on every production row, replayed shadow rows for every candidate. Returns the
    production rows (in served order), the shadow rows written and the served queries' matrices."""
    rows = label_production(cfg.db, calls, lambda i, c: grade(serve_recs[i].prompt, c))
    profile = load_profile()
    prod, mats = [rows[c.call_id] for c in calls], served_matrices(serve_recs, candidates, profile)
    n = int(round(cfg.shadow_fraction * len(calls)))
    return prod, write_shadow_rows(cfg.db, prod[:n], tuple(a[:n] for a in mats), candidates, profile), mats
