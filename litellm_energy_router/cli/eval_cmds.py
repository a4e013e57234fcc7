"""``energy-router eval``: cross-validated accuracy–energy evaluation of routers on the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from litellm_energy_router.cli.common import (
    ConfigOpt,
    DbOpt,
    console,
    db_url,
    fail,
    settings_or_fail,
)
from litellm_energy_router.cli.table_cmds import _store, progress_bar
from litellm_energy_router.redact import redact_url

BaselinesOpt = typer.Option(
    None,
    "--baselines",
    help="comma-separated trainable scorers of the registry "
    "(default: its default ones; a plugin's included), or 'none'",
)
EnergyProfileOpt = typer.Option(
    None,
    "--energy-profile",
    exists=True,
    dir_okay=False,
    help="J/token profile YAML (default: settings energy.profile, else bundled)",
)
RouterOpt = typer.Option(
    True,
    "--router/--no-router",
    help="also train the LM router (default config) per fold, judged as "
    "served ('router': its student) and with the LM forward ('lm')",
)
CheckpointOpt = typer.Option(
    None,
    "--checkpoint",
    exists=True,
    help="also judge this trained checkpoint (dir or pointer; repeatable) on every held-out fold, as it is "
    "(not refitted); the table's rows must be ones it never trained on, e.g. an evaluation split",
)
LambdaOpt = typer.Option(
    None,
    "--lambda",
    min=0,
    help="knob of the off-policy estimate of --checkpoint on logged production rows (default: settings knob.lambda)",
)
LeaveTaskOutOpt = typer.Option(
    False,
    "--leave-task-out",
    help="train on all tasks but one, judge on the held-out one with its task hidden (an unseen task), for every task",
)


def eval_cmd(
    out: Path = typer.Option(..., "--out", help="directory for report.md, pareto.png, phase.png, curves.csv"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    folds: int = typer.Option(5, "--folds", min=2, help="cross-validation folds (split by query, stratified by task)"),
    baselines: Optional[str] = BaselinesOpt,
    seed: int = typer.Option(0, "--seed", help="fold assignment seed"),
    source: Optional[list[str]] = typer.Option(None, "--source", help="only runs from these sources (repeatable)"),
    energy_profile: Optional[Path] = EnergyProfileOpt,
    points: int = typer.Option(41, "--points", min=2, help="operating points per λ sweep"),
    router: bool = RouterOpt,
    checkpoint: Optional[list[Path]] = CheckpointOpt,
    lam: Optional[float] = LambdaOpt,
    leave_task_out: bool = LeaveTaskOutOpt,
) -> None:
    """K-fold CV by query of the router and the learned baselines on the table: curves vs the zero router,
    random and the oracle; per scorer AIQ and joules at the best single candidate's accuracy with their
    fold spread, the one model selection (`retrain` with `select: true`) would promote marked."""
    lm, names = _scorer_names(baselines, router, checkpoint)
    ckpts = _load_checkpoints(checkpoint) if checkpoint else {}
    url = db_url(db, config)
    profile, m = _profile_and_matrix(url, config, energy_profile, ckpts, source)
    if folds > m.n:
        fail(f"--folds {folds}: only {m.n} fully labelled queries in {redact_url(url)}")
    console.print(m.summary(), highlight=False, soft_wrap=True)
    with progress_bar() as bar:
        scorers = (lm if router else []) + names
        extra = {name: (lambda pred=pred: pred) for name, pred in ckpts.items()}
        _check_checkpoint_candidates(ckpts, m)
        if leave_task_out:
            return _leave_task_out(scorers, extra, m, profile, points, out, bar)
        if not scorers:
            _checkpoints_only(extra, m, folds, seed, profile, points, out, bar)
            return _off_policy(url, ckpts, settings_or_fail(config), lam, out)
        sel = _select(m, scorers, extra, folds, seed, profile, points, bar)
    _report_selection(sel, folds, out)
    if ckpts:
        _off_policy(url, ckpts, settings_or_fail(config), lam, out)


def _scorer_names(baselines: Optional[str], router: bool, checkpoint: Optional[list[Path]]) -> tuple[list, list]:
    """(the LM scorers ``--router`` adds, the baselines asked for), checked against the registry: exits with
    a one-line error on an unknown baseline or nothing to evaluate."""
    from litellm_energy_router.training.selection import default_scorers, selectable

    lm = [n for n, (_, s) in selectable().items() if not s.baseline and not s.combines]  # what --router adds
    have = [n for n in selectable() if n not in lm]
    if baselines is None:
        names = [n for n in default_scorers() if n not in lm]
    else:
        names = [] if baselines.strip().lower() == "none" else [b.strip() for b in baselines.split(",") if b.strip()]
    unknown = [b for b in names if b not in have]
    if unknown:
        fail(f"--baselines: unknown baseline {unknown[0]!r} (have: {', '.join(have)})")
    if not names and not router and not checkpoint:
        fail("--baselines none with --no-router: nothing to evaluate")
    return lm, names


def _load_checkpoints(checkpoint: list[Path]) -> dict:
    """``--checkpoint`` paths as predictors, keyed ``checkpoint <version>``."""
    from litellm_energy_router.router.checkpoint import CheckpointError
    from litellm_energy_router.training.pipeline import CheckpointPredictor

    ckpts = {}
    for path in checkpoint:
        try:
            pred = CheckpointPredictor(path)
        except CheckpointError as e:
            fail(str(e))
        ckpts[f"checkpoint {pred.model.version}"] = pred
    return ckpts


def _profile_and_matrix(
    url: str, config: Optional[Path], energy_profile: Optional[Path], ckpts: dict, source: Optional[list[str]]
) -> tuple[Any, Any]:
    """(the energy profile, the table's matrix: in the first checkpoint's candidates when there is one)."""
    from litellm_energy_router.energy.profile import ProfileError, load_profile
    from litellm_energy_router.training.data import MatrixError, load_matrix

    try:
        profile = load_profile(energy_profile or settings_or_fail(config).energy.profile)
    except ProfileError as e:
        fail(str(e))
    with _store(url, create=False) as store:
        try:
            cands = next(iter(ckpts.values())).model.candidates if ckpts else None
            m = load_matrix(store, cands, sources=source)
        except MatrixError as e:
            fail(str(e))
    return profile, m


def _check_checkpoint_candidates(ckpts: dict, m: Any) -> None:
    """Every ``--checkpoint`` routes among the matrix's candidates (the first checkpoint's)."""
    for name, pred in ckpts.items():
        if pred.model.candidates != m.candidates:
            fail(
                f"--checkpoint {pred.model.path}: candidates {pred.model.candidates} differ from the first checkpoint's {m.candidates}"
            )


def _select(m: Any, scorers: list, extra: dict, folds: int, seed: int, profile: Any, points: int, bar: Any) -> Any:
    """K-fold CV of the scorers and checkpoints with model selection over them."""
    from litellm_energy_router.training.selection import select, selectable

    task = bar.add_task(
        "cross-validating",
        total=folds * (len(extra) + len([s for s in scorers if not selectable()[s][1].combines])),
    )
    try:
        return select(
            m,
            scorers,
            folds=folds,
            seed=seed,
            profile=profile,
            n_points=points,
            extra=extra,
            progress=lambda i, n, label: bar.update(task, completed=i, description=label),
        )
    except ValueError as e:
        fail(str(e))


def _report_selection(sel: Any, folds: int, out: Path) -> None:
    """Write the report (with the model selection table) and print the summary and the selection."""
    from litellm_energy_router.training.report import summary_table, write_report
    from litellm_energy_router.training.selection import selection_table

    table = selection_table(sel)
    paths = write_report(
        sel.ev,
        out,
        title=f"Router evaluation ({folds}-fold CV by query)",
        extra="## Model selection (what retrain with select: true would promote)\n\n" + table,
    )
    console.print(summary_table(sel.ev), highlight=False, soft_wrap=True)
    console.print(
        "\nModel selection over the scorers (retrain with select: true promotes the marked one):\n" + table,
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False, soft_wrap=True)


def _checkpoints_only(extra: dict, m, folds: int, seed: int, profile, points: int, out: Path, bar) -> None:
    """``--baselines none --no-router --checkpoint ...``: the checkpoints judged on every fold, as they are."""
    from litellm_energy_router.training.crossval import cross_validate
    from litellm_energy_router.training.report import summary_table, write_report

    task = bar.add_task("cross-validating", total=folds * len(extra))
    ev = cross_validate(
        extra,
        m,
        folds=folds,
        seed=seed,
        profile=profile,
        n_points=points,
        progress=lambda i, n, label: bar.update(task, completed=i, description=label),
    )
    paths = write_report(ev, out, title=f"Router evaluation ({folds}-fold CV by query)")
    console.print(summary_table(ev), highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False, soft_wrap=True)


def _leave_task_out(scorers: list, extra: dict, m, profile, points: int, out: Path, bar) -> None:
    """Per held-out task: AIQ (± sd over 5 parts of its queries) and joules at the best single model's
    accuracy of every method; the per-task table of all methods, then each task's full table; written to
    ``out/leave_task_out.md`` and printed."""
    from litellm_energy_router.training.crossval import leave_task_out, lto_table
    from litellm_energy_router.training.report import summary_table
    from litellm_energy_router.training.selection import (
        Stacked,
        scorer_factories,
        selectable,
        stack_bases,
    )

    methods = {**extra, **scorer_factories(scorers)}
    for n in scorers:
        if selectable()[n][1].combines:  # the stack: fitted per held-out task on the bases judged (else all bases)
            methods[n] = lambda b=stack_bases(scorers) or stack_bases(): Stacked(b)
    task = bar.add_task("leave-task-out", total=len(m.task_names()) * len(methods))
    try:
        evs = leave_task_out(
            methods,
            m,
            profile=profile,
            n_points=points,
            progress=lambda i, n, label: bar.update(task, completed=i, description=label),
        )
    except ValueError as e:
        fail(str(e))
    parts = [
        "# Leave-task-out evaluation",
        "",
        "Each method is trained on all tasks but one and judged on the held-out task's queries with the task "
        "hidden (an unseen task: no task prior; `task_prior` is then the pooled prior of the other tasks). "
        "AIQ ± sd over 5 random parts of the held-out queries; J ratio = joules at the best single "
        "candidate's accuracy on that task / that candidate's joules.",
        "",
        lto_table(evs),
    ]
    for t, ev in evs.items():
        parts += ["", f"## held-out task: {t} ({ev.n} queries)", "", summary_table(ev)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "leave_task_out.md").write_text("\n".join(parts) + "\n")
    console.print("\n".join(parts), highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'leave_task_out.md'}", highlight=False)


def _off_policy(url: str, ckpts: dict, settings, lam: Optional[float], out: Path) -> None:
    """IPS / SNIPS estimates of each checkpoint on the table's logged production rows (with propensities)."""
    import json

    from litellm_energy_router.training.ope import (
        evaluate_checkpoint_on_log,
        logged_rows,
    )

    base = settings.knob.base()
    knob = base if lam is None else base.model_copy(update={"lambda_": lam, "target_accuracy": None})
    lam = knob.lambda_
    with _store(url, create=False) as store:
        rows = logged_rows(store.iter_runs(sources=["production"]))
    if not rows:
        console.print("off-policy: no logged production rows with score, energy and propensity", highlight=False)
        return
    report = {}
    for name, pred in ckpts.items():
        est = evaluate_checkpoint_on_log(None, pred.model, knob=knob, epsilon=settings.router.epsilon, rows=rows)
        if est is None:
            console.print(
                f"off-policy: {name}: no logged row with query text names one of its candidates", highlight=False
            )
            continue
        report[name] = {"lambda": lam, **est.as_dict()}
        for line in est.lines(f"off-policy estimate of {name} at λ={lam:g}"):
            console.print(line, highlight=False, soft_wrap=True)
    if report:
        (out / "off_policy.json").write_text(json.dumps(report, indent=2))
