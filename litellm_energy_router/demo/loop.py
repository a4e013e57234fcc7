"""The demo loop: import → train → serve → label → retrain → compare. See :func:`run_demo`.

Every energy number of the demo is an **estimate**: the bundled ML.ENERGY H100 profile (J per prompt
token, J per output token) × the cl100k token counts of the replayed answers, ``energy_method=estimate``.
Nothing is measured on a GPU.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.table import Run, open_store

Out = Callable[[str], None]

DEFAULT_LAMBDA = (
    0.22  # accuracy per 100 J; mid-curve on the bundled rows: most of the accuracy for a fraction of the joules
)
DEFAULT_EPSILON = 0.05  # exploration rate of the served traffic (every production row gets a propensity)
DEFAULT_CONCURRENCY = 8  # requests in flight
# The demo's training budget (docs/demo.md, "Training budget"): the default TrainConfig with SFT cut to one epoch
# (it trains 4: 150-200 s per training on 2 idle cores), and the retrain warm-started from the serving
# checkpoint on the new queries plus as many replayed old ones (retrain.warm_start). `--full-training`
# runs the long configuration instead (the default TrainConfig, retrain from scratch).
DEMO_SFT_EPOCHS = 1.0
DEMO_WARM_RETRAIN = True
ENERGY_NOTE = (
    "ESTIMATED joules: bundled ML.ENERGY H100 profile (J/prompt token, J/output token) x cl100k token "
    "counts of the replayed answers (energy_method=estimate); nothing here is measured on a GPU"
)
MARKER = "demo.json"


class DemoError(ValueError):
    """The demo cannot run as asked; one line naming the path or option."""


@dataclass
class DemoConfig:
    """What ``energy-router demo`` runs.

    Attributes:
        db: table URL (the demo's own table: it must be empty or left by an earlier demo run).
        workdir: checkpoints, pointer, retrain reports, ``pareto.png``, ``summary.json``.
        quick: tiny training (``TrainConfig.quick()``) and ``quick_queries`` served queries.
        full_training: the long training: the default ``TrainConfig()`` (4 SFT epochs) and a retrain from
            scratch, instead of :data:`DEMO_SFT_EPOCHS` epochs and a warm-started retrain.
        lam: λ of the served traffic (energy weight; ``None`` = :data:`DEFAULT_LAMBDA`).
        epsilon: exploration rate of the strategy (so every production row has a propensity).
        concurrency: requests in flight.
        holdout_fraction: share of the bundled queries held back from the table and served instead.
        shadow_fraction: share of served queries that also get replayed shadow rows for every candidate.
        quick_queries: served queries in quick mode.
        quick_import_fraction: share of the not-held-back queries imported in quick mode (stable hash).
    """

    db: str = "sqlite:///energy_router_demo.db"
    workdir: Path = Path("energy_router_demo")
    quick: bool = False
    full_training: bool = False
    lam: float | None = None
    epsilon: float = DEFAULT_EPSILON
    concurrency: int = DEFAULT_CONCURRENCY
    holdout_fraction: float = 0.2
    shadow_fraction: float = 1.0
    quick_queries: int = 100
    quick_import_fraction: float = 0.25

    @property
    def lam_value(self) -> float:
        return DEFAULT_LAMBDA if self.lam is None else float(self.lam)

    def check(self) -> None:
        if not self.db.startswith(("sqlite:", "postgresql")):
            raise DemoError(f"--db {self.db!r}: must start with sqlite:/// or postgresql")
        if self.lam is not None and not (self.lam >= 0 and np.isfinite(self.lam)):
            raise DemoError(f"--lambda {self.lam!r}: must be a number >= 0")
        if not 0 <= self.epsilon <= 1:
            raise DemoError(f"--epsilon {self.epsilon!r}: must be in [0, 1]")
        if self.concurrency < 1:
            raise DemoError(f"--concurrency {self.concurrency!r}: must be >= 1")
        if not 0 <= self.shadow_fraction <= 1:
            raise DemoError(f"shadow_fraction {self.shadow_fraction!r}: must be in [0, 1]")
        if self.quick and self.full_training:
            raise DemoError("--quick and --full-training: choose one")

    @property
    def pointer(self) -> Path:
        return self.workdir / "router.json"

    @property
    def versions(self) -> Path:
        return self.workdir / "versions"


# -- workdir and table -----------------------------------------------------------------------------------


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


# -- retrain ---------------------------------------------------------------------------------------------


def retrain_config(cfg: DemoConfig) -> Any:
    """The demo's :class:`~litellm_energy_router.training.retrain.RetrainConfig`: its training budget
    (:data:`DEMO_SFT_EPOCHS`, :data:`DEMO_WARM_RETRAIN`) unless ``full_training`` or ``quick``."""
    from litellm_energy_router.training.retrain import RetrainConfig
    from litellm_energy_router.training.train_config import SFTSection, TrainSection

    short = not (cfg.full_training or cfg.quick)
    return RetrainConfig(
        table_url=cfg.db,
        pointer=cfg.pointer,
        versions_dir=cfg.versions,
        keep=5,
        min_new_rows=1,
        quick=cfg.quick,
        rule="both",
        holdout_fraction=0.2,
        lam=cfg.lam_value,
        epsilon=cfg.epsilon,
        warm_start=DEMO_WARM_RETRAIN and not cfg.full_training,
        train=TrainSection(sft=SFTSection(epochs=DEMO_SFT_EPOCHS)) if short else TrainSection(),
    )


def retrain_once(cfg: DemoConfig, out: Out) -> Any:
    """One cron-style retrain (a :class:`~litellm_energy_router.training.retrain.RetrainResult`): with no
    serving checkpoint it trains and promotes the first version; later it trains on the new rows and
    promotes only a better checkpoint."""
    from litellm_energy_router.training.retrain import run_retrain

    return run_retrain(
        retrain_config(cfg), log=lambda s: out(f"  {s}" + ("  [J estimated]" if re.search(r"\d J\b", s) else ""))
    )


# -- labels ----------------------------------------------------------------------------------------------


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


def summary_json(path: Path, data: dict[str, Any]) -> None:
    def conv(o: Any) -> Any:
        if isinstance(o, (np.floating, np.integer)):
            return o.item()
        if isinstance(o, Path):
            return str(o)
        if hasattr(o, "__dataclass_fields__"):
            return asdict(o)
        raise TypeError(type(o).__name__)

    path.write_text(json.dumps(data, indent=2, default=conv))


# -- the loop --------------------------------------------------------------------------------------------


def _served_matrices(recs: list[Any], candidates: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt tokens[n], completion tokens[n, K], correctness Y[n, K], estimated J E[n, K]) of the records."""
    from litellm_energy_router.tokens import count_prompt_tokens

    profile = load_profile()
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


def _serving_settings(cfg: DemoConfig) -> Any:
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


def run_demo(cfg: DemoConfig, out: Out = print) -> dict[str, Any]:
    """Run the whole loop; print progress and the comparison through ``out`` (a line at least every few
    seconds in every stage: :class:`~litellm_energy_router.training.progress.Heartbeat`); return the
    summary (also written to ``<workdir>/summary.json``)."""
    from litellm_energy_router.training.progress import heartbeat

    cfg.check()
    out(
        f"energy-router demo{' --quick' if cfg.quick else ''}{' --full-training' if cfg.full_training else ''}: "
        f"table {cfg.db}, workdir {cfg.workdir} (loading torch, transformers and LiteLLM ...)"
    )
    with heartbeat(out) as hb:
        return _run(cfg, hb)


def held_back(cfg: DemoConfig) -> tuple[list[Any], list[Any]]:
    """(all bundled records, the held-back ones: stable hash of the query id, salt ``demo``)."""
    from litellm_energy_router.profiling.routerbench import bundled_files, iter_records
    from litellm_energy_router.training.data import holdout_split

    records = list(iter_records(bundled_files()))
    _, test_idx = holdout_split([r.query_id for r in records], cfg.holdout_fraction, salt="demo")
    return records, [records[i] for i in test_idx]


def _import(cfg: DemoConfig, out: Out) -> tuple[Any, list[Any], list[Any]]:
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


def _training_line(cfg: DemoConfig) -> str:
    if cfg.quick:
        return "[2/6] training the quick router on the table (tiny backbone, seconds) ..."
    if cfg.full_training:
        return "[2/6] training the router on the table (--full-training: the default TrainConfig, 4 SFT epochs; minutes) ..."
    return f"[2/6] training the router on the table (the default TrainConfig with {DEMO_SFT_EPOCHS:g} SFT epoch; about a minute on 2 cores) ..."


def _serve(
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
            _serving_settings(cfg),
            concurrency=cfg.concurrency,
            progress=progress,
        )
        grade = backend.answers.grade
        unknown = backend.answers.unknown
    torch.set_num_threads(threads)  # the serving runtime pins torch to one thread; training wants them all
    return calls, counts, grade, unknown


def _label(
    cfg: DemoConfig, calls: list[Any], serve_recs: list[Any], candidates: list[str], grade: Any
) -> tuple[list[dict], int, tuple]:
    """Step 4: feedback on every production row, replayed shadow rows for every candidate. Returns the
    production rows (in served order), the shadow rows written and the served queries' matrices."""
    rows = label_production(cfg.db, calls, lambda i, c: grade(serve_recs[i].prompt, c))
    pt, ct, Y, E = _served_matrices(serve_recs, candidates)
    n_shadow = int(round(cfg.shadow_fraction * len(calls)))
    shadow_q = [rows[c.call_id]["query_id"] for c in calls[:n_shadow]]
    hw = {c: load_profile().get(c).hardware for c in candidates}
    runs = [
        Run(
            query_id=q,
            candidate=c,
            source="shadow",
            score=float(Y[i, k]),
            prompt_tokens=int(pt[i]),
            completion_tokens=int(ct[i, k]),
            energy_j=float(E[i, k]),
            energy_method="estimate",
            gpu=hw[c],
        )
        for i, q in enumerate(shadow_q)
        for k, c in enumerate(candidates)
    ]
    store = open_store(cfg.db)
    try:
        store.write(runs=runs)
    finally:
        store.close()
    return [rows[c.call_id] for c in calls], len(runs), (pt, ct, Y, E)


def _run(cfg: DemoConfig, hb: Any) -> dict[str, Any]:
    from litellm_energy_router.demo import compare
    from litellm_energy_router.router.checkpoint import read_manifest
    from litellm_energy_router.training.progress import Timings

    out = hb.out
    hb.set_stage("[0/6] loading libraries")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # library deprecation notices, not the demo's business
    t_start = t = time.time()
    tm = Timings()
    prepare(cfg, out)
    out(f"note: {ENERGY_NOTE}")

    hb.set_stage("[1/6] import")
    imp, held, serve_recs = _import(cfg, out)
    t = tm.mark("import", t)

    # 2. train the first router (retrain with no serving checkpoint trains and promotes the first version)
    hb.set_stage("[2/6] training")
    out(_training_line(cfg))
    first = retrain_once(cfg, out)
    if first.status != "promoted" or first.checkpoint is None:
        raise DemoError(f"{cfg.pointer}: first training did not promote a checkpoint (status {first.status})")
    candidates = list(read_manifest(first.checkpoint).candidates)
    out(f"      serving checkpoint {first.version}: {first.checkpoint}")
    t = tm.mark("train", t)

    hb.set_stage("[3/6] serving")
    out(
        f"[3/6] serving {len(serve_recs)} held-back queries through litellm.Router (6 replay deployments, "
        f"energy strategy λ={cfg.lam_value:g} ε={cfg.epsilon:g}, EnergyLogger with the estimate meter), concurrency {cfg.concurrency} ..."
    )
    calls, counts, grade, unknown = _serve(cfg, hb, serve_recs, candidates)
    t_serve = time.time() - t
    out(
        f"      {len(calls)} responses in {t_serve:.1f}s ({len(calls) / max(t_serve, 1e-9):.0f} req/s); callback wrote "
        f"{counts['written']} rows ({counts['spooled']} spooled); replay misses {unknown}"
    )
    t = tm.mark("serve", t)

    hb.set_stage("[4/6] labels")
    prod, n_shadow_rows, (pt, _, Y, E) = _label(cfg, calls, serve_recs, candidates, grade)
    with_prop = sum(r["propensity"] is not None for r in prod)
    out(
        f"[4/6] feedback: {sum(r['score'] is not None for r in prod)}/{len(prod)} production rows labelled with the recorded "
        f"correctness of the served answer ({with_prop} with a propensity); {n_shadow_rows} replayed shadow rows "
        f"({n_shadow_rows // max(len(candidates), 1)} queries x {len(candidates)} candidates, recorded correctness, estimated J)"
    )
    t = tm.mark("label", t)

    hb.set_stage("[5/6] retrain")
    out(
        "[5/6] retrain on the grown table (import + production + shadow rows"
        + (
            "; warm start from the serving checkpoint: the new queries plus as many replayed old ones"
            if retrain_config(cfg).warm_start
            else ""
        )
        + ") ..."
    )
    second = retrain_once(cfg, out)
    out(
        f"      retrain: {second.status}"
        + (f", version {second.version}" if second.version else "")
        + (f", report {second.report_md}" if second.report_md else "")
    )
    t = tm.mark("retrain", t)

    hb.set_stage("[6/6] compare")
    served = compare.served_point(prod, cfg.lam_value)
    served.name = f"energy router, served (λ={cfg.lam_value:g}, ε={cfg.epsilon:g})"
    base = compare.baselines(Y, E, candidates)
    sweep = compare.router_sweep(first.checkpoint, [r.prompt for r in serve_recs], pt, Y, E, cfg.lam_value)
    head = compare.Headline.of(prod, Y, E, base, sweep)
    pareto = compare.write_plot(cfg.workdir / "pareto.png", served, base, sweep, Y, E, candidates)
    t = tm.mark("compare", t)
    out("[6/6] served traffic vs baselines on the same held-back queries")
    out(f"note: {ENERGY_NOTE}")
    for line in [
        *compare.comparison_lines(served, base, sweep, len(prod), cfg.lam_value, cfg.epsilon),
        *compare.sweep_lines(sweep, candidates),
        *head.lines(served, base),
    ]:
        out(line)
    wall = time.time() - t_start
    out(f"pareto plot: {pareto.resolve()}")
    out(f"summary: {(cfg.workdir / 'summary.json').resolve()}")
    out(tm.line(wall))
    curve = sweep.evaluation.method("router").curve
    summary = {
        "db": cfg.db,
        "workdir": str(cfg.workdir),
        "quick": cfg.quick,
        "full_training": cfg.full_training,
        "lambda": cfg.lam_value,
        "epsilon": cfg.epsilon,
        "energy_method": "estimate",
        "energy_note": ENERGY_NOTE,
        "candidates": candidates,
        "imported_queries": imp.queries,
        "held_back_queries": len(held),
        "served_queries": len(prod),
        "production_rows_with_propensity": with_prop,
        "shadow_rows": n_shadow_rows,
        "served": served.as_dict(),
        "router_no_exploration": sweep.at_lambda.as_dict(),
        "baselines": {k: p.as_dict() for k, p in base.items()},
        "headline": head.as_dict(),
        "router_curve": {
            "version": sweep.version,
            "lambda": curve.knob.tolist(),
            "accuracy": curve.accuracy.tolist(),
            "energy_j": curve.energy_j.tolist(),
            "aiq": sweep.evaluation.method("router").aiq,
            "aiq_static_hull": sweep.evaluation.method("zero router (static hull)").aiq,
        },
        "first_version": {"status": first.status, "version": first.version, "checkpoint": first.checkpoint},
        "retrain": {
            "status": second.status,
            "version": second.version,
            "checkpoint": second.checkpoint,
            "report": second.report_md,
            "comparison": second.details.get("comparison"),
        },
        "pareto_png": pareto.resolve(),
        "wall_s": round(wall, 1),
        "steps_s": tm.steps,
        "cpu_s": tm.cpu,
    }
    summary_json(cfg.workdir / "summary.json", summary)
    return summary
