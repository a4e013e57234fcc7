"""K-fold cross-validation by query of any :class:`~.baseline_base.Predictor`, baselines included, in one run.

For each fold, every method is fitted on the training queries and predicts ``P`` for the test queries;
the routing-time energy estimate ``Ê`` comes from :func:`~.energy_fit.fit_energy_estimate` on the same
training queries (a predictor may supply its own with ``predict_energy(test) -> Ê[n, K]`` in J).
Test-fold predictions are pooled and swept with the shared decision rule by :func:`~.evaluate.evaluate`.

The lead's router plugs in as a factory::

    ev = cross_validate({"lm-router": lambda: MyRouter(...), **baseline_factories()}, matrix, folds=5)
    write_report(ev, "out/")
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .baselines import Predictor, baseline_names, make_baseline
from .data import TableMatrix, concat_rows, kfold, load_matrix, near_duplicate_groups
from .energy_fit import estimate_energy, fit_energy_estimate
from .evaluate import Evaluation, evaluate

Factory = Callable[[], Predictor]


def baseline_factories(names: list[str] | None = None, **kw: Any) -> dict[str, Factory]:
    """Factories for the registered baselines (default: all), sharing keyword arguments ``kw``."""
    return {n: (lambda n=n: make_baseline(n, **kw)) for n in (names or baseline_names())}


def cross_validate(
    methods: Mapping[str, Factory] | Factory,
    matrix: TableMatrix | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    profile: Any = None,
    n_points: int = 41,
    progress: Callable[[int, int, str], None] | None = None,
) -> Evaluation:
    """Cross-validate ``methods`` (name → factory, or one factory, named "router") on ``matrix``
    (default: the bundled RouterBench development rows) with ``folds`` folds by query, stratified by task;
    near-duplicate queries (:func:`~.data.near_duplicate_groups`, e.g. WinoGrande's twins) share a fold.

    Returns the :class:`~.evaluate.Evaluation` of the pooled held-out predictions, with per-fold AIQ,
    and notes giving each method's fit time, held-out Brier score and tuned hyperparameters.
    ``progress(done, total, label)`` is called before each (fold, method) fit.
    """
    if callable(methods) and not isinstance(methods, Mapping):
        methods = {"router": methods}
    m = matrix if matrix is not None else routerbench_matrix(profile=profile)
    splits = cv_splits(m, folds, seed)
    oof = out_of_fold(methods, m, splits, profile=profile, progress=progress)
    P, Eh, secs, params, e_refs = oof.P, oof.Eh, oof.seconds, oof.params, oof.e_refs
    routers = {name: (P[name], Eh[name]) for name in methods}
    ev = evaluate(
        m.Y, m.E, routers, m.candidates, e_ref=float(np.mean(e_refs)), n_points=n_points, folds=[te for _, te in splits]
    )
    for name in methods:
        chosen = f"; hyperparameters per fold: {params[name]}" if params[name] else ""
        ev.notes.append(
            f"{name}: fit+predict {secs[name]:.1f} s over {folds} folds; held-out Brier {ev.method(name).calibration.brier:.4f}{chosen}"
        )
    return ev


def cv_splits(m: TableMatrix, folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The CV folds of ``m``: by query, stratified by task, near-duplicates in one fold."""
    return kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), folds, seed=seed, groups=m.tasks)


@dataclass
class OutOfFold:
    """Held-out predictions of each method over every row of a matrix: ``P[name]``, ``Eh[name]`` (J),
    fit+predict seconds, tuned hyperparameters per fold, and each fold's λ scale ``e_refs`` (J)."""

    P: dict[str, np.ndarray]
    Eh: dict[str, np.ndarray]
    seconds: dict[str, float]
    params: dict[str, list[Any]]
    e_refs: list[float]
    splits: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def out_of_fold(
    methods: Mapping[str, Factory],
    m: TableMatrix,
    splits: list[tuple[np.ndarray, np.ndarray]],
    *,
    profile: Any = None,
    progress: Callable[[int, int, str], None] | None = None,
    energy: Callable[[TableMatrix, TableMatrix], np.ndarray] | None = None,
    partial: TableMatrix | None = None,
) -> OutOfFold:
    """Fit every method on each fold's training rows and predict its test rows. ``energy(train, test)``
    gives the default Ê (J) of a method without ``predict_energy`` (default: :func:`~.energy_fit.fit_energy_estimate`).
    ``partial``: queries only partial feedback labels (never tested on), added to every fold's training rows
    of the methods that fit a partial matrix (``accepts_partial``)."""
    P = {name: np.full((m.n, m.K), np.nan) for name in methods}
    Eh = {name: np.full((m.n, m.K), np.nan) for name in methods}
    secs = {name: 0.0 for name in methods}
    params: dict[str, list[Any]] = {name: [] for name in methods}
    e_refs = []
    for f, (tr, te) in enumerate(splits):
        train, test = m.subset(tr), m.subset(te)
        e_default = energy(train, test) if energy else estimate_energy(fit_energy_estimate(train, profile), test)
        e_refs.append(float(train.E.mean(axis=0).max()))  # J: what the pipeline stores as knob.e_ref_j
        for j, (name, factory) in enumerate(methods.items()):
            if progress:
                progress(f * len(methods) + j, len(splits) * len(methods), f"fold {f + 1}/{len(splits)}: {name}")
            t0 = time.perf_counter()
            pred = factory()
            pred = pred.fit(concat_rows(train, partial) if getattr(pred, "accepts_partial", False) else train)
            p = np.asarray(pred.predict_proba(test), dtype=np.float64)
            secs[name] += time.perf_counter() - t0
            if p.shape != (test.n, m.K):
                raise ValueError(f"method {name!r}: predict_proba returned shape {p.shape}, expected {(test.n, m.K)}")
            P[name][te] = p
            Eh[name][te] = pred.predict_energy(test) if hasattr(pred, "predict_energy") else e_default
            if getattr(pred, "params", None):
                params[name].append(pred.params)
    return OutOfFold(P, Eh, secs, params, e_refs, list(splits))


def routerbench_matrix(db_url: str | None = None, *, profile: Any = None) -> TableMatrix:
    """The bundled RouterBench development rows (6 open models, energy from the profile) as a matrix.

    Imports them into ``db_url`` (default: a temporary SQLite file) and reads them back through the
    table, the same path production rows take.
    """
    from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench

    from litellm_energy_router.energy.profile import load_profile
    from litellm_energy_router.table import open_store

    prof = profile if profile is not None else load_profile()
    with tempfile.TemporaryDirectory() as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'routerbench.db'}"
        store = open_store(url)
        try:
            import_routerbench(store, bundled_files(), prof)
            return load_matrix(store)
        finally:
            store.close()


def read_decisions(
    path: str | Path, m: TableMatrix, *, id_format: str = "routerbench:{eval_name}:{row}"
) -> tuple[np.ndarray, np.ndarray]:
    """``(P[n, K], Ê[n, K] in J)`` for the rows of ``m`` from an ``energy-router route`` output file.

    Each JSON line carries ``row``, ``eval_name``, ``scores`` and ``energy_j`` per candidate; the query id
    is ``id_format`` filled with them (the RouterBench import's ids by default). Every row of ``m`` must
    appear; the knob values in the file do not matter (``P`` and ``Ê`` are the same at every point), so
    :func:`~.evaluate.evaluate` sweeps the same decision rule over the whole curve.
    """
    import json

    pos = {str(q): i for i, q in enumerate(m.ids)}
    P = np.full((m.n, m.K), np.nan)
    Eh = np.full((m.n, m.K), np.nan)
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                qid = id_format.format(**rec)
                scores, energy = rec["scores"], rec["energy_j"]
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{n}: not a decision line ({e})") from None
            i = pos.get(qid)
            if i is None:
                continue  # a row the table does not hold (or not fully labelled)
            try:
                P[i] = [float(scores[c]) for c in m.candidates]
                Eh[i] = [float(energy[c]) for c in m.candidates]
            except KeyError as e:
                raise ValueError(f"{path}:{n}: no score for candidate {e.args[0]!r}") from None
    missing = int(np.isnan(P).any(axis=1).sum())
    if missing:
        first = str(m.ids[int(np.flatnonzero(np.isnan(P).any(axis=1))[0])])
        raise ValueError(f"{path}: {missing} of {m.n} table queries have no decision line (first: {first!r})")
    return P, Eh


def leave_task_out(
    methods: Mapping[str, Factory],
    matrix: TableMatrix,
    *,
    profile: Any = None,
    n_points: int = 41,
    chunks: int = 5,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Evaluation]:
    """For every task: fit each method on the other tasks' queries and judge it on this task's, with the
    task hidden (as production traffic of a task the table has never seen: the predictors get
    :data:`~litellm_energy_router.router.format.UNKNOWN_TASK`, so no task prior can help; text only).

    Returns task → :class:`~.evaluate.Evaluation` on that task's queries. Its per-fold AIQ is over
    ``chunks`` random parts of the held-out queries (near-duplicates together): the spread of the
    judgement, not of the training (one fit per held-out task).
    """
    from litellm_energy_router.router.format import UNKNOWN_TASK

    tasks = matrix.task_names()
    if len(tasks) < 2:
        raise ValueError(f"leave-task-out needs at least 2 tasks; the table has {tasks}")
    out: dict[str, Evaluation] = {}
    for i, t in enumerate(tasks):
        train, test = matrix.subset(np.flatnonzero(matrix.tasks != t)), matrix.subset(np.flatnonzero(matrix.tasks == t))
        test.tasks = np.array(
            [UNKNOWN_TASK] * test.n, dtype=matrix.tasks.dtype if matrix.tasks.dtype.kind == "O" else object
        )
        e_default = estimate_energy(fit_energy_estimate(train, profile), test)
        routers = {}
        for j, (name, factory) in enumerate(methods.items()):
            if progress:
                progress(i * len(methods) + j, len(tasks) * len(methods), f"held-out task {t}: {name}")
            pred = factory().fit(train)
            P = np.asarray(pred.predict_proba(test), dtype=np.float64)
            routers[name] = (P, pred.predict_energy(test) if hasattr(pred, "predict_energy") else e_default)
        parts = [
            te
            for _, te in kfold(near_duplicate_groups(test.texts, test.ids, test.tasks), min(chunks, test.n), seed=seed)
        ]
        out[t] = evaluate(
            test.Y,
            test.E,
            routers,
            matrix.candidates,
            e_ref=float(train.E.mean(axis=0).max()),
            n_points=n_points,
            folds=parts,
        )
    return out


def lto_table(evs: Mapping[str, Evaluation]) -> str:
    """Markdown, one row per method (the zero router first), one column per held-out task: AIQ ± sd over
    the parts and joules at the task's best single candidate's accuracy as a ratio to its joules."""
    tasks = list(evs)
    names = [m.name for m in next(iter(evs.values())).methods if m.kind in ("zero", "router")]
    head = "| method | " + " | ".join(f"{t}: AIQ | {t}: J ratio" for t in tasks) + " | mean AIQ |"
    lines = [head, "|---|" + "---|" * (2 * len(tasks) + 1)]
    for name in names:
        cells, aiqs = [], []
        for t in tasks:
            ev = evs[t]
            r = ev.method(name)
            sd = f" ± {np.std(r.aiq_folds, ddof=1):.4f}" if len(r.aiq_folds) > 1 else ""
            j = r.joules_at_best / ev.best_energy
            cells += [f"{r.aiq:.4f}{sd}", f"{j:.3f}" if np.isfinite(j) else "never"]
            aiqs.append(r.aiq)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {np.mean(aiqs):.4f} |")
    return "\n".join(lines)
