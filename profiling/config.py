"""The tournament config: candidates, tasks, sampling, concurrency, generation, energy, judge.

Example (``config_examples/tournament.yaml``)::

    candidates:                        # LiteLLM model_list entries (+ table metadata)
      - model_name: mistral-7b
        litellm_params: {model: hosted_vllm/mistralai/Mistral-7B-Instruct-v0.2, api_base: http://gpu1:8000/v1}
        params_b: 7.2
        energy_profile_key: mistralai/mistral-7b-chat
    tasks: [mmlu, gsm8k, {name: mbpp, sample_size: 100}]   # built-in or a plugin's (docs/plugins.md)
    sample_size: 200                   # items per task (None = all)
    seed: 0
    concurrency: 8                     # requests in flight per candidate
    generation: {temperature: 0.0}
    energy: {meter: estimate}          # or nvml / a plugin's counter meter (+ gpus: [...], options: {...})
    judge: {model_name: judge, litellm_params: {model: openai/gpt-4o, api_key: os.environ/OPENAI_API_KEY}}

``os.environ/VAR`` values are resolved as in a LiteLLM config. Errors are one line naming the file
and key (:class:`~litellm_energy_router.settings.ConfigError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from litellm_energy_router.errors import one_line
from litellm_energy_router.plugins import task_factories
from litellm_energy_router.settings import (
    ConfigError,
    EnergySettings,
    TableSettings,
    read_yaml_section,
    resolve_env_refs,
)

from .sandbox import SandboxConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Deployment(_Model):
    """A LiteLLM ``model_list`` entry. ``model_name`` is the candidate's key in the table."""

    model_name: str = Field(min_length=1, max_length=200)
    litellm_params: dict[str, Any] = Field(default_factory=dict, description="passed to litellm.Router as is")
    model_info: dict[str, Any] = Field(default_factory=dict)


class CandidateSpec(Deployment):
    """A candidate: a deployment plus what the table records about it."""

    model: str | None = Field(None, description="Hugging Face id or path; what vllm_offline mode loads")
    params_b: float | None = Field(None, ge=0, description="total parameters, billions")
    active_params_b: float | None = Field(None, ge=0, description="active parameters per token, billions")
    hardware: str | None = None
    energy_profile_key: str | None = Field(None, description="entry of the energy profile (default: model_name)")
    concurrency: int | None = Field(None, ge=1, description="requests in flight for this candidate")


class TaskSpec(_Model):
    name: str
    source: str | None = Field(None, description=".jsonl/.json file or HF dataset 'path[:config][@split]'")
    sample_size: int | None = Field(None, ge=1, description="items drawn from this task (default: top level)")
    max_tokens: int | None = Field(None, ge=1, description="generation budget, tokens (default: the task's)")


class GenerationSettings(_Model):
    max_tokens: int | None = Field(None, ge=1, description="tokens; None = each task's default")
    temperature: float = Field(0.0, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    timeout_s: float = Field(120.0, gt=0, description="per request, seconds")
    num_retries: int = Field(2, ge=0, description="LiteLLM retries per request")
    extra: dict[str, Any] = Field(default_factory=dict, description="more litellm completion kwargs (seed, stop...)")


class TournamentEnergy(EnergySettings):
    """The settings' energy section (any registered counter meter, plugins' included), plus the GPU label."""

    gpu: str | None = Field(None, description="label written to the runs' gpu column, e.g. '1x H100 80GB'")

    @field_validator("meter")
    @classmethod
    def _a_counter(cls, v: str) -> str:
        if v == "agent":  # the agent answers per request; a tournament reads a cumulative counter itself
            raise ValueError(
                "'agent': a tournament reads the GPU counter of the node it runs on; use nvml there (with "
                "energy.gpus), or estimate"
            )
        return v


class JudgeSpec(Deployment):
    model_name: str = "judge"
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0)


class TournamentConfig(_Model):
    """A tournament: every (sampled) item of every task x every candidate."""

    candidates: list[CandidateSpec] = Field(min_length=1)
    tasks: list[TaskSpec] = Field(min_length=1)
    sample_size: int | None = Field(None, ge=1, description="items per task; None = all")
    seed: int = 0
    concurrency: int = Field(4, ge=1, description="requests in flight per candidate")
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    energy: TournamentEnergy = Field(default_factory=TournamentEnergy)
    judge: JudgeSpec | None = None
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    table: TableSettings | None = Field(None, description="default: the settings' table (ENERGY_ROUTER_TABLE__URL...)")
    mode: Literal["litellm", "vllm_offline"] = Field("litellm", description="vllm_offline: one GPU, models one by one")
    vllm: dict[str, Any] = Field(default_factory=dict, description="vllm.LLM(...) kwargs in vllm_offline mode")
    batch_size: int = Field(64, ge=1, description="prompts per vLLM batch in vllm_offline mode")
    prefill_token_weight: float = Field(
        0.125, ge=0, description="energy of a prompt token relative to an output token when a batch's joules are split"
    )

    @field_validator("tasks", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return [{"name": t} if isinstance(t, str) else t for t in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _check(self) -> "TournamentConfig":
        names = [c.model_name for c in self.candidates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"candidate model_name {dup[0]!r} appears twice")
        if self.judge and self.judge.model_name in names:
            raise ValueError(f"judge model_name {self.judge.model_name!r} is also a candidate")
        tasks = [t.name for t in self.tasks]
        if len(set(tasks)) != len(tasks):
            raise ValueError("a task is listed twice")
        known = task_factories()
        if unknown := [t for t in tasks if t not in known]:
            raise ValueError(f"task {unknown[0]!r} is not registered (known: {', '.join(sorted(known)) or 'none'})")
        if self.mode == "litellm":
            missing = [c.model_name for c in self.candidates if not c.litellm_params.get("model")]
            if missing:
                raise ValueError(f"candidate {missing[0]!r}: litellm_params.model is required")
        elif missing := [c.model_name for c in self.candidates if not c.model]:
            raise ValueError(f"candidate {missing[0]!r}: 'model' (HF id or path) is required in vllm_offline mode")
        return self

    def concurrency_of(self, cand: CandidateSpec) -> int:
        return cand.concurrency or self.concurrency


def load_tournament_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TournamentConfig:
    """Read and validate a tournament YAML (``tournament:`` key if present, else the document)."""
    origin = str(path)
    data = read_yaml_section(path, "tournament")
    data = {**data, **(overrides or {})}
    try:
        data = resolve_env_refs(data)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None
    return parse_tournament_config(data, origin)


def parse_tournament_config(data: dict[str, Any], origin: str = "tournament config") -> TournamentConfig:
    try:
        return TournamentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, origin, key="config key")) from None
