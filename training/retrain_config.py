"""The ``retrain:`` section of the config file (:class:`RetrainConfig`) and its loader
(:func:`load_retrain_config`), which fills the fields left empty from the ``energy_router:`` section: the
table URL, the checkpoint pointer, the knob (λ: accuracy per the settings' e_ref_j) and the exploration
rate. What a run does with it: :mod:`.retrain`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from litellm_energy_router.errors import one_line
from litellm_energy_router.settings import ConfigError, Settings, load_settings, read_yaml_section

from .sampling import TrainingBudget
from .train_config import TrainSection


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
    quick: bool = Field(False, description="a short training (tiny backbone, few steps; tests, smoke runs)")
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
    resamples: int = Field(
        200,
        ge=0,
        le=10_000,
        description="paired bootstrap resamples of the held-out queries: a difference whose 95 % interval holds 0 is a "
        "tie, and a tie promotes (the fresher checkpoint); 0 = compare the point figures only",
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
    """Read ``retrain:`` (and the defaults it borrows from ``energy_router:``) from a YAML file (default:
    ``$ENERGY_ROUTER_CONFIG``, as the settings: its ``retrain:`` section was ignored)."""
    path = path or os.environ.get("ENERGY_ROUTER_CONFIG") or None
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
            where = f"{path}: " if path else "retrain: no config (-c) and no --pointer: "
            raise ConfigError(
                f"{where}set retrain.pointer or energy_router.router.checkpoint (the pointer serving watches)"
            )
        cfg.pointer = Path(settings.router.checkpoint)
    base = settings.knob.base()
    cfg.knob = base if cfg.lam is None else base.model_copy(update={"lambda_": cfg.lam, "target_accuracy": None})
    cfg.lam = settings.knob.lambda_ if cfg.lam is None else cfg.lam
    cfg.epsilon = settings.router.epsilon if cfg.epsilon is None else cfg.epsilon
    return cfg
