"""The knob: one frozen, validated type (:class:`Knob`), and everything derived from it.

:class:`Knob` is the only place the knob's fields are written (name, alias, bounds, default, meaning,
and where it may be set). From it are derived:

* the settings sections :data:`KnobSettings` (``knob``: every field, ``policy``, ``per_key``),
  :data:`KnobOverride` (``knob.per_key.<key>``: the fields a key may set), :data:`KnobPolicy` and
  :data:`KnobPolicyOverride` (a ``<field>_range`` per field a request may set);
* the request parser (:func:`resolve_knob`) and the policy's limits (:data:`RANGES`, :data:`RANGE_LIMITS`);
* the docs table (:func:`knob_table`, pasted into ``docs/serving.md`` and checked by a test).
The decision rule reads a :class:`Knob` (:func:`litellm_energy_router.router.decide.decide`).

**Adding a knob field** touches three files: a ``Field`` on :class:`Knob` here (with ``scope``: where it
may be set; a request-scoped number also names its policy range), its use in ``router/decide.py``, and
the table in ``docs/serving.md`` (``python -m litellm_energy_router.knob`` prints it).

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

import copy
import math
import re
from collections.abc import Mapping  # typing's Mapping makes every isinstance check several calls
from typing import Any, Literal, Optional, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic.fields import FieldInfo

from litellm_energy_router.litellm_glue.decision import KNOB_KEY
from litellm_energy_router.metrics import counts_knob_refusals
from litellm_energy_router.router.decide import DEFAULT_E_REF_J

KEY_FIELDS = ("user_api_key_alias", "user_api_key_team_alias", "user_api_key_team_id", "user_api_key_user_id")
# where a field may be set: per request (and below), per key (and global), global only
SCOPES = ("request", "key", "global")


def _field(
    default: Any,
    *,
    scope: str,
    description: str,
    policy: str | None = None,
    request_range: tuple[float, float] | None = None,
    **bounds: Any,
) -> Any:
    """A knob field: ``scope`` (see :data:`SCOPES`); a request-scoped number names its policy range
    setting ``policy`` and that range's default ``request_range``."""
    extra: dict[str, Any] = {"scope": scope}
    if policy is not None:
        extra.update(policy=policy, request_range=list(request_range or ()))
    return Field(default, description=description, json_schema_extra=extra, **bounds)


class Knob(BaseModel):
    """The accuracy/energy trade-off of one request, applied after prediction (``router/decide.py``).

    Attributes:
        lambda_: predicted accuracy (a fraction, 0-1) worth giving up to save ``e_ref_j`` joules per request.
        target_accuracy: when set, the cheapest candidate whose predicted success reaches it (wins over λ).
        max_energy_j: energy budget per request, J (estimated): costlier candidates are not considered.
        objective: ``joules`` or ``carbon`` (λ in accuracy per reference gram; ``router/decide.py``).
        e_ref_j: the energy unit of λ, J (a setting, never taken from a checkpoint).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    lambda_: float = _field(
        0.0,
        alias="lambda",
        ge=0,
        le=1000,
        scope="request",
        policy="lambda_range",
        request_range=(0.0, 1000.0),
        description="accuracy (a fraction, 0-1) given up to save e_ref_j joules; the router picks argmax P_j - λ·Ê_j/e_ref_j",
    )
    target_accuracy: Optional[float] = _field(
        None,
        ge=0,
        le=1,
        scope="request",
        policy="target_range",
        request_range=(0.0, 1.0),
        description="the cheapest candidate whose predicted success reaches it (wins over lambda)",
    )
    max_energy_j: Optional[float] = _field(
        None,
        gt=0,
        le=1e12,
        scope="request",
        policy="max_energy_j_range",
        request_range=(1e-9, 1e9),
        description="energy budget per request, J (estimated): costlier candidates are not considered (none fits: the cheapest)",
    )
    objective: Literal["joules", "carbon"] = _field(
        "joules",
        scope="request",
        description="what λ and the target weigh against accuracy: joules, or carbon (Ê x PUE x grid intensity of the "
        "cleanest site serving the candidate now, in reference grams: e_ref_j joules at carbon.reference_g_per_kwh)",
    )
    e_ref_j: float = _field(
        DEFAULT_E_REF_J,
        gt=0,
        le=1e12,
        scope="global",
        description="the energy unit of lambda, J; fixed in the settings, so λ means the same after every retrain",
    )

    @classmethod
    def point(cls, **values: Any) -> "Knob":
        """An operating point of a sweep (evaluation, ``route --sweep``), not checked: a λ grid may go past
        the bounds a caller may send. Field names (``lambda_``), the rest defaults."""
        return cls.model_construct(**values)


FIELDS: dict[str, FieldInfo] = dict(Knob.model_fields)


def _extra(name: str) -> dict[str, Any]:
    return FIELDS[name].json_schema_extra  # type: ignore[return-value]


def _alias(name: str) -> str:
    return FIELDS[name].alias or name


KEY_SCOPED = tuple(n for n in FIELDS if _extra(n)["scope"] in ("request", "key"))
REQUEST_FIELDS = {_alias(n): n for n in FIELDS if _extra(n)["scope"] == "request"}  # request field -> Knob field
RANGES = {
    a: _extra(n)["policy"] for a, n in REQUEST_FIELDS.items() if "policy" in _extra(n)
}  # request field -> policy range


def _limits(fi: FieldInfo) -> tuple[float, float, bool]:
    """(lowest lo, highest hi, lo must be > 0) of a field, from its bounds."""
    lo, hi, positive = -math.inf, math.inf, False
    for m in fi.metadata:
        if isinstance(m, at.Ge):
            lo = float(m.ge)
        elif isinstance(m, at.Gt):
            lo, positive = float(m.gt), True
        elif isinstance(m, at.Le):
            hi = float(m.le)
    return lo, hi, positive


# the widest bounds a policy range may set: (lowest lo, highest hi, lo must be > 0), from the field's own bounds
RANGE_LIMITS: dict[str, tuple[float, float, bool]] = {
    RANGES[a]: _limits(FIELDS[n]) for a, n in REQUEST_FIELDS.items() if a in RANGES
}
Range = tuple[float, float]


def _check_range(name: str, v: Range | None) -> Range | None:
    if v is None:
        return v
    lo, hi = v
    floor, ceil, positive = RANGE_LIMITS[name]
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi or lo < floor or hi > ceil or (positive and lo <= 0):
        raise ValueError(f"must be [lo, hi] with {floor:g} {'<' if positive else '<='} lo <= hi <= {ceil:g}")
    return (float(lo), float(hi))


# -- the settings sections, derived from Knob -----------------------------------------------------------

_SECTION = ConfigDict(extra="forbid", populate_by_name=True)


class _PolicyBase(BaseModel):
    model_config = _SECTION

    @field_validator(*RANGE_LIMITS, check_fields=False)
    @classmethod
    def _range(cls, v: Range | None, info: Any) -> Range | None:
        return _check_range(info.field_name, v)

    def merged(self, over: "_PolicyBase | None") -> Any:
        """This policy with the fields ``over`` sets replaced."""
        if over is None:
            return self
        return self.model_copy(update={k: v for k, v in over if v is not None})


KnobPolicyOverride: type[_PolicyBase] = create_model(  # type: ignore[call-overload]
    "KnobPolicyOverride",
    __base__=_PolicyBase,
    __module__=__name__,
    __doc__="One key's policy (``knob.per_key.<key>.policy``): the fields it sets replace the default's.",
    allow_override=(Optional[bool], None),
    **{r: (Optional[Range], None) for r in RANGE_LIMITS},
)

KnobPolicy: type[_PolicyBase] = create_model(  # type: ignore[call-overload]
    "KnobPolicy",
    __base__=KnobPolicyOverride,
    __module__=__name__,
    __doc__="What a request may change of the knob through its metadata ``energy_router`` (``knob.policy``, the "
    "default; ``knob.per_key.<key>.policy`` per LiteLLM key alias / team). A request that sends a field its key may "
    "not override, or a value outside the key's range (closed interval), is refused (HTTP 400).",
    allow_override=(bool, Field(True, description=f"may requests override {' / '.join(REQUEST_FIELDS)}")),
    **{
        RANGES[a]: (Range, Field(tuple(_extra(n)["request_range"]), description=f"[lo, hi] of a request's {a}"))
        for a, n in REQUEST_FIELDS.items()
        if a in RANGES
    },
)


def _optional(fi: FieldInfo) -> tuple[Any, FieldInfo]:
    """The field with the same bounds and alias, defaulting to ``None`` (not set)."""
    return Optional[fi.annotation], FieldInfo.merge_field_infos(copy.copy(fi), default=None)  # type: ignore[valid-type]


KnobOverride: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "KnobOverride",
    __config__=_SECTION,
    __module__=__name__,
    __doc__="One key's knob defaults (``knob.per_key.<key>``) and, optionally, its policy.",
    **{n: _optional(FIELDS[n]) for n in KEY_SCOPED},
    policy=(Optional[KnobPolicyOverride], Field(None, description="replaces fields of knob.policy for this key")),
)


class _KnobSettingsBase(BaseModel):
    model_config = _SECTION

    def base(self) -> Knob:
        """The global knob (what a request with no key entry and no override gets); one object per set of
        values (a knob is frozen), so the request path does not build it again."""
        vals = tuple(getattr(self, n) for n in FIELDS)
        k = _BASES.get(vals)
        if k is None:
            if len(_BASES) >= 64:
                _BASES.clear()
            k = _BASES[vals] = Knob.model_construct(**dict(zip(FIELDS, vals)))
        return k


_BASES: dict[tuple, Knob] = {}


KnobSettings: type[_KnobSettingsBase] = create_model(  # type: ignore[call-overload]
    "KnobSettings",
    __base__=_KnobSettingsBase,
    __module__=__name__,
    __doc__="The accuracy/energy trade-off (:class:`Knob`'s fields, global defaults), what requests may override "
    "(``policy``) and per-key defaults (``per_key``); see :mod:`litellm_energy_router.knob`.",
    **{n: (fi.annotation, copy.copy(fi)) for n, fi in FIELDS.items()},
    policy=(
        KnobPolicy,
        Field(default_factory=KnobPolicy, description="what requests may override, within which bounds"),
    ),
    per_key=(dict[str, KnobOverride], Field(default_factory=dict, description="LiteLLM key alias/team -> knob")),
)


def knob_table() -> str:
    """The knob's fields as the Markdown table of ``docs/serving.md``."""
    where = {"request": "request, key, global", "key": "key, global", "global": "global (`knob`)"}
    rows = [
        "| field | default | bounds | set per | request range (default policy) | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for n, fi in FIELDS.items():
        lo, hi, positive = _limits(fi)
        choices = get_args(fi.annotation) if get_origin(fi.annotation) is Literal else ()
        bounds = " or ".join(choices) if choices else f"{'(' if positive else '['}{lo:g}, {hi:g}]"
        rng = _extra(n).get("request_range")
        rng_s = f"`knob.policy.{_extra(n)['policy']}` = [{rng[0]:g}, {rng[1]:g}]" if rng else "–"
        rows.append(
            f"| `{_alias(n)}` | {fi.default!r} | {bounds} | {where[_extra(n)['scope']]} | {rng_s} | {fi.description} |"
        )
    return "\n".join(rows)


# -- the request parser -----------------------------------------------------------------------------------


class KnobError(ValueError):
    """An invalid request knob. LiteLLM reads ``status_code`` (the proxy answers 400 with ``message`` and
    ``param``; the router does not retry) — ``str(err)`` is one line naming the field."""

    status_code = 400
    type = "invalid_request_error"
    energy_router_refusal = True  # litellm_compat.quiet_refusals: our WARNING line, not the proxy's ERROR line

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


def key_entries(knob: Any, mds: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The ``per_key`` entries (:data:`KnobOverride`) matching the request's key, most specific first."""
    out = []
    for md in mds:
        for f in KEY_FIELDS:
            v = md.get(f)
            if v is not None and (entry := knob.per_key.get(str(v))) is not None:
                out.append((str(v), entry))
    return out


def policy_for(knob: Any, entries: list[tuple[str, Any]]) -> tuple[Any, str | None]:
    """(the :data:`KnobPolicy` of the request's key, that key's name or ``None`` for the default)."""
    for name, entry in entries:
        if entry.policy is not None:
            return knob.policy.merged(entry.policy), name
    return knob.policy, None


def _shown(v: Any) -> str:
    try:
        r = repr(v)
    except ValueError:  # an integer past Python's digit limit for str()
        return "<an integer too long to show>"
    return r if len(r) <= 40 else r[:37] + "..."


def _checked(value: Any, field: str, policy: Any, who: str | None) -> Any:
    if field not in RANGES:  # a request-scoped field that is not a bounded number: the field's own type
        from pydantic import TypeAdapter, ValidationError

        fi = FIELDS[REQUEST_FIELDS[field]]
        try:
            return TypeAdapter(fi.annotation).validate_python(value)
        except ValidationError as e:
            raise KnobError(field, f"= {_shown(value)}: {e.errors()[0]['msg']}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KnobError(field, f"= {_shown(value)} is not a number")
    try:
        v = float(value)
    except OverflowError:  # an integer of hundreds of digits (JSON allows it)
        v = math.inf
    if not math.isfinite(v):
        raise KnobError(field, f"= {_shown(value)} is not a finite number")
    lo, hi = getattr(policy, RANGES[field])
    if not lo <= v <= hi:
        where = f"key {who!r}" if who else "knob.policy"
        raise KnobError(field, f"= {v:g} is out of range [{lo:g}, {hi:g}] ({where})")
    return v


def request_values(md: dict[str, Any], policy: Any, who: str | None) -> dict[str, Any]:
    """The validated knob fields of one metadata dict, by :class:`Knob` field name (``{}`` when it has
    none); raises :class:`KnobError`."""
    req = md.get(KNOB_KEY)
    if req is None:
        return {}
    if not isinstance(req, Mapping):
        raise KnobError(KNOB_KEY, 'must be an object such as {"lambda": 0.3}')
    for k in req:
        if k not in REQUEST_FIELDS:
            raise KnobError(
                re.sub(r"[^\w.-]", "?", str(k))[:64], f"is not a knob field (known: {', '.join(REQUEST_FIELDS)})"
            )
    given = {k: v for k, v in req.items() if v is not None}
    if given and not policy.allow_override:
        field = next(iter(given))
        raise KnobError(
            field, f"may not be overridden by key {who!r}" if who else "may not be overridden (knob.policy)"
        )
    return {REQUEST_FIELDS[k]: _checked(v, k, policy, who) for k, v in given.items()}


@counts_knob_refusals(lambda: (*REQUEST_FIELDS, KNOB_KEY))  # energy_router_knob_refusals_total{field}
def resolve_knob(knob: Any, request_kwargs: Mapping[str, Any] | None) -> Knob:
    """The :class:`Knob` of a request under the settings' ``knob`` (:data:`KnobSettings`); raises
    :class:`KnobError`. An explicit λ in a request replaces a target it would otherwise inherit."""
    mds = metadata_dicts(request_kwargs)
    entries = key_entries(knob, mds)
    if not entries and not any(md.get(KNOB_KEY) is not None for md in mds):
        return knob.base()
    values = {n: getattr(knob, n) for n in FIELDS}
    if entries:
        values.update({n: v for n in KEY_SCOPED if (v := getattr(entries[0][1], n)) is not None})
    policy, who = policy_for(knob, entries)
    for md in mds:
        req = request_values(md, policy, who)
        if "lambda_" in req:
            values["target_accuracy"] = None  # an explicit λ replaces an inherited target
        values.update(req)
    return Knob.model_construct(**values)


if __name__ == "__main__":  # pragma: no cover - prints the docs table
    print(knob_table())
