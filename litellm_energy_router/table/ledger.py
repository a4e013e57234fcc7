"""The energy and carbon ledger: sums per (API key, team, user, model group, deployment, UTC day).

Table ``er_ledger`` (same DDL on SQLite and PostgreSQL; created beside the other tables when a store opens
an older database, so no schema version bump). The key columns hold ``''`` for an unknown value (a primary
key column cannot be ``NULL``). Sums:

* ``requests``, ``prompt_tokens``, ``completion_tokens`` — counts;
* ``joules_measured`` / ``requests_measured`` — GPU joules (J) of requests whose energy was measured (NVML,
  the agent, a plugin's meter) and how many; ``joules_estimated`` / ``requests_estimated`` — the same for
  energy estimated from tokens (``energy_method = estimate``); never mixed;
* ``joules_router_estimate`` — the router's decision-time estimate Ê of the chosen deployment (J);
  ``joules_reference`` — its estimate for the reference deployment (J); ``joules_saved`` — their difference
  (J, estimated: the reference did not serve the request), over routed requests only;
* ``co2e_g`` — grams of CO2e (settled joules x PUE x grid intensity of the site at that hour).

:func:`apply` adds a batch's increments inside the transaction that inserts the batch's rows, with
``INSERT ... ON CONFLICT DO UPDATE SET x = er_ledger.x + excluded.x`` (keys sorted, so concurrent writers
never deadlock): each stored production run is counted exactly once, by whichever proxy stored it.
Attribution comes only from LiteLLM's authenticated ``user_api_key_*`` fields (see the callback).
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import BigInteger, Column, Float, Index, String, Table, func, select

from litellm_energy_router.table.schema import metadata

KEY_COLUMNS = ("day", "key_hash", "team", "user_id", "model_group", "deployment")
LABEL_COLUMNS = ("key_alias", "team_alias")
SUM_COLUMNS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "joules_measured",
    "requests_measured",
    "joules_estimated",
    "requests_estimated",
    "joules_router_estimate",
    "joules_reference",
    "joules_saved",
    "co2e_g",
)
_INT_SUMS = {"requests", "prompt_tokens", "completion_tokens", "requests_measured", "requests_estimated"}

ledger = Table(
    "er_ledger",
    metadata,
    Column("day", String(10), primary_key=True),  # YYYY-MM-DD, UTC
    Column("key_hash", String(64), primary_key=True),
    Column("team", String(200), primary_key=True),
    Column("user_id", String(200), primary_key=True),
    Column("model_group", String(200), primary_key=True),
    Column("deployment", String(200), primary_key=True),
    Column("key_alias", String(200)),
    Column("team_alias", String(200)),
    *[Column(c, BigInteger if c in _INT_SUMS else Float, nullable=False, server_default="0") for c in SUM_COLUMNS],
    Column("updated", Float, nullable=False),
    Index("ix_er_ledger_team_day", "team", "day"),
)

BY = {
    "key": ("key_hash", "key_alias"),
    "team": ("team", "team_alias"),
    "model": ("model_group", None),
    "day": ("day", None),
    "user": ("user_id", None),
    "deployment": ("deployment", None),
}


def day_of(t_s: float) -> str:
    """The UTC day of Unix time ``t_s``, ``YYYY-MM-DD``."""
    return _day(int(t_s // 86400))


@functools.lru_cache(maxsize=64)
def _day(day_index: int) -> str:
    return datetime.fromtimestamp(day_index * 86400, tz=timezone.utc).strftime("%Y-%m-%d")


def entry(
    attrs: Mapping[str, Any],
    *,
    t_s: float,
    request: bool,
    prompt_tokens: int,
    completion_tokens: int,
    joules: float | None,
    measured: bool,
    router_estimate_j: float | None,
    reference_j: float | None,
    co2e_g: float | None,
) -> dict[str, Any]:
    """One run's increments. ``attrs``: the key columns but ``day`` (missing ones are ``''``) and the labels;
    ``request``: count it as a request (``False`` for a failed attempt's successful retry)."""
    d: dict[str, Any] = {k: str(attrs.get(k) or "")[:200] for k in KEY_COLUMNS[1:]}
    d["key_hash"] = d["key_hash"][:64]
    d["day"] = day_of(t_s)
    for k in LABEL_COLUMNS:
        d[k] = str(attrs[k])[:200] if attrs.get(k) else None
    routed = router_estimate_j is not None and reference_j is not None
    d.update(
        requests=int(request),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        joules_measured=joules if joules is not None and measured else 0.0,
        requests_measured=int(joules is not None and measured),
        joules_estimated=joules if joules is not None and not measured else 0.0,
        requests_estimated=int(joules is not None and not measured),
        joules_router_estimate=router_estimate_j if routed else 0.0,
        joules_reference=reference_j if routed else 0.0,
        joules_saved=(reference_j - router_estimate_j) if routed else 0.0,  # type: ignore[operator]
        co2e_g=co2e_g or 0.0,
    )
    return d


def merge(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Sum entries with the same key; sorted by key (a fixed lock order for concurrent writers)."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for e in entries:
        k = tuple(e[c] for c in KEY_COLUMNS)
        cur = out.get(k)
        if cur is None:
            out[k] = dict(e)
            continue
        for c in SUM_COLUMNS:
            cur[c] += e[c]
        for c in LABEL_COLUMNS:
            cur[c] = e[c] or cur[c]
    return [out[k] for k in sorted(out)]


def apply(conn: Any, dialect: str, entries: Sequence[Mapping[str, Any]], now: float) -> int:
    """Add ``entries`` to the ledger on ``conn`` (inside the caller's transaction); returns the keys touched."""
    rows = merge(entries)
    if not rows:
        return 0
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(ledger)
    set_: dict[str, Any] = {c: ledger.c[c] + stmt.excluded[c] for c in SUM_COLUMNS}
    set_.update({c: func.coalesce(stmt.excluded[c], ledger.c[c]) for c in LABEL_COLUMNS})
    set_["updated"] = stmt.excluded["updated"]
    conn.execute(
        stmt.on_conflict_do_update(index_elements=list(KEY_COLUMNS), set_=set_), [{**r, "updated": now} for r in rows]
    )
    return len(rows)


def report(
    conn: Any, by: str, *, since: str | None = None, until: str | None = None, extra: str | None = None
) -> list[dict[str, Any]]:
    """Ledger sums grouped by ``by`` (``key``, ``team``, ``model``, ``day``, ``user``, ``deployment``), and by
    ``extra`` too when given (e.g. ``team`` for a per-day plot stacked by team); days ``since``..``until``
    inclusive (``YYYY-MM-DD``). Each row: the group value(s), its label (key alias / team alias) and the sums."""
    col, label = BY[by]
    groups = [ledger.c[col]] + ([ledger.c[BY[extra][0]]] if extra else [])
    cols = [*groups, func.max(ledger.c[label]).label("label") if label else None]
    cols += [func.sum(ledger.c[c]).label(c) for c in SUM_COLUMNS]
    stmt = select(*[c for c in cols if c is not None]).group_by(*groups).order_by(*groups)
    if since:
        stmt = stmt.where(ledger.c.day >= since)
    if until:
        stmt = stmt.where(ledger.c.day <= until)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def spend(conn: Any, scope: str, name: str, since: str, unit: str) -> float:
    """A budget's spend from day ``since`` (``YYYY-MM-DD``, inclusive) on: joules (measured + estimated) or
    gCO2e (``unit`` ``joules`` / ``gco2e``) of the rows whose key alias (``scope`` ``key``) or team id or
    team alias (``team``) is ``name``."""
    col = ledger.c.co2e_g if unit == "gco2e" else ledger.c.joules_measured + ledger.c.joules_estimated
    who = ledger.c.key_alias == name if scope == "key" else (ledger.c.team == name) | (ledger.c.team_alias == name)
    v = conn.execute(select(func.coalesce(func.sum(col), 0.0)).where(who, ledger.c.day >= since)).scalar_one()
    return float(v or 0.0)
