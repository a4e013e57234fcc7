"""One settings tree for the whole plugin.

Sources, later ones winning:

1. defaults (the embedded, offline setup: SQLite file, bundled energy profile, ``estimate`` meter);
2. a YAML file, under its top-level ``energy_router:`` key (a file without that key is refused);
3. environment variables ``ENERGY_ROUTER_<SECTION>__<KEY>`` (``__`` separates levels, e.g.
   ``ENERGY_ROUTER_TABLE__URL=postgresql+psycopg://db/router``; names are case-insensitive, list and
   mapping values are JSON or YAML flow, variables naming no section are ignored). Read by
   pydantic-settings.

Any string value ``os.environ/VAR`` is replaced by the value of environment variable ``VAR``, as in a
LiteLLM config. Invalid input raises :class:`ConfigError` whose message is one line naming the key and
the bad value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from litellm_energy_router.budgets import BudgetSettings, check_budget_sources
from litellm_energy_router.energy.carbon import CarbonSettings
from litellm_energy_router.errors import UserError, one_line, reading
from litellm_energy_router.knob import KnobSettings

ENV_PREFIX = "ENERGY_ROUTER_"
DEFAULT_TABLE_URL = "sqlite:///energy_router.db"


class ConfigError(UserError, ValueError):
    """A configuration problem; ``str(err)`` is a single line naming the key and the value."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TableSettings(_Section):
    """Where the tournament table lives."""

    url: str = Field(DEFAULT_TABLE_URL, description="SQLAlchemy URL: sqlite:///file.db or postgresql+psycopg://...")

    @field_validator("url")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if not (v.startswith("sqlite:") or v.startswith("postgresql")):
            raise ValueError("must start with sqlite:/// or postgresql")
        return v


class CandidateSettings(_Section):
    """One candidate deployment of the pool."""

    name: str = Field(description="LiteLLM model/deployment name; the key used in the table")
    model: str | None = Field(None, description="underlying model id, e.g. a Hugging Face id")
    params_b: float | None = Field(None, ge=0, description="total parameters, billions")
    active_params_b: float | None = Field(None, ge=0, description="parameters active per token, billions")
    hardware: str | None = Field(None, description="e.g. '1x H100 80GB'")
    deployment_id: str | None = Field(None, description="LiteLLM model_info.id, when matching by id")
    context_tokens: int | None = Field(
        None,
        ge=1,
        description="context length, tokens (prompt + output): bounds the "
        "energy estimate; a deployment's model_info.max_input_tokens overrides it",
    )


class RouterSettings(_Section):
    """The learned router at serving time."""

    checkpoint: Path | None = Field(None, description="checkpoint directory or pointer file")
    timeout_ms: float = Field(
        50.0, gt=0, allow_inf_nan=False, description="decision budget, milliseconds; over it we fail open"
    )
    batch_wait_ms: float = Field(0.0, ge=0, description="idle wait for company (micro-batch), ms; 0 = next loop turn")
    cache_size: int = Field(4096, ge=0, description="LRU entries keyed by prompt hash")
    threads: int = Field(
        1, ge=1, description="torch threads for scoring; 1 keeps OpenMP spin-waits off the proxy's cores"
    )
    scorer: str = Field(
        "auto",
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="scorer kind (router/scoring.py): auto = the checkpoint's own; student, lm, task_prior, knn, logreg or a plugin's",
    )
    fallback: str | None = Field(None, description="deployment used when the router fails; None = LiteLLM's choice")
    match_by: Literal["id", "name"] = "name"
    epsilon: float = Field(0.0, ge=0, le=1, description="exploration rate, so logged propensities are never 0")
    epsilon_new_context: float = Field(
        0.0,
        ge=0,
        le=1,
        description="exploration rate of a context without production rows, falling to epsilon over its first "
        "NEW_CONTEXT_ROWS (router/online.py); 0 = epsilon throughout",
    )
    explore: Literal["energy", "aimed"] = Field(
        "energy",
        description="where explored requests go: energy = the candidates production has priced least; aimed = "
        "half of it to those likely the best choice given a context's rows (router/online.py)",
    )
    online: bool = Field(
        True, description="learn between retrains: Ê from settled rows, a prior per context (router/adapt.py)"
    )
    context_refresh_s: float = Field(
        300.0, ge=0, description="seconds between reads of new table rows for the context prior; 0 = never"
    )
    context_rows: bool = Field(
        False,
        description="a context's own labelled rows move P on every request, not only without "
        "support (router/adapt.py); off: mixed results in docs/unseen_traffic.md",
    )


class EnergySettings(_Section):
    """How joules are obtained.

    ``nvml`` and ``simulated`` meters are sampled in-process (the proxy runs on the GPU host); ``agent``
    asks the GPU-node agent (``energy-router agent``) over HTTP; ``estimate`` uses the profile. A plugin's
    meter (see ``docs/plugins.md``) is sampled in-process like ``nvml``, built with ``options``. Per-request
    attribution weights: ``prefill_weight`` per prompt token and ``decode_weight`` per output token.
    """

    meter: str = Field("estimate", description="'estimate', 'nvml', 'agent', 'simulated' or a plugin's meter name")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the meter's factory")
    profile: Path | None = Field(None, description="energy profile YAML; None = the bundled ML.ENERGY H100 profile")
    agent_url: str | None = Field(None, description="GPU-node agent base URL, e.g. http://gpu-node:9400")
    agent_urls: dict[str, str] = Field(
        default_factory=dict,
        description="candidate -> the agent of the GPU node serving it (a pool over several nodes); others: agent_url",
    )
    agent_token: str | None = Field(None, description="bearer token of the agent (client and server side)")
    agent_timeout_s: float = Field(2.0, gt=0, description="HTTP timeout of one agent call, seconds")
    agent_ca_bundle: Path | None = Field(
        None, description="client: PEM CA bundle an https agent_url is verified with; None = system CAs"
    )
    agent_tls_cert: Path | None = Field(
        None, description="agent: PEM certificate chain; with agent_tls_key it serves https"
    )
    agent_tls_key: Path | None = Field(None, description="agent: PEM private key of agent_tls_cert")
    agent_max_requests: int = Field(
        20_000,
        ge=1,
        le=10_000_000,
        description="attribution (the agent's, and the proxy's own nvml/simulated meter): requests tracked at most "
        "(oldest dropped first)",
    )
    agent_stale_s: float = Field(
        300.0,
        gt=0,
        allow_inf_nan=False,
        description="attribution (the agent's, and the proxy's own nvml/simulated meter): an unfinished request silent "
        "this long expires (a request the callback never finished would hold back every later row's settling), s",
    )
    agent_max_body_bytes: int = Field(
        256 * 1024, ge=1024, le=64 * 1024 * 1024, description="agent: largest POST body read, bytes"
    )
    agent_max_clock_skew_s: float = Field(
        30.0, gt=0, le=3600, allow_inf_nan=False, description="agent: how far callers' timestamps may lead its clock, s"
    )
    gpus: list[int] | None = Field(None, description="GPU indices metered (nvml); None = all")
    sample_hz: float = Field(10.0, ge=1, le=100, description="meter sampling rate for attribution, Hz")
    prefill_weight: float = Field(
        0.125,
        ge=0,
        allow_inf_nan=False,
        description="attribution weight of one prompt token (decode token = decode_weight)",
    )
    decode_weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="attribution weight of one output token")
    idle_power_w: Annotated[float, Field(ge=0, allow_inf_nan=False)] | Literal["auto"] = Field(
        0.0, description="static power line, W, charged to idle while requests run; 'auto' = lowest 1 s power seen"
    )
    history_s: float = Field(
        600.0, gt=0, allow_inf_nan=False, description="seconds of meter intervals/requests kept for attribution"
    )
    settle_timeout_s: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="max seconds a row waits for its energy to settle"
    )
    fallback_to_estimate: bool = Field(True, description="use the profile estimate when a measured meter has no answer")

    @field_validator("meter")
    @classmethod
    def _registered_meter(cls, v: str) -> str:
        from litellm_energy_router.plugins import (
            meter_factories,  # entry points are read on first use, not at import
        )

        factories = meter_factories()
        if v not in factories:
            raise ValueError(f"energy meter {v!r} is not registered (known: {', '.join(sorted(factories)) or 'none'})")
        return v

    @field_validator("idle_power_w")
    @classmethod
    def _nonneg_power(cls, v: float | str) -> float | str:
        if isinstance(v, (int, float)) and v < 0:
            raise ValueError("must be >= 0 or 'auto'")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> "EnergySettings":
        if (self.agent_tls_cert is None) != (self.agent_tls_key is None):
            missing = "agent_tls_key" if self.agent_tls_key is None else "agent_tls_cert"
            raise ValueError(f"energy.agent_tls_cert and energy.agent_tls_key go together ({missing} is not set)")
        return self


class WriterSettings(_Section):
    """The callback's non-blocking table writer: bounded queue -> batched inserts; a local spool when
    the table is unreachable, replayed exactly once when it returns."""

    queue_size: int = Field(10_000, ge=1, description="rows held in memory before spilling to the spool")
    batch_size: int = Field(500, ge=1, description="rows per table transaction")
    flush_interval_s: float = Field(0.5, gt=0, description="max seconds a row waits before a batch is written")
    spool_dir: Path = Field(Path("energy_router_spool"), description="directory of the append-only spool files (0700)")
    spool_max_mb: float = Field(
        1024.0,
        gt=0,
        description="cap on the spool's size on disk, MiB; beyond it the oldest rows are dropped (counted)",
    )
    retry_max_s: float = Field(5.0, gt=0, description="max backoff between reconnection attempts, seconds")
    task: str = Field("production", min_length=1, max_length=64, description="task name of production queries")


class FeedbackSettings(_Section):
    """Quality labels for production rows, keyed by LiteLLM call id."""

    token: str | None = Field(None, description="operator bearer token: labels any call (use os.environ/...)")
    caller_keys: bool = Field(
        False, description="also take a LiteLLM virtual key as the bearer: it labels only the calls made with that key"
    )
    host: str = "127.0.0.1"
    port: int = Field(9401, ge=1, le=65535)


class PrivacySettings(_Section):
    """What the callback writes about a production query."""

    store_text: bool = Field(
        False, description="store query text (table, spool, rejected rows); otherwise only its salted SHA-256"
    )
    salt: str = Field(
        "",
        description="salt for the query hash (use os.environ/ENERGY_ROUTER_SALT); empty = generated once, kept in salt_file",
    )
    salt_file: Path | None = Field(
        None, description="file (0600) holding the generated salt; None = <writer.spool_dir>/salt"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class ShadowSettings(_Section):
    """Shadow sampling: a fraction of production queries queued for a later shadow tournament.

    Queue file format (JSON Lines, append-only), one object per query:
    ``{"query_id": str, "task": str, "text": str, "call_id": str | null, "created": float (Unix s)}``.
    """

    fraction: float = Field(0.0, ge=0, le=1, description="share of production queries queued")
    new_context_requests: int = Field(
        0,
        ge=0,
        le=100_000,
        description="also queue the first N requests of each context key (an app) this process serves, at most N "
        "per authenticated key (requests with no identity, or on a proxy that checks no keys, share one N): "
        "a shadow tournament of them labels every candidate for the app "
        "(docs/unseen_traffic.md); 0 = off",
    )
    queue_path: Path = Field(Path("energy_router_shadow.jsonl"), description="JSONL queue file (0600: it holds text)")
    max_mb: float = Field(
        64.0,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="queue file bound, MB: sampled queries are not queued beyond it (a shadow tournament takes "
        "the entries it ran out of the file)",
    )


class AccountingSettings(_Section):
    """Per-request energy and carbon figures and the ledger (docs/accounting.md)."""

    reference: str | None = Field(
        None,
        description="candidate whose estimated joules 'saved' is measured against; None = the pool's most energy-hungry",
    )
    headers: bool = Field(True, description="x-energy-router-* response headers (proxy)")
    ledger: bool = Field(True, description="keep the per key/team/user/model group/deployment/day ledger in the table")


class Settings(BaseSettings):
    """The whole tree; build it with :func:`load_settings` (file, environment, ``os.environ/`` references)."""

    model_config = SettingsConfigDict(
        extra="forbid", populate_by_name=True, env_prefix=ENV_PREFIX, env_nested_delimiter="__"
    )

    table: TableSettings = Field(default_factory=TableSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    candidates: list[CandidateSettings] = Field(default_factory=list)
    knob: KnobSettings = Field(default_factory=KnobSettings)
    energy: EnergySettings = Field(default_factory=EnergySettings)
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)
    writer: WriterSettings = Field(default_factory=WriterSettings)
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    carbon: CarbonSettings = Field(default_factory=CarbonSettings)
    accounting: AccountingSettings = Field(default_factory=AccountingSettings)
    budgets: BudgetSettings = Field(default_factory=BudgetSettings)

    @model_validator(mode="after")
    def _budgets_can_see_their_spend(self) -> "Settings":
        check_budget_sources(self.budgets, self.accounting.ledger, self.carbon)
        return self


def resolve_env_refs(value: Any, environ: Mapping[str, str] | None = None, path: str = "") -> Any:
    """Replace every ``os.environ/VAR`` string (at any depth) by the environment value."""
    environ = os.environ if environ is None else environ
    if isinstance(value, str) and value.startswith("os.environ/"):
        var = value[len("os.environ/") :]
        if var not in environ:
            raise ConfigError(
                f"config key '{path or '<root>'}': environment variable {var!r} is not set (value {value!r})"
            )
        return environ[var]
    if isinstance(value, Mapping):
        return {k: resolve_env_refs(v, environ, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env_refs(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


class _EnvOverrides(EnvSettingsSource):
    """The ``ENERGY_ROUTER_<SECTION>__<KEY>`` variables of ``environ`` as a nested dict (pydantic-settings'
    environment source reading a given mapping; list and mapping values decoded as YAML, a superset of
    JSON). ``ENERGY_ROUTER_CONFIG`` names no section, so it is not a key."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or type(e).__name__
            raise ValueError(
                f"environment value of config key '{field_name}' = {value!r}: not valid JSON or YAML ({problem})"
            ) from None


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml_section(
    path: str | Path, key: str, *, whole_if_absent: bool = True, required: bool = False
) -> dict[str, Any]:
    """The mapping under ``key`` of a YAML file (when ``key`` is absent: the whole document, or ``{}``
    with ``whole_if_absent=False``; refused with ``required=True``).
    Raises :class:`ConfigError` with one line naming the file (and line) on any problem."""
    try:
        with reading(path):
            doc = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(doc).__name__}")
    if required and key not in doc:
        raise ConfigError(
            f"{path}: no top-level '{key}:' key (found: {', '.join(map(str, doc)) or 'an empty file'}); "
            f"the settings go under '{key}:'"
        )
    data = doc.get(key, doc if whole_if_absent else {})
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: config key '{key}' must be a mapping")
    return data


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build :class:`Settings` from defaults, an optional YAML file and ``ENERGY_ROUTER_*`` variables.

    ``path`` defaults to ``$ENERGY_ROUTER_CONFIG`` when set.
    """
    environ = os.environ if environ is None else environ
    path = path or environ.get("ENERGY_ROUTER_CONFIG")
    data: dict[str, Any] = {}
    origin = "environment"
    if path:
        origin = str(path)
        data = read_yaml_section(path, "energy_router", required=True)
    try:
        data = _merge(data, _EnvOverrides(environ)())
    except SettingsError as e:
        raise ConfigError(f"{origin}: {e.__cause__ or e}") from None
    try:
        data = resolve_env_refs(data, environ)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, origin, key="config key")) from None
