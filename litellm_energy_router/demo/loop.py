"""The demo loop: import → train → serve → label → retrain → compare. See :func:`run_demo`.

Every energy number of the demo is an **estimate**: the bundled ML.ENERGY H100 profile (J per prompt
token, J per output token) × the cl100k token counts of the replayed answers, ``energy_method=estimate``.
Nothing is measured on a GPU.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from litellm_energy_router.demo.config import (  # noqa: F401 (re-exported)
    DEFAULT_CONCURRENCY,
    DEFAULT_EPSILON,
    DEFAULT_LAMBDA,
    ENERGY_NOTE,
    MARKER,
    DemoConfig,
    DemoError,
    Out,
)
from litellm_energy_router.demo.steps import (  # noqa: F401 (re-exported)
    held_back,
    import_bundled,
    label_production,
    label_served,
    prepare,
    serve_held_back,
)
from litellm_energy_router.demo.steps import served_matrices as _served_matrices  # noqa: F401 (re-exported)

# The demo's training budget (docs/demo.md, "Training budget"): the default TrainConfig with SFT cut to one epoch
# (it trains 4: 150-200 s per training on 2 idle cores), and the retrain warm-started from the serving
# checkpoint on the new queries plus as many replayed old ones (retrain.warm_start). `--full-training`
# runs the long configuration instead (the default TrainConfig, retrain from scratch).
DEMO_SFT_EPOCHS = 1.0
DEMO_WARM_RETRAIN = True


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


# -- the loop --------------------------------------------------------------------------------------------


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


def _training_line(cfg: DemoConfig) -> str:
    if cfg.quick:
        return "[2/6] training the quick router on the table (tiny backbone, seconds) ..."
    if cfg.full_training:
        return "[2/6] training the router on the table (--full-training: the default TrainConfig, 4 SFT epochs; minutes) ..."
    return f"[2/6] training the router on the table (the default TrainConfig with {DEMO_SFT_EPOCHS:g} SFT epoch; about a minute on 2 cores) ..."


def _run(cfg: DemoConfig, hb: Any) -> dict[str, Any]:
    from litellm_energy_router.training.progress import Timings

    out = hb.out
    hb.set_stage("[0/6] loading libraries")
    _quiet_libraries()
    t_start = t = time.time()
    tm = Timings()
    prepare(cfg, out)
    out(f"note: {ENERGY_NOTE}")

    hb.set_stage("[1/6] import")
    imp, held, serve_recs = import_bundled(cfg, out)
    t = tm.mark("import", t)

    # 2. train the first router (retrain with no serving checkpoint trains and promotes the first version)
    hb.set_stage("[2/6] training")
    first, candidates = _train_first(cfg, out)
    t = tm.mark("train", t)

    hb.set_stage("[3/6] serving")
    calls, grade = _serve_step(cfg, hb, serve_recs, candidates, t)
    t = tm.mark("serve", t)

    hb.set_stage("[4/6] labels")
    prod, n_shadow_rows, (pt, _, Y, E) = label_served(cfg, calls, serve_recs, candidates, grade)
    with_prop = sum(r["propensity"] is not None for r in prod)
    out(_label_line(prod, with_prop, n_shadow_rows, candidates))
    t = tm.mark("label", t)

    hb.set_stage("[5/6] retrain")
    second = _retrain_step(cfg, out)
    t = tm.mark("retrain", t)

    hb.set_stage("[6/6] compare")
    cmp = _compare(cfg, first.checkpoint, prod, serve_recs, pt, Y, E, candidates)
    t = tm.mark("compare", t)
    _print_comparison(cfg, cmp, len(prod), candidates, out)
    wall = time.time() - t_start
    out(f"pareto plot: {cmp.pareto.resolve()}")
    out(f"summary: {(cfg.workdir / 'summary.json').resolve()}")
    out(tm.line(wall))
    counts = {
        "imported_queries": imp.queries,
        "held_back_queries": len(held),
        "served_queries": len(prod),
        "production_rows_with_propensity": with_prop,
        "shadow_rows": n_shadow_rows,
    }
    summary = _summary(cfg, candidates, counts, cmp, first, second, wall, tm)
    summary_json(cfg.workdir / "summary.json", summary)
    return summary


def _quiet_libraries() -> None:
    """Step 0: load transformers without its progress bars; library deprecation notices off."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # library deprecation notices, not the demo's business


def _train_first(cfg: DemoConfig, out: Out) -> tuple[Any, list[str]]:
    """Step 2: train and promote the first router. Returns (its retrain result, its candidates)."""
    from litellm_energy_router.router.checkpoint import read_manifest

    out(_training_line(cfg))
    first = retrain_once(cfg, out)
    if first.status != "promoted" or first.checkpoint is None:
        raise DemoError(f"{cfg.pointer}: first training did not promote a checkpoint (status {first.status})")
    candidates = list(read_manifest(first.checkpoint).candidates)
    out(f"      serving checkpoint {first.version}: {first.checkpoint}")
    return first, candidates


def _serve_step(
    cfg: DemoConfig, hb: Any, serve_recs: list[Any], candidates: list[str], t: float
) -> tuple[list[Any], Any]:
    """Step 3: serve the held-back queries (``t``: when the step began) and report the throughput.
    Returns (the served calls, the replay's grader)."""
    out = hb.out
    out(
        f"[3/6] serving {len(serve_recs)} held-back queries through litellm.Router (6 replay deployments, "
        f"energy strategy λ={cfg.lam_value:g} ε={cfg.epsilon:g}, EnergyLogger with the estimate meter), concurrency {cfg.concurrency} ..."
    )
    calls, counts, grade, unknown = serve_held_back(cfg, hb, serve_recs, candidates)
    t_serve = time.time() - t
    out(
        f"      {len(calls)} responses in {t_serve:.1f}s ({len(calls) / max(t_serve, 1e-9):.0f} req/s); callback wrote "
        f"{counts['written']} rows ({counts['spooled']} spooled); replay misses {unknown}"
    )
    return calls, grade


def _label_line(prod: list[dict], with_prop: int, n_shadow_rows: int, candidates: list[str]) -> str:
    """Step 4's report: production rows labelled, with a propensity, and the shadow rows written."""
    return (
        f"[4/6] feedback: {sum(r['score'] is not None for r in prod)}/{len(prod)} production rows labelled with the recorded "
        f"correctness of the served answer ({with_prop} with a propensity); {n_shadow_rows} replayed shadow rows "
        f"({n_shadow_rows // max(len(candidates), 1)} queries x {len(candidates)} candidates, recorded correctness, estimated J)"
    )


def _retrain_step(cfg: DemoConfig, out: Out) -> Any:
    """Step 5: retrain on the grown table; returns the retrain result."""
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
    return second


@dataclass
class _Comparison:
    """Step 6's numbers: the served point, the baselines, the first router's sweep, the headline and the plot."""

    served: Any
    base: dict[str, Any]
    sweep: Any
    head: Any
    pareto: Path


def _compare(
    cfg: DemoConfig,
    checkpoint: Any,
    prod: list[dict],
    serve_recs: list[Any],
    pt: np.ndarray,
    Y: np.ndarray,
    E: np.ndarray,
    candidates: list[str],
) -> _Comparison:
    """Step 6: the served traffic against the baselines and the λ sweep of ``checkpoint``; writes ``pareto.png``."""
    from litellm_energy_router.demo import compare

    served = compare.served_point(prod, cfg.lam_value)
    served.name = f"energy router, served (λ={cfg.lam_value:g}, ε={cfg.epsilon:g})"
    base = compare.baselines(Y, E, candidates)
    sweep = compare.router_sweep(checkpoint, [r.prompt for r in serve_recs], pt, Y, E, cfg.lam_value)
    head = compare.Headline.of(prod, Y, E, base, sweep)
    pareto = compare.write_plot(cfg.workdir / "pareto.png", served, base, sweep, Y, E, candidates)
    return _Comparison(served, base, sweep, head, pareto)


def _print_comparison(cfg: DemoConfig, cmp: _Comparison, n: int, candidates: list[str], out: Out) -> None:
    """Step 6's report: the comparison table, the router's sweep and the headline."""
    from litellm_energy_router.demo import compare

    out("[6/6] served traffic vs baselines on the same held-back queries")
    out(f"note: {ENERGY_NOTE}")
    for line in [
        *compare.comparison_lines(cmp.served, cmp.base, cmp.sweep, n, cfg.lam_value, cfg.epsilon),
        *compare.sweep_lines(cmp.sweep, candidates),
        *cmp.head.lines(cmp.served, cmp.base),
    ]:
        out(line)


def _summary(
    cfg: DemoConfig,
    candidates: list[str],
    counts: dict[str, int],
    cmp: _Comparison,
    first: Any,
    second: Any,
    wall: float,
    tm: Any,
) -> dict[str, Any]:
    """``summary.json``: the run's options, ``counts`` (queries and rows), the comparison, both versions and
    the timings."""
    sweep = cmp.sweep
    curve = sweep.evaluation.method("router").curve
    return {
        "db": cfg.db,
        "workdir": str(cfg.workdir),
        "quick": cfg.quick,
        "full_training": cfg.full_training,
        "lambda": cfg.lam_value,
        "epsilon": cfg.epsilon,
        "energy_method": "estimate",
        "energy_note": ENERGY_NOTE,
        "candidates": candidates,
        **counts,
        "served": cmp.served.as_dict(),
        "router_no_exploration": sweep.at_lambda.as_dict(),
        "baselines": {k: p.as_dict() for k, p in cmp.base.items()},
        "headline": cmp.head.as_dict(),
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
        "pareto_png": cmp.pareto.resolve(),
        "wall_s": round(wall, 1),
        "steps_s": tm.steps,
        "cpu_s": tm.cpu,
    }
