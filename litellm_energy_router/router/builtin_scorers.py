"""The built-in scorer kinds as a plugin (entry point ``builtin_scorers``): names -> lazy factories
``factory(checkpoint_dir, manifest) -> Scorer`` (:mod:`.scoring`), so listing them imports none
(the ``lm`` kind's torch and transformers load only when a checkpoint is served with it)."""

from __future__ import annotations

from ..plugins import hookimpl, lazy


@hookimpl
def energy_router_scorers() -> dict:
    baseline = lazy("litellm_energy_router.router.baseline_scorers:BaselineScorer")
    return {
        "student": lazy("litellm_energy_router.router.scoring:StudentScorer"),
        "lm": lazy("litellm_energy_router.router.model:lm_scorer"),
        "task_prior": baseline,
        "knn": baseline,
        "logreg": baseline,
        "mf": baseline,
        "stacked": baseline,
    }
