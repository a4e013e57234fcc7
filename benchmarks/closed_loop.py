"""Closed-loop benchmark: does production traffic of a task the table has never seen improve the router?

    python benchmarks/closed_loop.py [--quick] [--workdir DIR] [--task mbpp]

1. **Start**: a SQLite table of the bundled RouterBench rows **without one task** (default ``mbpp``: the
   one code task, unlike the multiple-choice arc-challenge and winogrande left in the table, so nothing in
   the table tells the router how each model does on it: on the held-out queries the most accurate model
   on mbpp is mixtral-8x7b (0.57) while on the other tasks it is Yi-34B (0.82, and 0.33 on mbpp), so
   routing mbpp like the rest loses accuracy that only mbpp feedback can reveal; and with 299 queries
   its traffic fits the time budget), minus a held-out share of every task used only for evaluation. ``retrain`` trains the first
   router on it.
2. **Loop** (three arms, each with its own copy of the table and its own checkpoints):

   * ``loop``: the task's training queries are replayed as production traffic through a real
     ``litellm.Router`` + :class:`EnergyRoutingStrategy` (``router.epsilon`` exploration, propensities and
     the router version logged) + :class:`EnergyLogger` (estimated energy), answered by a local
     OpenAI-compatible server on 127.0.0.1 replaying the recorded answers; every served call gets the
     recorded correctness of the served candidate through the feedback API (``apply_feedback``); the real
     ``run_retrain`` runs every ``retrain_every`` requests (its ``train:`` config from :class:`LoopConfig`).
   * ``(a) production ignored``: the same loop, retraining with sources without ``production``.
   * ``(b) tournament rows``: no serving; the same queries' complete rows (every candidate, recorded
     correctness, estimated J) are added as ``tournament`` rows before each retrain: what full feedback
     would teach.

3. After each retrain: accuracy, J/query (at the serving λ, queries scored without a task tag as
   serving scores them) and AIQ of each arm's serving checkpoint on the held-out queries of the new task
   and pooled over all tasks. Ends with the new-task gain of ``loop`` over ``(a)`` and its paired bootstrap
   95 % interval over the held-out queries.

Energy is **estimated** throughout (bundled ML.ENERGY H100 profile x token counts); nothing is measured.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import _offline  # noqa: F401  (before LiteLLM is imported)
from closed_loop_scores import Scores, gain, load_eval, score_checkpoint, table_lines, task_lines
from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench, iter_records, parse_files
from litellm_energy_router.training.data import holdout_split
from litellm_energy_router.training.ope import version_counts
from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
from litellm_energy_router.training.train_config import TrainSection

from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
from litellm_energy_router.demo.loop import label_production
from litellm_energy_router.demo.serve import serve
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.router.checkpoint import point_to, read_manifest, resolve
from litellm_energy_router.settings import Settings
from litellm_energy_router.table import open_store

ALL_SOURCES = ["import", "tournament", "shadow", "production"]
ARMS = ("loop", "ignored", "tournament")


@dataclass
class LoopConfig:
    """What one benchmark run does (defaults: the full run, ~10 min on 2 shared cores).

    Attributes:
        task: the task the starting table lacks (``mbpp``, ``arc-challenge`` or ``winogrande``).
        eval_fraction: share of the new task's queries held out for evaluation (never served).
        pooled_eval_fraction: share of the other tasks' queries held out of the table for evaluation.
        base_fraction: share of the other tasks' remaining queries in the starting table (1: all).
        served: new-task queries replayed as production traffic (at most the task's training share).
        retrain_every: served requests between retrains.
        lam: the serving knob λ (accuracy per 100 J), also the evaluation's.
        epsilon: exploration rate of the served router (every production row gets a propensity > 0).
        concurrency: requests in flight.
        bootstrap: resamples of the held-out queries for the gain's interval.
        rule, tolerance: the retrain's promotion gate (``RetrainConfig.rule``/``tolerance``), as production runs it.
        train: the retrain's ``train:`` section (:class:`~training.train_config.TrainSection`).
        seed: order of the served queries.
    """

    task: str = "mbpp"
    eval_fraction: float = 0.3
    pooled_eval_fraction: float = 0.15
    base_fraction: float = 0.5
    served: int = 207
    retrain_every: int = 69
    lam: float = 0.22
    epsilon: float = 0.1
    concurrency: int = 8
    bootstrap: int = 2000
    seed: int = 0
    rule: str = "both"
    tolerance: float = 0.0
    # cheap training: a minimal LM (a fifth of an epoch) whose calibration leans on the probe head (MiniLM
    # embeddings), served by the distilled student (numpy): ~1 min per retrain on 2 busy cores
    train: dict[str, Any] = field(
        default_factory=lambda: {
            "backbone": {"name": "tiny", "hidden_size": 32, "layers": 1, "vocab_size": 256},
            "sft": {"epochs": 0.2, "batch_size": 32},
            "max_len": 48,
            "student": True,
        }
    )

    @classmethod
    def quick(cls) -> "LoopConfig":
        """A smoke run: a small table, 2 retrains after 12 requests each."""
        return cls(base_fraction=0.12, served=24, retrain_every=12, bootstrap=200)


# -- data --------------------------------------------------------------------------------------------------


@dataclass
class Split:
    records: dict[str, Any]  # query id -> RouterBench record
    base: set[str]  # the starting table (other tasks)
    served: list[str]  # new-task queries replayed as traffic, in order
    eval_new: set[str]
    eval_other: set[str]


def split_queries(cfg: LoopConfig) -> Split:
    recs = {r.query_id: r for r in iter_records(bundled_files())}
    tasks = sorted({r.task for r in recs.values()})
    if cfg.task not in tasks:
        raise SystemExit(f"--task {cfg.task!r}: not a bundled task (one of {tasks})")
    new = sorted(q for q, r in recs.items() if r.task == cfg.task)
    other = sorted(q for q, r in recs.items() if r.task != cfg.task)
    tr, te = holdout_split(new, cfg.eval_fraction, salt="closed-loop")
    otr, ote = holdout_split(other, cfg.pooled_eval_fraction, salt="closed-loop")
    base = [other[i] for i in otr]
    if cfg.base_fraction < 1:
        base = [base[i] for i in holdout_split(base, cfg.base_fraction, salt="closed-loop-base")[1]]
    served = [new[i] for i in tr]
    random.Random(cfg.seed).shuffle(served)
    return Split(recs, set(base), served[: cfg.served], {new[i] for i in te}, {other[i] for i in ote})


def import_rows(url: str, keep: set[str]) -> None:
    store = open_store(url)
    try:
        import_routerbench(store, bundled_files(), load_profile(), keep=lambda q: q in keep)
    finally:
        store.close()


def add_tournament_rows(url: str, ids: set[str]) -> int:
    """The complete rows of ``ids`` (every candidate), as ``tournament`` rows."""
    cands, queries, runs, _ = parse_files(bundled_files(), load_profile(), keep=lambda q: q in ids)
    q2 = [q.model_copy(update={"source": "tournament"}) for q in queries]
    r2 = [r.model_copy(update={"source": "tournament"}) for r in runs]
    store = open_store(url)
    try:
        store.write(q2, r2, candidates=cands)
    finally:
        store.close()
    return len(r2)


# -- one arm ------------------------------------------------------------------------------------------------


@dataclass
class Arm:
    name: str
    dir: Path
    cfg: LoopConfig
    retrains: list[str] = field(default_factory=list)  # status of each retrain

    @property
    def url(self) -> str:
        return f"sqlite:///{self.dir / 'table.db'}"

    @property
    def pointer(self) -> Path:
        return self.dir / "router.json"

    def start(self, base_db: Path, first_checkpoint: Path) -> "Arm":
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(base_db, self.dir / "table.db")
        point_to(self.pointer, first_checkpoint)
        return self

    def retrain(self) -> str:
        sources = [s for s in ALL_SOURCES if s != "production"] if self.name == "ignored" else ALL_SOURCES
        rc = RetrainConfig(
            table_url=self.url,
            pointer=self.pointer,
            versions_dir=self.dir / "versions",
            keep=3,
            min_new_rows=0,
            sources=sources,
            lam=self.cfg.lam,
            epsilon=self.cfg.epsilon,
            rule=self.cfg.rule,
            tolerance=self.cfg.tolerance,
            train=TrainSection.model_validate(self.cfg.train),
        )
        with open(self.dir / "retrain.log", "a") as fh:  # the retrain's own progress lines, per arm
            res = run_retrain(rc, log=lambda s: print(f"{time.strftime('%H:%M:%S')} {s}", file=fh, flush=True))
        self.retrains.append(res.status)
        return res.status

    def settings(self) -> Settings:
        return Settings.model_validate(
            {
                "table": {"url": self.url},
                "knob": {"lambda": self.cfg.lam},
                "energy": {"meter": "estimate"},
                "router": {"checkpoint": str(self.pointer), "epsilon": self.cfg.epsilon, "timeout_ms": 10000},
                "privacy": {"store_text": True},  # retrain re-reads the served queries' text
                "writer": {"spool_dir": str(self.dir / "spool"), "flush_interval_s": 0.1},
            }
        )

    def serve(self, records: list[Any], candidates: list[str]) -> dict[str, Any]:
        """Replay ``records`` as production traffic, then label every served call via the feedback API."""
        import torch

        threads = torch.get_num_threads()
        with LocalBackend(ReplayAnswers(records)) as backend:
            calls, counts = serve(
                [r.prompt for r in records],
                candidates,
                backend.base_url,
                self.settings(),
                concurrency=self.cfg.concurrency,
            )
            grade = backend.answers.grade
        torch.set_num_threads(threads)  # the serving runtime pins torch to one thread; training wants them all
        rows = label_production(self.url, calls, lambda i, c: grade(records[i].prompt, c))
        return {"served": len(calls), "written": counts["written"], "rows": list(rows.values())}


# -- evaluation ---------------------------------------------------------------------------------------------


# -- the run ------------------------------------------------------------------------------------------------


def _first_router(cfg: LoopConfig, workdir: Path, base_db: Path) -> Path:
    first = Arm("first", workdir / "first", cfg)
    first.dir.mkdir(parents=True)
    shutil.copy(base_db, first.dir / "table.db")
    if first.retrain() != "promoted":
        raise SystemExit("the first training did not promote a checkpoint")
    return resolve(first.pointer)


def _step(arms: dict[str, Arm], split: Split, done: int, batch: list[str], candidates: list[str]) -> dict[str, str]:
    records = [split.records[q] for q in batch]
    status, notes = {}, []
    for name in ("loop", "ignored"):
        served = arms[name].serve(records, candidates)
        prod = served["rows"]  # every production row so far
        notes.append(
            f"{name}: {served['served']} served; production rows so far: {len(prod)}, "
            f"{sum(r['score'] is not None for r in prod)} labelled, {sum(r['propensity'] is not None for r in prod)} "
            f"with a propensity; by router version {version_counts(prod)}"
        )
        status[name] = arms[name].retrain()
    add_tournament_rows(arms["tournament"].url, set(split.served[: done + len(batch)]))
    status["tournament"] = arms["tournament"].retrain()
    for n in notes:
        print("  " + n)
    return status


def run(cfg: LoopConfig, workdir: Path) -> dict[str, Any]:
    t0 = time.time()
    split = split_queries(cfg)
    base_db = workdir / "base.db"
    import_rows(f"sqlite:///{base_db}", split.base)
    import_rows(f"sqlite:///{workdir / 'eval.db'}", split.eval_new | split.eval_other)
    m_eval = load_eval(f"sqlite:///{workdir / 'eval.db'}")
    new_mask = m_eval.tasks == cfg.task
    print(
        f"closed loop: table of {len(split.base)} queries without {cfg.task}; {len(split.served)} {cfg.task} queries "
        f"served in steps of {cfg.retrain_every}; λ={cfg.lam:g}, ε={cfg.epsilon:g}; energy ESTIMATED (profile x tokens)"
    )
    for line in task_lines(m_eval, cfg.task):
        print(line)
    ck = _first_router(cfg, workdir, base_db)
    candidates = list(read_manifest(ck).candidates)
    arms = {a: Arm(a, workdir / a, cfg).start(base_db, ck) for a in ARMS}
    s0 = score_checkpoint(arms["loop"].pointer, m_eval, new_mask, cfg.lam)
    print(f"\nstep 0 (first router, trained without {cfg.task}; {time.time() - t0:.0f}s)")
    print("\n".join(table_lines({a: s0 for a in ARMS}, {}, new_mask, cfg.task)))
    scores: dict[str, Scores] = {}
    steps = range(0, len(split.served), cfg.retrain_every)
    for k, done in enumerate(steps, 1):
        batch = split.served[done : done + cfg.retrain_every]
        print(f"\nstep {k}/{len(steps)}: {len(batch)} {cfg.task} requests (total {done + len(batch)}), then retrain")
        status = _step(arms, split, done, batch, candidates)
        scores = {a: score_checkpoint(arms[a].pointer, m_eval, new_mask, cfg.lam) for a in ARMS}
        print("\n".join(table_lines(scores, status, new_mask, cfg.task)) + f"\n  ({time.time() - t0:.0f}s)")
    d, r, (lo_d, hi_d, lo_r, hi_r) = gain(scores["loop"], scores["ignored"], new_mask, cfg.bootstrap, cfg.seed)
    db, rb, (lo_db, hi_db, _, _) = gain(scores["tournament"], scores["ignored"], new_mask, cfg.bootstrap, cfg.seed)
    print(
        f"\n(b) tournament rows vs production ignored: new-task acc {db:+.3f} [{lo_db:+.3f}, {hi_db:+.3f}] at J ratio {rb:.2f}"
    )
    print(
        f"wall time {time.time() - t0:.0f}s; paired bootstrap over {int(new_mask.sum())} held-out {cfg.task} queries, "
        f"{cfg.bootstrap} resamples: acc difference 95% [{lo_d:+.3f}, {hi_d:+.3f}], J ratio 95% [{lo_r:.2f}, {hi_r:.2f}]"
        + (" (inside the interval: a tie)" if lo_d <= 0 <= hi_d else "")
    )
    print(f"closed-loop gain: new-task acc {d:+.3f} at J ratio {r:.2f} vs production-ignored")
    return {
        "acc_gain": d,
        "j_ratio": r,
        "acc_ci": (lo_d, hi_d),
        "j_ratio_ci": (lo_r, hi_r),
        "seconds": time.time() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (small table, 2 short retrains)")
    ap.add_argument("--task", default=None, help="the task the starting table lacks (default mbpp)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep tables and checkpoints here (must not exist)")
    args = ap.parse_args(argv)
    cfg = LoopConfig.quick() if args.quick else LoopConfig()
    if args.task:
        cfg = replace(cfg, task=args.task)
    warnings.filterwarnings("ignore")
    logging.getLogger("litellm_energy_router").setLevel(logging.ERROR)
    import tempfile

    if args.workdir is not None:
        if args.workdir.exists():
            raise SystemExit(f"--workdir {args.workdir}: exists; pass a new directory")
        args.workdir.mkdir(parents=True)
        run(cfg, args.workdir)
        return 0
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        run(cfg, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
