"""Model selection: serve the best scorer the table can prove.

Every selectable scorer is fitted on the same CV folds of the training rows and judged on the held-out
folds over the whole knob range: AIQ (pooled held-out curve, and per fold), joules at the best single
candidate's accuracy (pooled, and per fold as a ratio to that candidate's joules), Brier score. The one
with the highest pooled AIQ is chosen; its margin over the runner-up is reported with the spread of the
paired per-fold AIQ differences (a margin inside that spread is a tie, and is written as one). Retrain
exports the chosen one as its candidate checkpoint (:func:`select_and_export`); ``energy-router eval``
prints the same table (:func:`selection_table`).

Scorers: every trainable kind of the scorer registry (:func:`selectable`; a plugin's kind with a ``fit``
is selectable, exported and served like the built-ins, see :class:`~litellm_energy_router.plugins.ScorerSpec`).
The built-ins:

* ``router`` — the LM router as served (its distilled student); ``lm`` — the same training scored with
  the LM forward (slow on CPU: only when asked);
* ``task_prior``, ``knn``, ``logreg``, ``mf`` — :mod:`.baselines` (hyperparameters by inner CV);
* ``stacked`` (the registry's ``combines`` kind) — per candidate, a logistic regression on the logits of the baselines' out-of-fold ``P``
  (:func:`fit_stack`). In the CV it is *cross-fitted*: the stack judged on fold f is fitted on the other
  folds' out-of-fold predictions, so no row's label enters its own prediction. Exported, its bases are
  refitted on every training row and its weights are the ones fitted on all out-of-fold predictions;
  served by the ``stacked`` scorer kind (:mod:`litellm_energy_router.router.baseline_scorers`, numpy).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from litellm_energy_router.plugins import ScorerSpec, trainable_scorers
from litellm_energy_router.router.baseline_scorers import stack_features, stack_proba

from .baselines import make_baseline
from .crossval import Factory, OutOfFold, cv_splits, out_of_fold
from .data import MatrixError, TableMatrix
from .evaluate import Evaluation, evaluate
from .selection_result import (  # noqa: F401 (re-exported)
    Selection,
    choose,
    scorer_rows,
    selection_line,
    selection_table,
    summary_lines,
)


def selectable() -> dict[str, tuple[str, ScorerSpec]]:
    """Selectable scorer name -> (registry kind, :class:`~litellm_energy_router.plugins.ScorerSpec`): the
    registry's trainable kinds (the student is selected as ``router``)."""
    return trainable_scorers()


def default_scorers() -> list[str]:
    """The scorers judged when none are named (the registry's ``default`` ones)."""
    return [n for n, (_, s) in selectable().items() if s.default]


def stack_bases(names: Sequence[str] | None = None) -> list[str]:
    """The registry's ``stack_base`` scorers (among ``names`` when given), in registration order."""
    return [n for n, (_, s) in selectable().items() if s.stack_base and (names is None or n in names)]


Log = Callable[[str], None]
# what an exported baseline answers for a task it never saw: "model" (its text features, task one-hot all
# zero) or "prior" (the pooled prior); chosen on `eval --leave-task-out` (docs/training.md, Unseen tasks)
UNKNOWN_TASK_FALLBACK = "prior"


def check_scorers(names: Sequence[str]) -> list[str]:
    """The names, checked: each selectable, no duplicate, at least one."""
    out = [str(n).strip() for n in names if str(n).strip()]
    known = selectable()
    bad = [n for n in out if n not in known]
    if bad:
        raise ValueError(f"scorer {bad[0]!r}: not selectable (have: {', '.join(known)})")
    if not out or len(set(out)) != len(out):
        raise ValueError(f"scorers {out}: need at least one, each once")
    return out


# -- the stack ---------------------------------------------------------------------------------------


def fit_stack(Ps: Sequence[np.ndarray], Y: np.ndarray, *, l2: float = 1.0, iters: int = 50) -> np.ndarray:
    """``stack_w[K, B + 1]``: per candidate, an L2-regularised logistic regression (Newton steps; the
    intercept unpenalised) of the scores ``Y[:, k]`` on the clipped logits of the bases' ``P[:, k]``."""
    X = stack_features(Ps)
    n, K, d = X.shape
    W = np.zeros((K, d))
    reg = l2 * np.eye(d)
    reg[-1, -1] = 0.0
    for k in range(K):
        x, y = X[:, k], np.asarray(Y[:, k], dtype=np.float64)
        w = np.zeros(d)
        w[-1] = np.log((y.mean() + 1e-3) / (1 - y.mean() + 1e-3))
        for _ in range(iters):
            p = 1.0 / (1.0 + np.exp(-(x @ w)))
            g = x.T @ (p - y) + reg @ w
            H = x.T @ (x * (p * (1 - p))[:, None]) + reg + 1e-6 * np.eye(d)
            step = np.linalg.solve(H, g)
            w -= step
            if np.abs(step).max() < 1e-9:
                break
        W[k] = w
    return W


def cross_fit_stack(
    P: Mapping[str, np.ndarray], Y: np.ndarray, splits: Sequence[tuple[np.ndarray, np.ndarray]], bases: Sequence[str]
) -> np.ndarray:
    """Held-out ``P`` of the stack: for each fold, weights fitted on the other folds' out-of-fold ``P``."""
    out = np.full(Y.shape, np.nan)
    for tr, te in splits:
        w = fit_stack([P[b][tr] for b in bases], Y[tr])
        out[te] = stack_proba([P[b][te] for b in bases], w)
    return out


class Stacked:
    """The stack as a :class:`~.baseline_base.Predictor`. ``fit`` fits the weights on ``inner_folds``-fold
    out-of-fold predictions of the bases on the training rows (unless ``stack_w`` is given), then refits
    every base on all training rows."""

    uses_embeddings = True

    def __init__(
        self,
        bases: Sequence[str] | None = None,
        *,
        embedder: Any = None,
        inner_folds: int = 3,
        seed: int = 0,
        stack_w: np.ndarray | None = None,
    ) -> None:
        self.bases = list(stack_bases() if bases is None else bases)
        self.embedder, self.inner_folds, self.seed = embedder, inner_folds, seed
        self.stack_w = stack_w
        self.params: dict[str, Any] = {}

    def _factories(self) -> dict[str, Factory]:
        return {b: (lambda b=b: make_baseline(b, embedder=self.embedder, seed=self.seed)) for b in self.bases}

    def fit(self, train: TableMatrix) -> "Stacked":
        if self.stack_w is None:
            splits = cv_splits(train, min(self.inner_folds, train.n), self.seed + 7)
            oof = out_of_fold(self._factories(), train, splits, energy=lambda tr, te: np.zeros((te.n, te.K)))
            self.stack_w = fit_stack([oof.P[b] for b in self.bases], train.Y)
        self.models = {b: f().fit(train) for b, f in self._factories().items()}
        self.params = {
            "bases": self.bases,
            "base_params": {b: m.params for b, m in self.models.items()},
            "stack_w": np.round(self.stack_w, 4).tolist(),
        }
        return self

    def predict_proba(self, test: TableMatrix) -> np.ndarray:
        return stack_proba([np.clip(self.models[b].predict_proba(test), 0, 1) for b in self.bases], self.stack_w)

    def export_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"bases": np.array(self.bases, dtype=str), "stack_w": self.stack_w}
        for b, m in self.models.items():
            out.update({f"{b}__{k}": v for k, v in m.export_arrays().items()})
        return out


# -- selection ---------------------------------------------------------------------------------------


def stack_trainer(*, embedder: Any = None, seed: int = 0, **_context: Any) -> Stacked:
    """The ``fit`` of the ``stacked`` registry entry: the stack over every registered ``stack_base`` scorer."""
    return Stacked(stack_bases(), embedder=embedder, seed=seed)


def scorer_factories(
    names: Sequence[str], *, train_config: Any = None, embedder: Any = None, seed: int = 0, log: Log = lambda s: None
) -> dict[str, Factory]:
    """Factories for the selectable scorers in ``names`` (a ``combines`` scorer is cross-fitted, not fitted here)."""
    known = selectable()
    share: dict = {}  # router and lm: one training per fold, judged with both scorers
    ctx = {"train_config": train_config, "embedder": embedder, "seed": seed, "log": log, "share": share}
    return {n: (lambda f=known[n][1].fit: f(**ctx)) for n in names if not known[n][1].combines}


def select(
    m: TableMatrix,
    scorers: Sequence[str] | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    train_config: Any = None,
    profile: Any = None,
    embedder: Any = None,
    n_points: int = 41,
    extra: Mapping[str, Factory] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    per_query_energy: bool = True,
    log: Log = lambda s: None,
    partial: TableMatrix | None = None,
) -> Selection:
    """Cross-validate ``scorers`` (plus ``extra`` methods, judged but never chosen) on ``m`` and choose.
    ``partial``: queries only partial feedback labels, added to the training rows of every fold for the
    scorers that fit them (the baselines; the router's probe and student see them when it is exported)."""
    names = check_scorers(default_scorers() if scorers is None else scorers)
    known = selectable()
    bases = stack_bases(names)
    stack = next((n for n in names if known[n][1].combines), None)  # the stack, cross-fitted on the bases
    if stack is not None and len(bases) < 2:
        raise ValueError(f"scorer {stack!r} needs at least two of {', '.join(stack_bases())} among the scorers")
    if m.n < max(folds, 2):
        raise MatrixError(f"selection: {m.n} training queries cannot make {folds} folds (select_folds): label more")
    splits = cv_splits(m, folds, seed)
    methods = {
        **(extra or {}),
        **scorer_factories(names, train_config=train_config, embedder=embedder, seed=seed, log=log),
    }
    oof: OutOfFold = out_of_fold(methods, m, splits, profile=profile, progress=progress, partial=partial)
    stack_w = _add_stack(oof, m, splits, stack, bases) if stack is not None else None
    order = list(extra or {}) + names
    ev = evaluate(
        m.Y,
        m.E,
        {n: (oof.P[n], oof.Eh[n]) for n in order},
        m.candidates,
        e_ref=float(np.mean(oof.e_refs)),
        n_points=n_points,
        folds=[te for _, te in splits],
    )
    rows = scorer_rows(ev, names, oof.seconds)
    tokens = _per_query_energy(m, splits, oof, ev, names, n_points, profile) if per_query_energy else None
    sel = choose(ev, rows, names, known, folds, stack_w, bases, dict(oof.seconds), tokens)
    log(selection_line(sel))
    return sel


def _add_stack(
    oof: OutOfFold, m: TableMatrix, splits: Sequence[tuple[np.ndarray, np.ndarray]], stack: str, bases: list[str]
) -> np.ndarray:
    """Cross-fit the stack into ``oof`` (its held-out P; Ê (J) of the first base; fit seconds: the bases'
    plus its own) and return its weights fitted on all the bases' out-of-fold P."""
    t0 = time.perf_counter()
    oof.P[stack] = cross_fit_stack(oof.P, m.Y, splits, bases)
    oof.Eh[stack] = oof.Eh[bases[0]]
    stack_w = fit_stack([oof.P[b] for b in bases], m.Y)
    oof.seconds[stack] = sum(oof.seconds[b] for b in bases) + time.perf_counter() - t0
    return stack_w


def _per_query_energy(
    m: TableMatrix,
    splits: Sequence[tuple[np.ndarray, np.ndarray]],
    oof: OutOfFold,
    ev0: Evaluation,
    names: Sequence[str],
    n_points: int,
    profile: Any,
) -> dict[str, Any]:
    """The token model judged on the same folds: output-token MAE per candidate (per-task mean vs model) and
    every scorer's pooled AIQ / joules at the best single's accuracy with the per-query Ê, with the paired
    per-fold AIQ difference (mean, sd) against the per-task Ê (``ev0``)."""
    from .energy_fit import fit_energy_estimate
    from .token_fit import token_errors

    t0 = time.perf_counter()
    errors, offsets = token_errors(m, splits)
    Eh = np.full((m.n, m.K), np.nan)
    for tr, te in splits:
        test = m.subset(te)
        est = fit_energy_estimate(m.subset(tr), profile)
        Eh[te] = est.estimate(m.candidates, test.prompt_tokens, list(test.tasks), offset_tokens=offsets[te])
    ev = evaluate(
        m.Y,
        m.E,
        {n: (oof.P[n], Eh) for n in names},
        m.candidates,
        e_ref=float(np.mean(oof.e_refs)),
        n_points=n_points,
        folds=[te for _, te in splits],
    )
    out: dict[str, Any] = {"token_mae": errors, "seconds": round(time.perf_counter() - t0, 1), "scorers": {}}
    for n in names:
        r = ev.method(n)
        d = np.asarray(r.aiq_folds) - np.asarray(ev0.method(n).aiq_folds)
        out["scorers"][n] = {
            "aiq": r.aiq,
            "joules_at_best": r.joules_at_best if np.isfinite(r.joules_at_best) else None,
            "aiq_delta_fold_mean": float(d.mean()),
            "aiq_delta_fold_sd": float(d.std(ddof=1)) if len(d) > 1 else None,
        }
    return out


# -- export ------------------------------------------------------------------------------------------


def export_stacked(
    m: TableMatrix,
    out_dir: str | Path,
    *,
    bases: Sequence[str] | None = None,
    stack_w: np.ndarray | None = None,
    embedder: Any = None,
    seed: int = 0,
    kind: str = "stacked",
) -> Path:
    """Fit the stack on ``m`` (weights ``stack_w`` when given, else fitted by inner CV) and write it as a
    ``stacked`` checkpoint. Returns the directory."""
    from .baselines import write_baseline_checkpoint
    from .embed import default_embedder

    emb = embedder or default_embedder()
    st = Stacked(stack_bases() if bases is None else bases, embedder=emb, seed=seed, stack_w=stack_w).fit(m)
    return write_baseline_checkpoint(kind, m, out_dir, st.export_arrays(), st.params, emb.name, st.predict_proba(m))


def export_stack(
    kind: str,
    m: TableMatrix,
    out_dir: str | Path,
    *,
    selection: "Selection | None" = None,
    seed: int = 0,
    **_context: Any,
) -> Path:
    """The ``export`` of the ``stacked`` registry entry: the selection's bases and weights when given."""
    if selection is None:
        return export_stacked(m, out_dir, seed=seed, kind=kind)
    return export_stacked(m, out_dir, bases=selection.bases, stack_w=selection.stack_w, seed=seed, kind=kind)


def select_and_export(
    m: TableMatrix,
    out_dir: str | Path,
    scorers: Sequence[str] | None = None,
    *,
    folds: int = 5,
    seed: int = 0,
    train_config: Any = None,
    log: Log = print,
    pairs: Any = None,
) -> Selection:
    """:func:`select` on ``m``, then write the chosen scorer, fitted on all of ``m``, into ``out_dir``
    with the selection in its manifest (``selection``). ``pairs`` (:class:`~.pairs.PairTable`): every labelled
    (query, candidate) run of the training queries; the queries only partial feedback labels join the
    training rows of the scorers that fit them, in the CV and in the export."""
    from litellm_energy_router.router.checkpoint import read_manifest, write_manifest

    from .baselines import export_baseline

    t0 = time.time()
    partial = None
    if pairs is not None:
        from .pairs import partial_only

        partial = partial_only(pairs, m)
    sel = select(m, scorers, folds=folds, seed=seed, train_config=train_config, log=log, partial=partial)
    log(f"selection: {len(sel.rows)} scorers on {folds} folds of {m.n} queries in {time.time() - t0:.0f} s")
    out = Path(out_dir)
    kind, spec = selectable()[sel.chosen]
    (spec.export or export_baseline)(
        kind, m, out, selection=sel, seed=seed, train_config=train_config, log=log, pairs=pairs, partial=partial
    )
    manifest = read_manifest(out)
    if manifest.baseline is not None:
        manifest.baseline["unknown_task"] = UNKNOWN_TASK_FALLBACK
    if sel.tokens is not None:  # per-query Ê served only when it does not lower the chosen scorer's AIQ
        from .token_fit import attach_token_model

        helps = sel.tokens["scorers"][sel.chosen]["aiq"] >= next(
            r["aiq"] for r in sel.rows if r["scorer"] == sel.chosen
        )
        manifest.tokens = attach_token_model(m, out, sel.tokens["token_mae"]) if helps else None
        sel.tokens["served"] = manifest.tokens is not None
        log(f"per-query energy: {'served' if sel.tokens['served'] else 'not served (per-task mean kept)'}")
    manifest.selection = sel.summary()  # type: ignore[attr-defined]
    write_manifest(out, manifest)
    return sel
