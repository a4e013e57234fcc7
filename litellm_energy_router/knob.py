"""The knob of one request (λ, target accuracy, energy budget) and the policy on what a caller may change.

Precedence: the request's metadata ``energy_router`` (``{"lambda": 0.3}``, ``{"target_accuracy": 0.9}``,
``{"max_energy_j": 50}``) beats its key's default (``knob.per_key``), which beats the global ``knob``.
The key is read from the metadata the LiteLLM proxy writes after authentication: ``user_api_key_alias``,
then ``user_api_key_team_alias``, ``user_api_key_team_id``, ``user_api_key_user_id`` (the proxy strips
caller-sent ``user_api_key_*`` fields; in the SDK the application sets them). The first matching
``per_key`` entry gives the knob defaults; the first matching entry with a ``policy`` gives the policy,
merged over ``knob.policy``.

A request value is a caller error, raised as :class:`KnobError` (HTTP 400 from the proxy, naming the
field), when it is not a JSON number (``null`` = not given), not finite, outside the key's range, a field
the key may not override, or an unknown field.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .decision import KNOB_KEY
from .metrics import counts_knob_refusals
from .settings import KnobOverride, KnobPolicy, KnobSettings

KEY_FIELDS = ("user_api_key_alias", "user_api_key_team_alias", "user_api_key_team_id", "user_api_key_user_id")
RANGES = {"lambda": "lambda_range", "target_accuracy": "target_range", "max_energy_j": "max_energy_j_range"}


class KnobError(ValueError):
    """An invalid request knob. LiteLLM reads ``status_code`` (the proxy answers 400 with ``message`` and
    ``param``; the router does not retry) — ``str(err)`` is one line naming the field."""

    status_code = 400
    type = "invalid_request_error"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.param = f"metadata.{KNOB_KEY}" + ("" if field == KNOB_KEY else f".{field}")
        self.message = f"energy-router: {self.param} {problem}"
        super().__init__(self.message)


def metadata_dicts(request_kwargs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The metadata dicts of a request (SDK and proxy ``metadata``, proxy ``litellm_metadata``)."""
    if not request_kwargs:
        return []
    return [v for k in ("metadata", "litellm_metadata") if isinstance(v := request_kwargs.get(k), dict)]


def key_entries(knob: KnobSettings, mds: list[dict[str, Any]]) -> list[tuple[str, KnobOverride]]:
    """The ``per_key`` entries matching the request's key, most specific first."""
    out = []
    for md in mds:
        for f in KEY_FIELDS:
            v = md.get(f)
            if v is not None and (entry := knob.per_key.get(str(v))) is not None:
                out.append((str(v), entry))
    return out


def policy_for(knob: KnobSettings, entries: list[tuple[str, KnobOverride]]) -> tuple[KnobPolicy, str | None]:
    """(the policy of the request's key, that key's name or ``None`` for the default)."""
    for name, entry in entries:
        if entry.policy is not None:
            return knob.policy.merged(entry.policy), name
    return knob.policy, None


def _shown(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _checked(value: Any, field: str, policy: KnobPolicy, who: str | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KnobError(field, f"= {_shown(value)} is not a number")
    v = float(value)
    if not math.isfinite(v):
        raise KnobError(field, f"= {_shown(value)} is not a finite number")
    lo, hi = getattr(policy, RANGES[field])
    if not lo <= v <= hi:
        where = f"key {who!r}" if who else "knob.policy"
        raise KnobError(field, f"= {v:g} is out of range [{lo:g}, {hi:g}] ({where})")
    return v


def request_values(md: dict[str, Any], policy: KnobPolicy, who: str | None) -> dict[str, float]:
    """The validated knob fields of one metadata dict (``{}`` when it has none); raises :class:`KnobError`."""
    req = md.get(KNOB_KEY)
    if req is None:
        return {}
    if not isinstance(req, Mapping):
        raise KnobError(KNOB_KEY, 'must be an object such as {"lambda": 0.3}')
    for k in req:
        if k not in RANGES:
            raise KnobError(re.sub(r"[^\w.-]", "?", str(k))[:64], f"is not a knob field (known: {', '.join(RANGES)})")
    given = {k: v for k, v in req.items() if v is not None}
    if given and not policy.allow_override:
        field = next(iter(given))
        raise KnobError(field, f"may not be overridden by key {who!r}" if who else "may not be overridden (knob.policy)")
    return {k: _checked(v, k, policy, who) for k, v in given.items()}


@counts_knob_refusals  # energy_router_knob_refusals_total{field}
def resolve_knob(knob: KnobSettings,
                 request_kwargs: Mapping[str, Any] | None) -> tuple[float, float | None, float | None]:  # fmt: skip
    """(λ, target accuracy or None, energy budget J or None) of a request; raises :class:`KnobError`."""
    lam, target, budget = knob.lambda_, knob.target_accuracy, knob.max_energy_j
    mds = metadata_dicts(request_kwargs)
    entries = key_entries(knob, mds)
    if entries:
        ov = entries[0][1]
        lam = ov.lambda_ if ov.lambda_ is not None else lam
        target = ov.target_accuracy if ov.target_accuracy is not None else target
        budget = ov.max_energy_j if ov.max_energy_j is not None else budget
    policy, who = policy_for(knob, entries)
    for md in mds:
        req = request_values(md, policy, who)
        if "lambda" in req:
            lam, target = req["lambda"], None  # an explicit λ replaces an inherited target
        target = req.get("target_accuracy", target)
        budget = req.get("max_energy_j", budget)
    return lam, target, budget
