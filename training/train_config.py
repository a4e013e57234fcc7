"""The ``retrain.train:`` section: what ``retrain`` trains, validated, mapped onto
:class:`~.pipeline.TrainConfig`.

One definition per field: the sections are **derived** from the training dataclasses, beside their trainers
(:class:`~.backbones.BackboneSpec`, :class:`~.sft.SFTStageConfig`, :class:`~.grpo.GRPOStageConfig`,
:class:`~.pipeline.TrainConfig`): a key's name, type and default are the dataclass field's, its bounds the
field's ``metadata``, its description the class docstring's ``Attributes:`` entry. Adding a field to a
dataclass adds the key.

Every key is optional; a key left out keeps the base configuration's value. The base is
``TrainConfig()`` (the shipped default), or ``TrainConfig.quick()`` when ``retrain.quick`` is true (a
a short tiny-backbone run for smoke runs). ``retrain.grpo_steps: N`` is still honoured (GRPO on with N
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
import inspect
import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from .backbones import BackboneSpec, check_backbone_name
from .grpo import GRPOStageConfig
from .pipeline import TrainConfig
from .sft import SFTStageConfig

#: TrainConfig fields a config file does not set: the stages are sections of their own; the candidates, the
#: table sources and the warm-start checkpoint are the retrain run's (``retrain.warm_start`` etc.)
NOT_KEYS = ("backbone", "sft", "grpo", "candidates", "sources", "init_from")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def given(self, *exclude: str) -> dict[str, Any]:
        """The keys the config file set (the others keep the base configuration's values)."""
        return {k: getattr(self, k) for k in self.model_fields_set if k not in exclude}


def attribute_docs(cls: type) -> dict[str, str]:
    """Field → its ``Attributes:`` entry in ``cls``'s docstring (continuation lines joined)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    body = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    out: dict[str, str] = {}
    for name, text in re.findall(r"^ {4}(\w+): (.*(?:\n {8}.*)*)", body, re.MULTILINE):
        out[name] = " ".join(line.strip() for line in text.splitlines())
    return out


def section_of(dc: type, name: str, skip: tuple[str, ...] = (), **extra: Any) -> type[_Section]:
    """A section model with one key per field of the dataclass ``dc`` (but ``skip``): the field's type and
    default, its metadata as bounds, its docstring entry as description; ``extra``: more keys (pydantic
    ``(type, Field)`` pairs)."""
    hints, docs = typing.get_type_hints(dc), attribute_docs(dc)
    keys: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if f.name in skip:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        keys[f.name] = (hints[f.name], Field(default, description=docs.get(f.name), **dict(f.metadata)))
    return create_model(
        name, __base__=_Section, __doc__=f"``train`` section of :class:`{dc.__name__}`.", **keys, **extra
    )


class BackboneSection(section_of(BackboneSpec, "_BackboneKeys")):  # type: ignore[misc]
    """``train.backbone`` section of :class:`BackboneSpec`: its name checked against the backbone registry."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return check_backbone_name(v)


SFTSection = section_of(SFTStageConfig, "SFTSection")
GRPOSection = section_of(
    GRPOStageConfig,
    "GRPOSection",
    enabled=(bool, Field(True, description="run the GRPO stage (false: skip it, as when the section is left out)")),
)
_TrainKeys = section_of(
    TrainConfig,
    "_TrainKeys",
    skip=NOT_KEYS,
    backbone=(BackboneSection | None, Field(None, description="the backbone (BackboneSpec)")),
    sft=(SFTSection | None, Field(None, description="the SFT stage (SFTStageConfig)")),
    grpo=(GRPOSection | None, Field(None, description="the GRPO stage (GRPOStageConfig); absent: none")),
)


class TrainSection(_TrainKeys):  # type: ignore[misc, valid-type]
    """``retrain.train``: the training configuration (see the module docstring)."""

    def build(self, *, quick: bool = False, grpo_steps: int = 0) -> TrainConfig:
        """The :class:`~.pipeline.TrainConfig` this section names, over the default (or quick) one."""
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
            setattr(tc, k, v)
        return tc
