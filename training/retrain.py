"""``energy-router retrain``: scheduled retraining with a promotion gate. Safe to run from cron.

One run:

1. takes a file lock (``<versions_dir>/.retrain.lock``); a second concurrent run exits 0 at once;
2. counts labelled rows (score and energy) newer than the serving checkpoint's training watermark
   (run id, or updated later, e.g. labelled by feedback); below ``min_new_rows`` it stops: "nothing new";
3. trains a candidate checkpoint on the table minus a **stable held-out set** (a hash of the query id,
   so the held-out queries never enter any checkpoint's training data), read in one bounded pass
   (:mod:`.sampling`): the LM router, from scratch or warm-started from the serving checkpoint; with
   ``select: true`` the scorers of ``select_scorers`` are cross-validated on those rows and the best is
   exported (:mod:`.selection`);
4. scores the candidate and the serving checkpoint on the same held-out queries (AIQ; joules to reach
   the target accuracy) and, when production rows with propensities exist, estimates both on logged
   traffic by IPS/SNIPS (:mod:`.ope`);
5. **promotes** the candidate only when the rule holds (``aiq``, ``joules`` or ``both``): the checkpoint
   becomes ``<versions_dir>/v-<version>`` and the pointer moves atomically (serving hot-reloads it);
   only the last ``keep`` versions are kept (never the one the pointer names). A rejected candidate
   is deleted. Each training run writes ``<report_dir>/<version>.json`` and ``.md``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from litellm_energy_router.errors import one_line
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import ConfigError, Settings, load_settings, read_yaml_section
from litellm_energy_router.table import open_store

from .data import TableMatrix, holdout_split, near_duplicate_groups
from .sampling import TrainingBudget
from .train_config import TrainSection

Log = Callable[[str], None]


class RetrainConfig(BaseModel):
    """The ``retrain:`` section of the config file (the ``energy_router:`` section gives the table URL,
    the checkpoint pointer and the knob when these fields are left empty)."""

    model_config = ConfigDict(extra="forbid")

    table_url: str | None = Field(None, description="table URL; default: energy_router.table.url")
    pointer: Path | None = Field(
        None,
        description="checkpoint pointer (JSON file or symlink) that serving watches; "
        "default: energy_router.router.checkpoint",
    )
    versions_dir: Path | None = Field(
        None, description="where promoted checkpoints go; default: <pointer dir>/versions"
    )
    report_dir: Path | None = Field(
        None, description="per-run JSON + markdown reports; default: <versions_dir>/reports"
    )
    keep: int = Field(5, ge=1, description="promoted versions kept on disk (the pointed-to one is never removed)")
    min_new_rows: int = Field(200, ge=0, description="labelled rows newer than the watermark needed to train")
    sources: list[str] = Field(default_factory=lambda: ["import", "tournament", "shadow", "production"])
    warm_start: bool = Field(
        False,
        description="start SFT from the serving checkpoint's weights and train on the new "
        "queries plus budget.replay_ratio times as many old ones (else from scratch)",
    )
    quick: bool = Field(False, description="seconds-long training (tests, smoke runs)")
    grpo_steps: int = Field(
        0,
        ge=0,
        description="GRPO steps after SFT (0 = off, the default pipeline); "
        "kept for older configs: train.grpo says more",
    )
    train: TrainSection = Field(
        default_factory=TrainSection,
        description="what to train: backbone, stages, "
        "budgets (:mod:`.train_config`); left out: the default (or quick) configuration",
    )
    rule: Literal["aiq", "joules", "both"] = Field("both", description="promotion rule on the held-out queries")
    target_accuracy: float | None = Field(
        None,
        gt=0,
        le=1,
        description="accuracy the 'joules' rule prices; default: the best single candidate's held-out accuracy",
    )
    tolerance: float = Field(
        0.0, ge=0, description="slack: AIQ may drop by this much, joules may rise by this fraction"
    )
    holdout_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of queries held out (stable hash of the query id)"
    )
    holdout_salt: str = Field("retrain", description="changing it changes the held-out set")
    lam: float | None = Field(
        None, ge=0, description="λ for the off-policy estimate; default: energy_router.knob.lambda"
    )
    epsilon: float | None = Field(
        None,
        ge=0,
        le=1,
        description="exploration rate assumed for the new router in the "
        "off-policy estimate; default: energy_router.router.epsilon",
    )
    budget: TrainingBudget = Field(
        default_factory=TrainingBudget,
        description="bounded work per retrain: a table larger than this is sampled (training/sampling.py)",
    )
    embed_cache_dir: Path | None = Field(
        None, description="query-embedding cache kept across retrains; default: <versions_dir>/embed-cache"
    )
    knob: Any = Field(
        None,
        exclude=True,
        description="set from energy_router.knob by load_retrain_config: the knob the "
        "off-policy estimate decides with (its λ replaced by lam when lam is set)",
    )
    ope_max_rows: int | None = Field(
        20000,
        ge=100,
        description="logged production rows the off-policy estimate "
        "scores: a uniform sample of them when the table holds more (None: all)",
    )

    @model_validator(mode="after")
    def _one_grpo_setting(self) -> "RetrainConfig":
        if self.grpo_steps and self.train.grpo is not None:
            raise ValueError("set either grpo_steps or train.grpo, not both")
        return self

    select: bool = Field(
        False,
        description="model selection: cross-validate select_scorers on the training rows and "
        "export the best as the candidate (training/selection.py); false (default): train the LM "
        "router (its winner, kNN, ties the router on the development rows)",
    )
    select_scorers: list[str] = Field(
        default_factory=lambda: _default_scorers(),
        description="scorers model selection judges: trainable kinds of the scorer registry "
        "(router, lm, task_prior, knn, logreg, mf, stacked or a plugin's); default: its default ones",
    )
    select_folds: int = Field(5, ge=2, le=20, description="CV folds of model selection")

    @field_validator("select_scorers")
    @classmethod
    def _known_scorers(cls, v: list[str]) -> list[str]:
        from .selection import check_scorers

        return check_scorers(v)


def _default_scorers() -> list[str]:
    from .selection import default_scorers

    return default_scorers()


def load_retrain_config(path: str | Path | None, **overrides: Any) -> RetrainConfig:
    """Read ``retrain:`` (and the defaults it borrows from ``energy_router:``) from a YAML file."""
    settings: Settings = load_settings(path)
    data = read_yaml_section(path, "retrain", whole_if_absent=False) if path else {}
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        cfg = RetrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, f"{path}: retrain", key="config key")) from None
    cfg.table_url = cfg.table_url or settings.table.url
    if cfg.pointer is None:
        if settings.router.checkpoint is None:
            raise ConfigError(
                f"{path}: set retrain.pointer or energy_router.router.checkpoint (the pointer serving watches)"
            )
        cfg.pointer = Path(settings.router.checkpoint)
    base = settings.knob.base()
    cfg.knob = base if cfg.lam is None else base.model_copy(update={"lambda_": cfg.lam, "target_accuracy": None})
    cfg.lam = settings.knob.lambda_ if cfg.lam is None else cfg.lam
    cfg.epsilon = settings.router.epsilon if cfg.epsilon is None else cfg.epsilon
    return cfg


@dataclass
class RetrainResult:
    status: Literal["locked", "nothing_new", "promoted", "rejected"]
    message: str
    version: str | None = None
    checkpoint: Path | None = None
    report_json: Path | None = None
    report_md: Path | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _versions_dir(cfg: RetrainConfig) -> Path:
    return Path(cfg.versions_dir) if cfg.versions_dir else Path(cfg.pointer).parent / "versions"


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


def _serving(pointer: Path) -> tuple[Path | None, Any]:
    if pointer.is_dir() and not pointer.is_symlink():
        raise ConfigError(
            f"pointer {pointer}: is a checkpoint directory; retrain needs a pointer file it can swap "
            f'(e.g. {pointer}.json with {{"checkpoint": "{pointer}"}})'
        )
    if not pointer.exists():
        return None, None
    d = resolve(pointer)
    return d, read_manifest(d)


def compare(candidate: Any, serving: Any, hold: TableMatrix, cfg: RetrainConfig) -> dict[str, Any]:
    """Score both checkpoints (:class:`~.pipeline.CheckpointPredictor`; ``serving`` may be None) on the
    held-out queries; ``promote`` says whether the rule holds."""
    from .evaluate import evaluate, joules_at_accuracy

    routers = {
        name: (p.predict_proba(hold), p.predict_energy(hold))
        for name, p in (("candidate", candidate), ("serving", serving))
        if p is not None
    }
    ev = evaluate(hold.Y, hold.E, routers, hold.candidates)
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
    aiq_ok = c["aiq"] >= s["aiq"] - tol
    cj, sj = c["joules_at_target"], s["joules_at_target"]
    j_ok = (sj is None) or (cj is not None and cj <= sj * (1 + tol))
    ok = {"aiq": aiq_ok, "joules": j_ok, "both": aiq_ok and j_ok}[cfg.rule]
    fmt = lambda v: "never" if v is None else f"{v:.2f} J"  # noqa: E731
    out["promote"] = bool(ok)
    out["why"] = (
        f"rule {cfg.rule}: AIQ {c['aiq']:.4f} vs serving {s['aiq']:.4f} ({'ok' if aiq_ok else 'worse'}); "
        f"joules at accuracy {target:.3f}: {fmt(cj)} vs {fmt(sj)} ({'ok' if j_ok else 'worse'})"
    )
    return out


def _ope_knob(cfg: RetrainConfig) -> Any:
    from litellm_energy_router.knob import Knob

    return cfg.knob if cfg.knob is not None else Knob(**{"lambda": cfg.lam or 0.0})


def _ope(store: Any, predictors: dict[str, Any], cfg: RetrainConfig, log: Log) -> dict[str, Any]:
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
            for line in est.lines(f"off-policy estimate of the {name} checkpoint at λ={cfg.lam:g}"):
                log(line)
    return out


def _prune(vdir: Path, keep: int, protect: set[Path]) -> list[str]:
    versions = sorted(p for p in vdir.glob("v-*") if p.is_dir())
    removed = []
    for p in versions[: max(len(versions) - keep, 0)]:
        if p.resolve() in protect:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def _write_reports(rdir: Path, version: str, report: dict[str, Any]) -> tuple[Path, Path]:
    rdir.mkdir(parents=True, exist_ok=True)
    jp, mp = rdir / f"{version}.json", rdir / f"{version}.md"
    jp.write_text(json.dumps(report, indent=2, default=str))
    cmp_ = report.get("comparison", {})
    lines = [
        f"# Retrain {version}: {report['status']}",
        "",
        report["message"],
        "",
        f"- new labelled rows since the watermark: {report['new_rows']}",
        f"- trained on {report['train_queries']} queries; held out {cmp_.get('held_out_queries')}",
        f"- training time: {report['train_seconds']:.1f} s",
        *_scale_lines(report),
        "",
        "| checkpoint | AIQ | J at target accuracy | max accuracy |",
        "|---|---|---|---|",
    ]
    for name in ("candidate", "serving"):
        if name in cmp_:
            r = cmp_[name]
            jt = "never" if r["joules_at_target"] is None else f"{r['joules_at_target']:.2f}"
            lines.append(f"| {name} | {r['aiq']:.4f} | {jt} | {r['max_accuracy']:.3f} |")
    if report.get("selection"):
        from .selection import summary_lines

        lines += ["", *summary_lines(report["selection"])]
    for name, est in report.get("off_policy", {}).items():
        if "accuracy_snips" in est:
            a, j = est["accuracy_snips"], est["joules_snips"]
            lines.append(
                f"\nOff-policy ({name}, SNIPS on {est['n']} logged rows): accuracy {a['value']:.3f} "
                f"[{a['lo']:.3f}, {a['hi']:.3f}], {j['value']:.1f} J [{j['lo']:.1f}, {j['hi']:.1f}]"
            )
    mp.write_text("\n".join(lines) + "\n")
    return jp, mp


def _scale_lines(report: dict[str, Any]) -> list[str]:
    """Report lines: what was read and sampled, each stage's wall time and the peak memory."""
    data, t = report.get("data", {}), report.get("timings", {})
    out = [f"- rows read: {data.get('rows_read')}; table queries: {data.get('table_queries')}"] if data else []
    if "sample" in data:
        s = data["sample"]
        out.append(
            f"- sampled {s['sampled']} of {s['table_rows']} queries (budget; effective sample size "
            f"{s['effective_sample_size']}, weights {s['weight_min']:.2f}..{s['weight_max']:.2f})"
        )
    if t:
        out.append(
            f"- peak RSS {t['peak_rss_mb']:.0f} MiB; stages: "
            + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in t["stages"].items())
        )
    return out


@dataclass
class _Run:
    """What one retrain run has decided and read so far (shared by its stages)."""

    cfg: RetrainConfig
    log: Log
    stages: Any
    vdir: Path
    rdir: Path
    serving_dir: Path | None
    manifest: Any
    new: int = 0
    since_id: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


def run_retrain(
    cfg: RetrainConfig,
    *,
    since: int | None = None,
    log: Log = print,
    transform_train: Callable[[TableMatrix], TableMatrix] | None = None,
    progress: Any | None = None,
) -> RetrainResult:
    """One retraining run (see the module docstring). ``transform_train`` edits the training matrix
    before training (tests use it to build a deliberately worse candidate); the edited matrix is then all
    the run trains on (no partial-feedback pairs). ``progress``: a ``rich.progress.Progress`` showing each
    stage (:mod:`.progress`)."""
    from .embed import use_cache_dir
    from .progress import Stages

    vdir = _versions_dir(cfg)
    vdir.mkdir(parents=True, exist_ok=True)
    lock = open(vdir / ".retrain.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        msg = f"another retrain is running (lock {vdir / '.retrain.lock'} is held); exiting"
        log(msg)
        return RetrainResult("locked", msg)
    try:
        serving_dir, manifest = _serving(Path(cfg.pointer))  # type: ignore[arg-type]
        use_cache_dir(cfg.embed_cache_dir or vdir / "embed-cache")
        run = _Run(
            cfg,
            log,
            Stages(progress),
            vdir,
            Path(cfg.report_dir) if cfg.report_dir else vdir / "reports",
            serving_dir,
            manifest,
        )
        store = open_store(cfg.table_url, create=False)  # the table to learn from; a typo creates none
        try:
            if not _enough_new(run, store, since):
                msg = f"nothing new: {run.new} labelled rows since run id {run.since_id} (minimum {cfg.min_new_rows})"
                log(msg)
                return RetrainResult("nothing_new", msg, details={"new_rows": run.new})
            return _train_and_judge(run, store, transform_train)
        finally:
            store.close()
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _enough_new(run: _Run, store: Any, since: int | None) -> bool:
    """Count the labelled rows newer than the serving checkpoint's watermark (or ``since``)."""
    wm = run.manifest.watermark if run.manifest is not None else {}
    run.since_id = since if since is not None else wm.get("max_run_id")
    since_upd = None if since is not None else wm.get("max_updated")
    run.new = store.count_labelled(since_id=run.since_id, since_updated=since_upd, sources=run.cfg.sources)
    return run.manifest is None or run.new >= run.cfg.min_new_rows


def _read(run: _Run, store: Any, tc: Any, transform_train: Any) -> tuple[TableMatrix, TableMatrix, Any]:
    """One pass over the table (bounded by the budget): the training rows, the held-out rows and the
    partial-feedback pairs of the training queries (None when off)."""
    from .pairs import PairReader
    from .sampling import bound_pairs, bounded_matrix

    cfg, stages = run.cfg, run.stages
    wm = run.manifest.watermark if run.manifest is not None else {}
    warm_since = wm.get("max_run_id") if cfg.warm_start and run.serving_dir is not None else None
    reader = PairReader(None) if tc.partial_feedback and transform_train is None else None
    m, run.data = bounded_matrix(
        store,
        run.manifest.candidates if run.manifest is not None else None,
        cfg.sources,
        cfg.budget,
        cfg.holdout_fraction,
        run.serving_dir,
        run.rdir,
        stages,
        run.log,
        warm_since,
        reader,
    )
    with stages.stage("held-out split"):
        tr, te = holdout_split(
            m.ids, cfg.holdout_fraction, salt=cfg.holdout_salt, groups=near_duplicate_groups(m.texts, m.ids, m.tasks)
        )
    train_m, hold = m.take(tr), m.take(te)
    if transform_train is not None:
        train_m = transform_train(train_m)
    pairs = None
    if reader is not None:  # every labelled pair of the training queries (held-out excluded)
        with stages.stage("labelled pairs"):
            pairs, reader = reader.table(m.candidates, cfg.table_url).exclude(hold.ids), None
            pairs, run.data["pairs"] = bound_pairs(pairs, train_m.ids, cfg.budget.query_cap(run.rdir), cfg.budget.seed)
            if train_m.weight is not None:  # a sampled table: its queries' pairs carry 1/π too
                pairs.scale_weights(train_m.ids, train_m.weight)
    return train_m, hold, pairs


def _train(run: _Run, train_m: TableMatrix, pairs: Any, tc: Any, tmp: Path) -> dict[str, Any] | None:
    """Train the candidate checkpoint into ``tmp``: model selection's winner, or the LM router. Returns
    the selection summary (None without selection)."""
    from .pipeline import train_matrix

    selection = None
    with run.stages.stage("train") as tick:
        if run.cfg.select:  # cross-validate the scorers on the training rows, export the best (selection.py)
            from .selection import select_and_export

            selection = select_and_export(
                train_m,
                tmp,
                run.cfg.select_scorers,
                folds=run.cfg.select_folds,
                train_config=tc,
                log=run.log,
                pairs=pairs,
            ).summary()
        else:
            train_matrix(
                train_m,
                tmp,
                tc,
                log=run.log,
                pairs=pairs,
                on_step=lambda d: tick(completed=d.get("step", 0), total=d.get("max_steps")),
            )
    shutil.rmtree(tmp / "_trainer", ignore_errors=True)
    shutil.rmtree(tmp / "_grpo", ignore_errors=True)
    return selection


def _train_and_judge(run: _Run, store: Any, transform_train: Any) -> RetrainResult:
    """Read, train a candidate, compare it with the serving checkpoint on the held-out rows, estimate both
    on logged traffic, promote or delete it, and write the report."""
    from .pipeline import CheckpointPredictor, _version

    cfg, log, stages = run.cfg, run.log, run.stages
    tc = cfg.train.build(quick=cfg.quick, grpo_steps=cfg.grpo_steps)
    train_m, hold, pairs = _read(run, store, tc, transform_train)
    if cfg.warm_start and run.serving_dir is not None:
        tc.init_from = str(run.serving_dir)
    tmp = run.vdir / f".tmp-{_version()}"
    log(f"retrain: {run.new} new labelled rows; training on {len(train_m)} queries, {len(hold)} held out")
    t0 = time.time()
    selection = _train(run, train_m, pairs, tc, tmp)
    version, t_train = read_manifest(tmp).version, time.time() - t0
    loaded = {
        "candidate": CheckpointPredictor(tmp, hold.candidates),  # each checkpoint loaded once
        "serving": CheckpointPredictor(run.serving_dir, hold.candidates) if run.serving_dir else None,
    }
    with stages.stage("compare"):
        cmp_ = compare(loaded["candidate"], loaded["serving"], hold, cfg)
    log(f"retrain {version}: {cmp_['why']}")
    with stages.stage("off-policy"):
        off_policy = _ope(store, loaded, cfg, log)
    status, ck, msg = _promote_or_delete(run, tmp, version, cmp_)
    log(msg)
    report = {
        "version": version,
        "status": status,
        "message": msg,
        "new_rows": run.new,
        "since_id": run.since_id,
        "train_queries": len(train_m),
        "train_seconds": t_train,
        "comparison": cmp_,
        "off_policy": off_policy,
        "selection": selection,
        "serving": str(run.serving_dir) if run.serving_dir else None,
        "checkpoint": str(ck) if ck else None,
        "config": cfg.model_dump(mode="json"),
        "train_config": dataclasses.asdict(tc),
        "created": time.time(),
        "data": run.data,
        "timings": stages.report(),
    }
    jp, mp = _write_reports(run.rdir, version, report)
    return RetrainResult(status, msg, version, ck, jp, mp, report)


def _promote_or_delete(run: _Run, tmp: Path, version: str, cmp_: dict[str, Any]) -> tuple[str, Path | None, str]:
    """Move the candidate into ``v-<version>`` and the pointer to it when the rule holds; else delete it."""
    if not cmp_["promote"]:
        shutil.rmtree(tmp, ignore_errors=True)
        return "rejected", None, f"not promoted: the serving checkpoint {run.serving_dir} stays ({cmp_['why']})"
    final = run.vdir / f"v-{version}"
    os.replace(tmp, final)
    set_pointer(Path(run.cfg.pointer), final)  # type: ignore[arg-type]
    removed = _prune(run.vdir, run.cfg.keep, {final.resolve()})
    return (
        "promoted",
        final,
        f"promoted {final} (pointer {run.cfg.pointer} moved); removed old versions {removed or 'none'}",
    )
