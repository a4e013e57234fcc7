"""The built-in scorer kinds as a plugin (entry point ``builtin_scorers``): names -> :class:`ScorerSpec`
whose factories are :func:`lazy`, so listing them imports none (the ``lm`` kind's torch and transformers
load only when a checkpoint is served with it; the training stack only when one is trained).

This is the one place the built-in scorer names are written: serving, ``train --scorer``,
cross-validation, model selection and ``eval`` read them from the registry.
"""

from __future__ import annotations

from functools import partial

from litellm_energy_router.plugins import ScorerSpec, hookimpl, lazy

_BASELINE = lazy("litellm_energy_router.router.baseline_scorers:BaselineScorer")
_FIT = lazy("litellm_energy_router.training.baselines:baseline_trainer")


def _baseline(kind: str, cls_name: str, rank: int) -> ScorerSpec:
    """A baseline of ``training/baselines.py`` (class ``cls_name``), served from its exported arrays."""
    return ScorerSpec(load=_BASELINE, fit=partial(_FIT, cls_name, kind), default=True, rank=rank, stack_base=True)


@hookimpl
def energy_router_scorers() -> dict:
    lm_fit = lazy("litellm_energy_router.training.pipeline:lm_trainer")
    lm_export = lazy("litellm_energy_router.training.pipeline:export_lm")
    return {
        "student": ScorerSpec(
            load=lazy("litellm_energy_router.router.scoring:StudentScorer"),
            fit=partial(lm_fit, "student"),
            export=lm_export,
            rank=5,
            baseline=False,
            select_as="router",
        ),
        "lm": ScorerSpec(
            load=lazy("litellm_energy_router.router.model:lm_scorer"),
            fit=partial(lm_fit, "lm"),
            export=lm_export,
            rank=6,
            baseline=False,
        ),
        "task_prior": _baseline("task_prior", "TaskPrior", 0),
        "knn": _baseline("knn", "KNN", 2),
        "logreg": _baseline("logreg", "LogReg", 1),
        "mf": _baseline("mf", "MatrixFactorization", 3),
        "stacked": ScorerSpec(
            load=_BASELINE,
            fit=lazy("litellm_energy_router.training.selection:stack_trainer"),
            export=lazy("litellm_energy_router.training.selection:export_stack"),
            default=True,
            rank=4,
            baseline=False,
            combines=True,
        ),
    }
