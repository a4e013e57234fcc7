"""The ``retrain.train:`` section: what ``retrain`` trains, validated, mapped onto
:class:`~.pipeline.TrainConfig`.

Every key is optional; a key left out keeps the base configuration's value. The base is
``TrainConfig()`` (the shipped default), or ``TrainConfig.quick()`` when ``retrain.quick`` is true (a
seconds-long tiny backbone for smoke runs). ``retrain.grpo_steps: N`` is still honoured (GRPO on with N
steps) when ``train.grpo`` is absent; setting both is an error. Example::

    retrain:
      train:
        backbone: {name: tiny, hidden_size: 96, layers: 2, vocab_size: 1024}
        sft: {epochs: 3, batch_size: 16, learning_rate: 0.002}
        grpo: {enabled: true, steps: 100}
        max_len: 96
        probe_c: 0.3        # null: no probe head
        student: true
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def given(self, *exclude: str) -> dict[str, Any]:
        """The keys the config file set (the others keep the base configuration's values)."""
        return {k: getattr(self, k) for k in self.model_fields_set if k not in exclude}


class BackboneSection(_Section):
    """``train.backbone``: :class:`~.backbones.BackboneSpec`."""

    name: str = Field("tiny", min_length=1, description="tiny, minilm, or hf:<model id or path>")
    hidden_size: int = Field(128, ge=8, le=4096, description="tiny backbone only: hidden size")
    layers: int = Field(2, ge=1, le=48, description="tiny backbone only: transformer layers")
    vocab_size: int = Field(4096, ge=64, le=262144, description="tiny backbone only: BPE vocabulary trained on the queries")
    seed: int = 0


class SFTSection(_Section):
    """``train.sft``: :class:`~.sft.SFTStageConfig`."""

    epochs: float = Field(4.0, gt=0, le=1000)
    batch_size: int = Field(16, ge=1, le=4096)
    learning_rate: float = Field(2e-3, gt=0, lt=1)
    task_dropout: float = Field(0.25, ge=0, le=1)
    seed: int = 0


class GRPOSection(_Section):
    """``train.grpo``: the GRPO stage after SFT (:class:`~.grpo.GRPOStageConfig`); ``enabled: false`` (or
    the section left out) skips it."""

    enabled: bool = True
    steps: int = Field(200, ge=1, le=1_000_000)
    num_generations: int = Field(6, ge=2, le=64)
    prompts_per_step: int = Field(4, ge=1, le=1024)
    learning_rate: float = Field(5e-4, gt=0, lt=1)
    temperature: float = Field(1.0, gt=0, le=10)
    seed: int = 0


class TrainSection(_Section):
    """``retrain.train``: the training configuration (see the module docstring)."""

    backbone: BackboneSection | None = None
    sft: SFTSection | None = None
    grpo: GRPOSection | None = None
    max_len: int | None = Field(None, ge=16, le=8192, description="router input length, tokens")
    calib_fraction: float | None = Field(None, gt=0, lt=1, description="share of training queries held out of SFT for calibration")
    student: bool | None = Field(None, description="distil the serving student")
    probe_c: float | None = Field(0.3, gt=0, description="probe head strength; null: no probe head")
    seed: int | None = None
    partial_feedback: bool | None = Field(None, description="train the probe head, student and energy estimate on every "
                                          "labelled (query, candidate) run, production rows weighted by inverse propensity")  # fmt: skip

    def build(self, *, quick: bool = False, grpo_steps: int = 0) -> Any:
        """The :class:`~.pipeline.TrainConfig` this section names, over the default (or quick) one."""
        from .grpo import GRPOStageConfig
        from .pipeline import TrainConfig

        if grpo_steps and self.grpo is not None:
            raise ValueError("retrain: set either grpo_steps or train.grpo, not both")
        tc = TrainConfig.quick() if quick else TrainConfig()
        if self.backbone is not None:
            tc.backbone = dataclasses.replace(tc.backbone, **self.backbone.given())
        if self.sft is not None:
            tc.sft = dataclasses.replace(tc.sft, **self.sft.given())
        if self.grpo is not None:
            g = self.grpo
            tc.grpo = dataclasses.replace(GRPOStageConfig(), **g.given("enabled")) if g.enabled else None
        elif grpo_steps:
            tc.grpo = GRPOStageConfig(steps=grpo_steps)
        for k, v in self.given("backbone", "sft", "grpo").items():
            if v is not None or k == "probe_c":
                setattr(tc, k, v)
        return tc
