"""Energy profiles: per-candidate joules per prompt token and per output token.

A profile turns token counts into an energy **estimate**::

    energy_j = prompt_tokens * j_per_prompt_token + completion_tokens * j_per_output_token

It is what the ``estimate`` meter, the RouterBench import and the router's Ê_j use. The bundled
profile (``config_examples/energy_profile_mlenergy_h100.yaml``) is derived from ML.ENERGY
measurements; each entry documents its reference measurement.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from litellm_energy_router.errors import UserError, one_line, reading

BUNDLED_PROFILE = "energy_profile_mlenergy_h100.yaml"


class ProfileError(UserError, ValueError):
    """A profile file is missing or invalid; the message names the file and the field."""


class ModelEnergy(BaseModel):
    """Energy of one candidate. Joules per token (J/token)."""

    model_config = ConfigDict(extra="forbid")

    j_per_output_token: float = Field(gt=0, description="J per generated token (decode), all GPUs of the instance")
    j_per_prompt_token: float = Field(ge=0, description="J per prompt token (prefill), all GPUs of the instance")
    model: str | None = Field(None, description="checkpoint this candidate most likely serves")
    params_b: float | None = Field(None, ge=0, description="total parameters, billions")
    active_params_b: float | None = Field(None, ge=0, description="active parameters per token, billions")
    hardware: str | None = None
    reference: dict[str, Any] = Field(default_factory=dict, description="where the numbers come from")

    def estimate_j(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Estimated energy of one request, joules."""
        return prompt_tokens * self.j_per_prompt_token + completion_tokens * self.j_per_output_token


class EnergyProfile(BaseModel):
    """A set of :class:`ModelEnergy` keyed by candidate name."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    description: str = ""
    assumptions: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, ModelEnergy]

    def get(self, candidate: str, *, origin: str = "energy profile") -> ModelEnergy:
        try:
            return self.models[candidate]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise ProfileError(f"{origin}: no entry for candidate {candidate!r} (has: {known})") from None

    def estimate_j(self, candidate: str, prompt_tokens: int, completion_tokens: int) -> float:
        """Estimated energy of one request to ``candidate``, joules."""
        return self.get(candidate).estimate_j(prompt_tokens, completion_tokens)


def bundled_profile_path() -> Path:
    return Path(str(resources.files("litellm_energy_router.data").joinpath(BUNDLED_PROFILE)))


def load_profile(path: str | Path | None = None) -> EnergyProfile:
    """Load a profile YAML/JSON file; ``None`` loads the bundled ML.ENERGY H100 profile."""
    p = Path(path) if path is not None else bundled_profile_path()
    return _load(str(p.resolve()))


@lru_cache(maxsize=8)
def _load(path: str) -> EnergyProfile:
    try:
        with reading(path):
            doc = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: energy profile not found") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML ({getattr(e, 'problem', e)})") from None
    try:
        return EnergyProfile.model_validate(doc)
    except ValidationError as e:
        raise ProfileError(one_line(e, path)) from None


#: Output tokens assumed for a candidate without a measured chat length (the median of the bundled
#: profile's ML.ENERGY v2 chat averages, 376-469 tokens: ShareGPT prompts answered by the reference model).
CHAT_OUTPUT_TOKENS = 430.0


def chat_output_tokens(
    candidates: list[str] | tuple[str, ...], profile: EnergyProfile | None = None
) -> tuple[dict[str, float], str]:
    """The conservative per-candidate output-length prior (tokens) for traffic nothing else informs: the
    average output length the profile's reference measurement recorded on chat prompts
    (``reference.avg_output_tokens``, ML.ENERGY: ShareGPT), else :data:`CHAT_OUTPUT_TOKENS`. Chat answers
    are long, so a request the router knows nothing about is priced as a long one (never as the short
    answers of the tasks it was trained on). Returns (candidate → tokens, a one-line source)."""
    if profile is None:
        try:
            profile = load_profile()
        except ProfileError:
            profile = None
    models = profile.models if profile is not None else {}
    out, measured = {}, 0
    for c in candidates:
        v = (models[c].reference or {}).get("avg_output_tokens") if c in models else None
        ok = isinstance(v, (int, float)) and v > 0
        out[c], measured = (float(v) if ok else CHAT_OUTPUT_TOKENS), measured + ok
    return out, (
        f"chat-length prior: {measured} of {len(out)} candidates from the energy profile's measured chat "
        f"output length, the rest {CHAT_OUTPUT_TOKENS:.0f} tokens"
    )
