"""Robust per-group summaries for :meth:`SQLStore.stats <litellm_energy_router.table.store.SQLStore.stats>`:
the median and 95th percentile of joules and latency beside the means (one huge prompt moves a mean,
not a median). Computed in Python over one streamed column pair, the same on SQLite and PostgreSQL (no numpy: the table layer stays lean)."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import select


def _quantile(xs: list[float], q: float) -> float:
    """``q``-quantile of sorted ``xs``, linear between order statistics (numpy's default)."""
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median_p95(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    xs = sorted(values)
    return _quantile(xs, 0.5), _quantile(xs, 0.95)


def group_quantiles(
    conn: Any, keys: Sequence[Any], runs: Any, queries: Any, sources: Sequence[str] | None
) -> dict[tuple, tuple[float | None, ...]]:
    """Per value of ``keys``: (median J, p95 J, median latency s, p95 latency s) over the runs that have
    each value (``None`` when none has)."""
    stmt = select(*keys, runs.c.energy_j, runs.c.latency_s).join(queries, queries.c.id == runs.c.query_id)
    if sources:
        stmt = stmt.where(runs.c.source.in_(list(sources)))
    groups: dict[tuple, tuple[list[float], list[float]]] = {}
    for row in conn.execution_options(yield_per=20000).execute(stmt):
        *key, e, lat = row
        es, ls = groups.setdefault(tuple(key), ([], []))
        if e is not None:
            es.append(float(e))
        if lat is not None:
            ls.append(float(lat))
    return {k: (*_median_p95(es), *_median_p95(ls)) for k, (es, ls) in groups.items()}
