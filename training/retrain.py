"""``energy-router retrain``: scheduled retraining with a promotion gate. Safe to run from cron.

One run:

1. takes a file lock (``<versions_dir>/.retrain.lock``); a second concurrent run exits 0 at once;
2. counts labelled rows (score and energy) newer than the serving checkpoint's training watermark
   (run id, or updated later, e.g. labelled by feedback), or, after the gate rejected a candidate against the
   checkpoint serving now, than that candidate's (``<versions_dir>/.retrain-rejected.json``: the same rows are
   not trained on and rejected again on every cron tick); below ``min_new_rows`` it stops: "nothing new";
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

The configuration: :mod:`.retrain_config`; the promotion gate (steps 4 and 5): :mod:`.retrain_gate`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from litellm_energy_router.errors import replacing, user_error_line
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import ConfigError
from litellm_energy_router.table import open_store

from .data import MatrixError, TableMatrix, holdout_split, near_duplicate_groups
from .ope import finite
from .retrain_config import RetrainConfig, load_retrain_config  # noqa: F401 (re-exported)
from .retrain_gate import (  # noqa: F401 (re-exported)
    compare,
    estimate_off_policy,
    promote_or_delete,
    rejected_watermark,
    remember_rejected,
    set_pointer,
)

Log = Callable[[str], None]


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


def _write_reports(rdir: Path, version: str, report: dict[str, Any]) -> tuple[Path, Path]:
    """``<version>.json`` and ``.md`` in ``rdir``, each written whole or not at all (:func:`.errors.replacing`)."""
    rdir.mkdir(parents=True, exist_ok=True)
    jp, mp = rdir / f"{version}.json", rdir / f"{version}.md"
    with replacing(jp) as tmp:
        tmp.write_text(json.dumps(finite(report), indent=2, default=str, allow_nan=False))  # strict JSON: jq, JS, Go
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
            f = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731 (None: not estimable)
            lines.append(
                f"\nOff-policy ({name}, SNIPS on {est['n']} logged rows, {f(a['ess'], '.1f')} effective): "
                f"accuracy {f(a['value'], '.3f')} "
                f"[{f(a['lo'], '.3f')}, {f(a['hi'], '.3f')}], {f(j['value'], '.1f')} J "
                f"[{f(j['lo'], '.1f')}, {f(j['hi'], '.1f')}]"
            )
    with replacing(mp) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
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
    rejected: str | None = None  # counting from the watermark of this rejected candidate
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
        _remove_leftovers(vdir, log)
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
                after = f"; counted from rejected candidate {run.rejected}'s rows" if run.rejected else ""
                msg = (
                    f"nothing new: {run.new} labelled rows since run id {run.since_id} "
                    f"(minimum {cfg.min_new_rows}{after})"
                )
                log(msg)
                return RetrainResult("nothing_new", msg, details={"new_rows": run.new})
            return _train_and_judge(run, store, transform_train)
        finally:
            store.close()
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _remove_leftovers(vdir: Path, log: Log) -> None:
    """Remove the half-written version directories (``.tmp-*``) of runs that were killed (SIGKILL, a cron timeout's
    SIGTERM) before they could clean up; called with the lock held, so no other run is writing one."""
    for d in sorted(vdir.glob(".tmp-*")):
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
            log(f"retrain: removed {d.name}, left by a run that was stopped before it finished")


def _enough_new(run: _Run, store: Any, since: int | None) -> bool:
    """Count the labelled rows newer than the serving checkpoint's watermark, or than the last candidate rejected
    against it (or ``since``)."""
    wm = run.manifest.watermark if run.manifest is not None else {}
    serving = run.manifest.version if run.manifest is not None else None
    rejected = rejected_watermark(run.vdir, serving) if since is None else None
    if rejected is not None:
        run.rejected, wm = rejected
    run.since_id = since if since is not None else wm.get("max_run_id")
    since_upd = None if since is not None else wm.get("max_updated")
    try:  # runs the last scan read within its clock-skew margin (none, or unreadable: they count as new)
        seen = {int(i): float(u) for i, u in wm.get("seen") or ()} if since is None else None
    except (TypeError, ValueError):
        seen = None
    run.new = store.count_labelled(since_id=run.since_id, since_updated=since_upd, sources=run.cfg.sources, seen=seen)
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
    if not len(hold) or not len(train_m):  # before training: the gate would have nothing to compare on
        raise MatrixError(
            f"retrain: {len(m)} queries split into {len(train_m)} to train on and {len(hold)} held out "
            f"(holdout_fraction {cfg.holdout_fraction}, by near-duplicate group): label more queries"
        )
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


@contextmanager
def _removed_on_error(path: Path) -> Iterator[None]:
    """Remove ``path`` (a checkpoint being written) when the block raises, then re-raise."""
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


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
    with _removed_on_error(tmp):  # a run that fails leaves no half-written version directory behind
        t0 = time.time()
        selection = _train(run, train_m, pairs, tc, tmp)
        manifest, t_train = read_manifest(tmp), time.time() - t0
        version = manifest.version
        loaded = {
            "candidate": CheckpointPredictor(tmp, hold.candidates),  # each checkpoint loaded once
            "serving": CheckpointPredictor(run.serving_dir, hold.candidates) if run.serving_dir else None,
        }
        with stages.stage("compare"):
            cmp_ = compare(loaded["candidate"], loaded["serving"], hold, cfg)
        log(f"retrain {version}: {cmp_['why']}")
        with stages.stage("off-policy"):
            off_policy = estimate_off_policy(store, loaded, cfg, log)
        status, ck, msg = promote_or_delete(tmp, version, cmp_, run.vdir, cfg, run.serving_dir)
    if not cmp_["promote"]:  # the rule said no (not a pointer moved meanwhile): these rows are judged
        remember_rejected(
            run.vdir, run.manifest.version if run.manifest is not None else None, version, manifest.watermark
        )
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
    try:
        jp, mp = _write_reports(run.rdir, version, report)
    except OSError as e:  # a full disk after the gate decided: the decision stands (the pointer moved or not)
        log(f"retrain {version}: {status}, but its report was not written ({user_error_line(e) or e})")
        jp = mp = None
    return RetrainResult(status, msg, version, ck, jp, mp, report)
