"""The promotion gate of ``retrain`` (steps 4 and 5 of :mod:`.retrain`): score the candidate and the
serving checkpoint on the same held-out queries (:func:`compare`: AIQ; joules (J) to reach the target
accuracy), estimate both on logged production traffic (:func:`estimate_off_policy`: IPS/SNIPS), then
promote the candidate (move it into ``v-<version>``, swap the pointer atomically, prune old versions) or
delete it (:func:`promote_or_delete`); a rejection is remembered (:func:`remember_rejected`) so the next runs count
new rows from the rejected candidate's watermark.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from litellm_energy_router.errors import replacing

from .data import TableMatrix
from .retrain_config import RetrainConfig

Log = Callable[[str], None]


def set_pointer(pointer: Path, checkpoint_dir: Path) -> None:
    """Atomically make ``pointer`` name ``checkpoint_dir``: a symlink stays a symlink, anything else is
    written as a JSON pointer file."""
    from litellm_energy_router.router.checkpoint import point_to

    if pointer.is_symlink():
        tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(checkpoint_dir.resolve(), tmp)
        os.replace(tmp, pointer)
    else:
        point_to(pointer, checkpoint_dir)


def compare(candidate: Any, serving: Any, hold: TableMatrix, cfg: RetrainConfig) -> dict[str, Any]:
    """Score both checkpoints (:class:`~.pipeline.CheckpointPredictor`; ``serving`` may be None) on the
    held-out queries; ``promote`` says whether the rule holds."""
    from .evaluate import bootstrap_rows, evaluate, joules_at_accuracy

    routers = {
        name: (p.predict_proba(hold), p.predict_energy(hold))
        for name, p in (("candidate", candidate), ("serving", serving))
        if p is not None
    }
    # paired: both checkpoints scored on the same resamples of the held-out queries
    boot = bootstrap_rows(len(hold), cfg.resamples) if cfg.resamples and serving is not None else None
    ev = evaluate(hold.Y, hold.E, routers, hold.candidates, folds=boot)
    target = cfg.target_accuracy or ev.best_accuracy
    out: dict[str, Any] = {
        "held_out_queries": len(hold),
        "target_accuracy": target,
        "best_single": {"candidate": hold.candidates[ev.best], "accuracy": ev.best_accuracy, "joules": ev.best_energy},
    }
    for name in routers:
        m = ev.method(name)
        hx, hy = m.curve.hull()
        j = joules_at_accuracy(hx, hy, target)
        out[name] = {
            "aiq": m.aiq,
            "joules_at_target": j if np.isfinite(j) else None,
            "max_accuracy": float(m.curve.accuracy.max()),
        }
    if serving is None:
        out["promote"], out["why"] = True, "no serving checkpoint yet"
        return out
    c, s, tol = out["candidate"], out["serving"], cfg.tolerance
    cj, sj = c["joules_at_target"], s["joules_at_target"]
    aiq_tie, j_tie = _bootstrap_ties(ev, out, cfg) if boot is not None else (None, None)
    aiq_ok = c["aiq"] >= s["aiq"] - tol or bool(aiq_tie)
    if sj is None and cj is None:  # neither reaches the target: the one that gets closer to it
        j_ok = c["max_accuracy"] >= s["max_accuracy"] - tol
    else:
        j_ok = (sj is None) or (cj is not None and cj <= sj * (1 + tol)) or bool(j_tie)
    ok = {"aiq": aiq_ok, "joules": j_ok, "both": aiq_ok and j_ok}[cfg.rule]
    # a tie promotes: the candidate learnt from the newer rows (production energy, new candidates, new traffic) that
    # the held-out queries do not show (a new task's production rows are not among them)
    tie = (c["aiq"], cj, c["max_accuracy"]) == (s["aiq"], sj, s["max_accuracy"])
    fmt = lambda v: "never" if v is None else f"{v:.2f} J"  # noqa: E731
    word = lambda good, t: "ok" if good and not t else "tie" if t else "worse"  # noqa: E731
    out["promote"] = bool(ok)
    out["why"] = (
        f"rule {cfg.rule}: AIQ {c['aiq']:.4f} vs serving {s['aiq']:.4f} ({word(aiq_ok, aiq_tie)}); "
        f"joules at accuracy {target:.3f}: {fmt(cj)} vs {fmt(sj)} ({word(j_ok, j_tie)})"
        + ("; a tie: the fresher checkpoint serves" if tie or (ok and (aiq_tie or j_tie)) else "")
    )
    return out


def _bootstrap_ties(ev: Any, out: dict[str, Any], cfg: RetrainConfig) -> tuple[bool, bool | None]:
    """(AIQ tie, joules tie) of the candidate against the serving checkpoint: the paired bootstrap 95 % interval of
    the difference over resamples of the held-out queries holds 0 (a lead inside the spread is a tie, not a win or a
    loss: a point comparison rejected a candidate 0.001 AIQ "worse" on 152 queries at every step of the closed loop,
    so a new task learnt from production never served). The joules tie reads J at the best single candidate's
    accuracy per resample (``None``: a configured ``target_accuracy``, or too few resamples reach it)."""
    from .evaluate import interval95

    c, s = ev.method("candidate"), ev.method("serving")
    lo, hi = interval95(np.asarray(c.aiq_folds) - np.asarray(s.aiq_folds))
    out["aiq_diff_ci"] = [round(float(lo), 5), round(float(hi), 5)]
    j_tie = None
    cj, sj = np.asarray(c.joules_ratio_folds), np.asarray(s.joules_ratio_folds)
    both = np.isfinite(cj) & np.isfinite(sj)
    if cfg.target_accuracy is None and both.mean() >= 0.9:
        jlo, jhi = interval95(cj[both] - sj[both])
        out["joules_ratio_diff_ci"] = [round(float(jlo), 5), round(float(jhi), 5)]
        j_tie = bool(jlo <= 0.0 <= jhi)
    return bool(lo <= 0.0 <= hi), j_tie


def _ope_knob(cfg: RetrainConfig) -> Any:
    from litellm_energy_router.knob import Knob

    return cfg.knob if cfg.knob is not None else Knob(**{"lambda": cfg.lam or 0.0})


def estimate_off_policy(store: Any, predictors: dict[str, Any], cfg: RetrainConfig, log: Log) -> dict[str, Any]:
    """Off-policy estimates of each loaded checkpoint (``None`` entries skipped) on the logged production rows."""
    from .ope import evaluate_checkpoint_on_log, logged_rows

    rows = logged_rows(store.iter_runs(sources=["production"]), cap=cfg.ope_max_rows)
    if not rows:
        return {}
    out = {}
    for name, p in predictors.items():
        if p is None:
            continue
        try:
            est = evaluate_checkpoint_on_log(store, p.model, knob=_ope_knob(cfg), epsilon=cfg.epsilon or 0.0, rows=rows)
        except ValueError as e:
            out[name] = {"error": str(e)}
            continue
        if est is not None:
            out[name] = est.as_dict()
            for line in est.lines(f"off-policy estimate of the {name} checkpoint at λ={cfg.lam or 0.0:g}"):
                log(line)
    return out


def _pointed(pointer: Path) -> Path | None:
    """The checkpoint directory ``pointer`` names now (resolved), or ``None`` when there is no pointer."""
    from litellm_energy_router.router.checkpoint import resolve

    if not pointer.exists():
        return None
    try:
        return resolve(pointer).resolve()
    except Exception:  # noqa: BLE001 - a pointer that no longer resolves is not the one compared against
        return pointer.resolve()


def prune_versions(vdir: Path, keep: int, protect: set[Path]) -> list[str]:
    """Delete all but the last ``keep`` promoted versions (``v-*`` in ``vdir``), never one in ``protect``;
    returns the names removed."""
    versions = sorted(p for p in vdir.glob("v-*") if p.is_dir())
    removed = []
    for p in versions[: max(len(versions) - keep, 0)]:
        if p.resolve() in protect:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def promote_or_delete(
    tmp: Path, version: str, cmp_: dict[str, Any], vdir: Path, cfg: RetrainConfig, serving_dir: Path | None
) -> tuple[str, Path | None, str]:
    """Move the candidate ``tmp`` into ``<vdir>/v-<version>`` and the pointer to it when the rule holds
    (``cmp_``: :func:`compare`), pruning old versions; else delete it. Returns (status, checkpoint, message)."""
    if not cmp_["promote"]:
        shutil.rmtree(tmp, ignore_errors=True)
        return "rejected", None, f"not promoted: the serving checkpoint {serving_dir} stays ({cmp_['why']})"
    now = _pointed(Path(cfg.pointer))  # type: ignore[arg-type]
    was = serving_dir.resolve() if serving_dir is not None else None
    if now != was:  # a rollback or another run moved it while this one trained: not judged against it
        shutil.rmtree(tmp, ignore_errors=True)
        return (
            "rejected",
            None,
            f"not promoted: the pointer {cfg.pointer} moved to {now} during training (compared with {was}); "
            "the next run compares against what serves now",
        )
    final = vdir / f"v-{version}"
    os.replace(tmp, final)
    set_pointer(Path(cfg.pointer), final)  # type: ignore[arg-type]
    removed = prune_versions(vdir, cfg.keep, {final.resolve()})
    return (
        "promoted",
        final,
        f"promoted {final} (pointer {cfg.pointer} moved); removed old versions {removed or 'none'}",
    )


REJECTED_FILE = ".retrain-rejected.json"  # in the versions directory: the watermark of the last rejected candidate


def remember_rejected(vdir: Path, serving: str | None, version: str, watermark: dict[str, Any]) -> None:
    """After the gate rejected candidate ``version`` against the checkpoint of version ``serving``: later runs count
    new rows from its ``watermark`` while that checkpoint serves (they would train on the same rows, and be rejected
    again, on every cron tick). Written atomically."""
    with replacing(vdir / REJECTED_FILE) as tmp:
        tmp.write_text(
            json.dumps({"serving_version": serving, "rejected": version, "watermark": watermark}, default=str)
        )


def rejected_watermark(vdir: Path, serving: str | None) -> tuple[str, dict[str, Any]] | None:
    """(rejected version, its watermark) when the last rejection was judged against checkpoint version ``serving``
    (the one serving now); None otherwise, or for a missing or unreadable file."""
    try:
        state = json.loads((vdir / REJECTED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or serving is None or state.get("serving_version") != serving:
        return None
    wm = state.get("watermark")
    return (str(state.get("rejected")), wm) if isinstance(wm, dict) else None
