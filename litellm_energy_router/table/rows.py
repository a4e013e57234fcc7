"""Validated row types of the tournament table.

Units: seconds for latency/TTFT, joules (J) for energy, watts (W) for power, tokens as counts,
``created`` as Unix seconds (UTC). ``score`` is correctness in [0, 1] (1 = correct); ``None`` means
"no label yet" (e.g. a production row awaiting feedback or a shadow tournament).
"""

from __future__ import annotations

import hashlib
import time
from typing import Annotated, Any, Iterable, Literal, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from litellm_energy_router.errors import UserError, one_line

# how a row's joules were obtained: a meter's ``method`` (``estimate``, ``nvml_counter``, ``power_sampling``,
# ``agent``, ``simulated`` or a plugin meter's own); whether it is measured is the meter registry's answer
# (:func:`litellm_energy_router.energy.meter.is_measured`), not a list here
ENERGY_METHOD_PATTERN = r"^[a-z][a-z0-9_]{0,15}$"
EnergyMethod = Annotated[str, StringConstraints(pattern=ENERGY_METHOD_PATTERN)]
Source = Literal["tournament", "production", "shadow", "import"]
SOURCES: tuple[str, ...] = Source.__args__  # type: ignore[attr-defined]


MAX_TOKENS = 2**31 - 1  # a token count the table's INTEGER columns hold on every backend (PostgreSQL: int4)


class BadRowError(UserError, ValueError):
    """A row failed validation. The message is one line naming the row and the field."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no inf J, s, W or g


class Candidate(_Row):
    """A candidate deployment: ``name`` is the LiteLLM deployment/model name."""

    name: str = Field(min_length=1, max_length=200)
    model: str | None = None
    params_b: float | None = Field(None, ge=0, description="total parameters, billions")
    active_params_b: float | None = Field(None, ge=0, description="active parameters per token, billions")
    hardware: str | None = None


class Query(_Row):
    """A query. ``text`` may be omitted for privacy; ``text_hash`` is then the only trace of it."""

    id: str = Field(min_length=1, max_length=200)
    task: str = Field(min_length=1, max_length=64)
    text: str | None = None
    text_hash: str = Field(min_length=64, max_length=64)
    reference: str | None = None
    source: Source = "tournament"
    created: float = Field(default_factory=time.time)


class Run(_Row):
    """One (query, candidate, source) outcome. Upserts replace the previous row with the same key."""

    query_id: str = Field(min_length=1, max_length=200)
    candidate: str = Field(min_length=1, max_length=200)
    source: Source
    score: float | None = Field(None, ge=0, le=1, description="correctness in [0, 1]")
    latency_s: float | None = Field(None, ge=0, description="end-to-end latency, seconds")
    ttft_s: float | None = Field(None, ge=0, description="time to first token, seconds")
    prompt_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    completion_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)
    energy_j: float | None = Field(None, ge=0, description="GPU energy, joules")
    avg_power_w: float | None = Field(None, ge=0, description="average GPU power over the request, watts")
    energy_method: EnergyMethod | None = None
    gpu: str | None = None
    propensity: float | None = Field(None, gt=0, le=1, description="router's probability of this choice")
    call_id: str | None = Field(None, max_length=200, description="LiteLLM call id (production rows)")
    status: Literal["success", "failure"] | None = None
    grade_note: str | None = Field(
        None, max_length=200, description="a caveat on how the score was obtained, e.g. code graded without isolation"
    )
    created: float = Field(default_factory=time.time)
    router_version: str | None = Field(
        None, max_length=100, description="checkpoint version whose decision served this run (production rows only)"
    )
    energy_estimate_j: float | None = Field(
        None, ge=0, description="router's decision-time estimate for this candidate, J"
    )
    energy_reference_j: float | None = Field(
        None, ge=0, description="router's estimate for the reference deployment, J"
    )
    co2e_g: float | None = Field(None, ge=0, description="grams CO2e of energy_j (x PUE x grid intensity)")
    site: str | None = Field(None, max_length=100, description="site of the deployment that served it")
    context: str | None = Field(
        None, max_length=64, description="hashed context keys of a production run (router/context.py)"
    )
    key_hash: str | None = Field(
        None, max_length=200, description="LiteLLM's user_api_key_hash of the key that made a production run"
    )


def text_hash(text: str, salt: str = "") -> str:
    """SHA-256 hex of ``salt + text`` (UTF-8; lone surrogates are encoded as-is, never an error)."""
    return hashlib.sha256((salt + text).encode("utf-8", "surrogatepass")).hexdigest()


def make_query(id: str, task: str, text: str, *, store_text: bool = True, salt: str = "", **kw: Any) -> Query:
    """Build a :class:`Query`, hashing ``text`` and keeping it only when ``store_text``."""
    return Query(id=id, task=task, text=text if store_text else None, text_hash=text_hash(text, salt), **kw)


R = TypeVar("R", bound=_Row)


def _describe(kind: str, i: int, item: Any) -> str:
    if isinstance(item, dict):
        key = {k: item.get(k) for k in ("id", "query_id", "candidate", "name", "source") if item.get(k) is not None}
    elif isinstance(item, BaseModel):
        key = {k: getattr(item, k) for k in ("id", "query_id", "candidate", "name", "source") if hasattr(item, k)}
    else:
        key = {}
    keys = ", ".join(f"{k}={v!r}" for k, v in key.items())
    return f"{kind} row {i}" + (f" ({keys})" if keys else "")


def validate_rows(model: type[R], items: Iterable[R | dict[str, Any]], kind: str, offset: int = 0) -> list[R]:
    """Validate every item (dicts are coerced); raise :class:`BadRowError` on the first bad one.

    ``offset`` shifts the reported row numbers (e.g. to file line numbers).
    """
    out: list[R] = []
    for i, item in enumerate(items):
        if isinstance(item, model):
            out.append(item)
            continue
        try:
            out.append(model.model_validate(item))
        except ValidationError as e:
            raise BadRowError(one_line(e, _describe(kind, i + offset, item), whole="<row>")) from None
    return out


def check_references(runs: Sequence[Run], candidates: set[str], queries: set[str], offset: int = 0) -> None:
    """Raise :class:`BadRowError` for a run naming an unknown candidate or query."""
    for i, r in enumerate(runs):
        if r.candidate not in candidates:
            raise BadRowError(
                f"{_describe('runs', i + offset, r)}: field 'candidate' = {r.candidate!r}: unknown candidate"
            )
        if r.query_id not in queries:
            raise BadRowError(f"{_describe('runs', i + offset, r)}: field 'query_id' = {r.query_id!r}: unknown query")
