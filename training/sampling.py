"""A bounded training set for a table larger than the retrain budget.

When the table holds more queries than :class:`TrainingBudget` allows, :func:`sample_matrix` (or the
row-level :func:`sample_rows`) draws the rows to train on:

* **stratified** by task (and, for row-level samples, candidate and source): every stratum is
  represented, by its proportional share of the budget and at least ``min_per_stratum`` rows;
* within a stratum, **favouring** recent rows and rows the serving router is unsure about (its
  P(correct) near 0.5): a row's size is ``1 + recency_boost · r + uncertainty_boost · u`` with ``r`` the
  recency rank in [0, 1] and ``u = 4·mean_k P_k(1 − P_k)`` in [0, 1];
* by **systematic sampling** in a random order with inclusion probability ``π`` proportional to that
  size (capped at 1): each stratum yields a fixed number of rows, ``π`` is known exactly for every
  row, and the sample carries weights ``w = base_weight / π`` (``base_weight``: any weight the row
  already had, e.g. an inverse propensity). A weighted sum over the sample is then an unbiased (Horvitz–Thompson) estimate of the sum over the whole table.

Selection depends only on what is known before the outcome (task, candidate, source, time, the serving
router's P), never on correctness or energy, so a model of P(correct | query) fitted on the sample stays
consistent; the weights correct the marginal estimates (accuracy, energy means) and any fit that takes
sample weights.

numpy only at module level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SECONDS_PER_QUERY = 0.15  # default `train` on 2 cores: 2,217 queries in 301 s, 8,868 in 1,246 s


class TrainingBudget(BaseModel):
    """The ``retrain.budget:`` section: how much a retrain may train on. ``None`` disables a bound."""

    model_config = ConfigDict(extra="forbid")

    max_queries: int | None = Field(
        3000, ge=10, description="training queries per retrain (a sample when the table is larger)"
    )
    max_seconds: float | None = Field(
        None,
        gt=0,
        description="training wall seconds; turned into a query cap with the "
        "seconds per query the last retrain report measured",
    )
    min_per_stratum: int = Field(20, ge=1, description="rows kept from every stratum (all of it when smaller)")
    recency_boost: float = Field(1.0, ge=0, description="extra inclusion size of the most recent row over the oldest")
    uncertainty_boost: float = Field(
        1.0, ge=0, description="extra inclusion size of a row the serving router scores at P=0.5"
    )
    replay_ratio: float = Field(
        1.0,
        ge=0,
        description="warm start: old queries replayed per new query (the retrain "
        "then costs in proportion to the new rows)",
    )
    seed: int = 0

    def query_cap(self, report_dir: Path | None = None) -> int | None:
        """The number of queries this budget allows (the smaller of both bounds), or None."""
        caps = [self.max_queries] if self.max_queries is not None else []
        if self.max_seconds is not None:
            caps.append(max(int(self.max_seconds / seconds_per_query(report_dir)), 10))
        return min(caps) if caps else None


def seconds_per_query(report_dir: Path | None) -> float:
    """Training seconds per query measured by the newest retrain report in ``report_dir`` (default when none)."""
    reports = sorted(Path(report_dir).glob("*.json")) if report_dir is not None and Path(report_dir).is_dir() else []
    for p in reversed(reports):
        try:
            r = json.loads(p.read_text())
            if r.get("train_queries") and r.get("train_seconds"):
                return float(r["train_seconds"]) / float(r["train_queries"])
        except (OSError, ValueError, TypeError):
            continue
    return DEFAULT_SECONDS_PER_QUERY


@dataclass
class Sample:
    """Rows ``idx`` (positions in the input), their inclusion probabilities ``pi`` and weights."""

    idx: np.ndarray
    pi: np.ndarray
    weight: np.ndarray
    strata: dict[str, dict[str, int]]  # stratum -> {"rows": N_h, "sampled": n_h}

    def horvitz_thompson(self, values: np.ndarray) -> float:
        """Unbiased estimate of the table total of ``values`` (given for the sampled rows, in ``idx`` order)."""
        return float(np.sum(np.asarray(values, dtype=np.float64) * self.weight))


def _capped_pps(size: np.ndarray, n: float) -> np.ndarray:
    """Inclusion probabilities proportional to ``size`` summing to ``n`` (≤ len), none above 1."""
    pi = np.zeros(len(size))
    free = np.ones(len(size), dtype=bool)
    left = float(n)
    while free.any():
        p = left * size[free] / size[free].sum()
        if (p <= 1).all():
            pi[free] = p
            break
        over = np.flatnonzero(free)[p > 1]
        pi[over] = 1.0
        free[over] = False
        left -= len(over)
    return pi


def inclusion_probabilities(
    strata: Sequence[Hashable], budget: int, size: np.ndarray | None = None, min_per_stratum: int = 20
) -> np.ndarray:
    """π per row: each stratum gets ``max(min_per_stratum, budget · N_h / N)`` rows (all of them when
    smaller), spread in proportion to ``size`` (uniform when None)."""
    keys = np.asarray([str(s) for s in strata], dtype=object)
    n_all = len(keys)
    size = np.ones(n_all) if size is None else np.asarray(size, dtype=np.float64)
    if n_all and (not np.isfinite(size).all() or size.min() <= 0):
        raise ValueError("sampling sizes must be finite and > 0")
    pi = np.zeros(n_all)
    for key in sorted(set(keys.tolist())):
        rows = np.flatnonzero(keys == key)
        n_h = min(len(rows), max(min_per_stratum, int(round(budget * len(rows) / max(n_all, 1)))))
        pi[rows] = _capped_pps(size[rows], n_h)
    return pi


def favour_sizes(
    recency: np.ndarray | None,
    uncertainty: np.ndarray | None,
    n: int,
    recency_boost: float = 1.0,
    uncertainty_boost: float = 1.0,
) -> np.ndarray:
    """``1 + recency_boost · rank(recency) + uncertainty_boost · uncertainty`` (rank scaled to [0, 1])."""
    size = np.ones(n)
    if recency is not None and n > 1 and recency_boost:
        ranks = np.argsort(np.argsort(np.asarray(recency, dtype=np.float64), kind="stable"), kind="stable")
        size += recency_boost * ranks / (n - 1)
    if uncertainty is not None and uncertainty_boost:
        size += uncertainty_boost * np.clip(np.nan_to_num(np.asarray(uncertainty, dtype=np.float64)), 0, 1)
    return size


def uncertainty_from_proba(P: np.ndarray) -> np.ndarray:
    """``4·mean_k P_k(1 − P_k)``: 1 when the router is at 0.5 on every candidate, 0 when it is sure."""
    P = np.clip(np.asarray(P, dtype=np.float64), 0, 1)
    return 4.0 * (P * (1 - P)).mean(axis=1)


def systematic_sample(keys: Sequence[str], pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows drawn with inclusion probabilities exactly ``pi``: per stratum, systematic sampling over a
    random order (a row is drawn when one of the points ``u, u + 1, ...`` falls in its stretch of length
    π ≤ 1 on the cumulated line), so each stratum yields exactly ``round(sum π)`` rows."""
    keys_a = np.asarray(keys, dtype=object)
    out = []
    for key in sorted(set(keys_a.tolist())):
        rows = rng.permutation(np.flatnonzero(keys_a == key))
        cum = np.cumsum(pi[rows])
        points = rng.random() + np.arange(int(np.floor(cum[-1] + 1e-9)))
        hit = np.searchsorted(cum, points, side="right")
        out.append(rows[hit[hit < len(rows)]])
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def sample_rows(
    strata: Sequence[Hashable],
    budget: int,
    *,
    recency: np.ndarray | None = None,
    uncertainty: np.ndarray | None = None,
    base_weight: np.ndarray | None = None,
    cfg: TrainingBudget | None = None,
) -> Sample:
    """A sample of about ``budget`` rows (see the module docstring); every row is kept when the
    table is not larger than the budget (weights = ``base_weight``)."""
    cfg = cfg or TrainingBudget()
    keys = [str(s) for s in strata]
    n = len(keys)
    base = np.ones(n) if base_weight is None else np.asarray(base_weight, dtype=np.float64)
    if n <= budget:
        pi = np.ones(n)
    else:
        size = favour_sizes(recency, uncertainty, n, cfg.recency_boost, cfg.uncertainty_boost)
        pi = inclusion_probabilities(keys, budget, size, cfg.min_per_stratum)
    idx = systematic_sample(keys, pi, np.random.default_rng(cfg.seed))
    counts: dict[str, dict[str, int]] = {}
    for i, k in enumerate(keys):
        counts.setdefault(k, {"rows": 0, "sampled": 0})["rows"] += 1
    for i in idx:
        counts[keys[i]]["sampled"] += 1
    return Sample(idx=idx, pi=pi[idx], weight=base[idx] / pi[idx], strata=counts)


def sample_matrix(
    m: Any, budget: int, cfg: TrainingBudget | None = None, uncertainty: np.ndarray | None = None
) -> tuple[Any, Sample]:
    """A :class:`~.data.TableMatrix` of about ``budget`` queries drawn from ``m`` (stratified by task,
    favouring recent queries, by ``m.last_run``, and ``uncertainty``), and the :class:`Sample` behind it;
    the sampled matrix's ``weight`` holds the weights."""
    recency = getattr(m, "last_run", None)
    s = sample_rows(
        list(m.tasks), budget, recency=recency, uncertainty=uncertainty, base_weight=getattr(m, "weight", None), cfg=cfg
    )
    out = m.take(s.idx)
    out.weight = s.weight
    return out, s


def warm_sample_matrix(
    m: Any, new: np.ndarray, n_total: int, cfg: TrainingBudget | None = None, uncertainty: np.ndarray | None = None
) -> tuple[Any, Sample]:
    """Warm start: every new query (``new`` mask; a sample of them when more than ``n_total``) plus a
    replay sample of the old ones filling ``n_total``, drawn like :func:`sample_matrix`. New rows have
    π = 1 unless sampled, so the weights keep whole-table estimates unbiased."""
    cfg = cfg or TrainingBudget()
    new_idx, old_idx = np.flatnonzero(new), np.flatnonzero(~np.asarray(new, dtype=bool))
    parts, pis, strata = [], [], {}
    for rows, n in ((new_idx, min(len(new_idx), n_total)), (old_idx, max(n_total - len(new_idx), 0))):
        if len(rows) == 0 or n == 0:
            continue
        sub = m.take(rows)
        u = None if uncertainty is None else uncertainty[rows]
        _, s = (
            sample_matrix(sub, n, cfg, u) if n < len(rows) else (sub, sample_rows(list(sub.tasks), len(rows), cfg=cfg))
        )
        parts.append(rows[s.idx])
        pis.append(s.pi)
        tag = "new" if rows is new_idx else "old"
        strata.update({f"{k}|{tag}": v for k, v in s.strata.items()})
    idx = np.concatenate(parts)
    pi = np.concatenate(pis)
    base = np.ones(len(m)) if getattr(m, "weight", None) is None else np.asarray(m.weight, dtype=np.float64)
    out = m.take(idx)
    out.weight = base[idx] / pi
    return out, Sample(idx=idx, pi=pi, weight=out.weight, strata=strata)


def serving_uncertainty(scorer: Any, m: Any, batch: int = 2048, tick: Any = None) -> np.ndarray:
    """Uncertainty of the serving checkpoint's scorer on every query of ``m``, scored in batches
    (``tick(n)`` after each)."""
    out = np.empty(len(m))
    for lo in range(0, len(m), batch):
        hi = min(lo + batch, len(m))
        P = scorer.score(list(m.texts[lo:hi]), [str(t) for t in m.tasks[lo:hi]])
        out[lo:hi] = uncertainty_from_proba(P)
        if tick is not None:
            tick(hi - lo)
    return out


def summary(s: Sample, table_rows: int) -> dict[str, Any]:
    """What the report says about a sample: sizes per stratum and the weights' effective sample size."""
    w = s.weight
    ess = float(w.sum() ** 2 / max((w**2).sum(), 1e-12)) if len(w) else 0.0
    return {
        "table_rows": table_rows,
        "sampled": int(len(s.idx)),
        "effective_sample_size": round(ess, 1),
        "weight_min": float(w.min()) if len(w) else None,
        "weight_max": float(w.max()) if len(w) else None,
        "strata": s.strata,
    }


def bounded_matrix(
    store: Any,
    candidates: Sequence[str] | None,
    sources: Sequence[str],
    budget: TrainingBudget,
    holdout_fraction: float,
    serving_dir: Path | None,
    report_dir: Path | None,
    stages: Any,
    log: Any = print,
    warm_since: int | None = None,
    pairs_reader: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Read the table in chunks (a bar over the rows) and, when it holds more queries than the budget
    allows (the training cap plus the held-out share), sample it (:func:`sample_matrix`, uncertainty
    from the serving checkpoint when one loads). ``warm_since`` (warm start: the serving checkpoint's
    largest run id): the queries with a newer run plus ``replay_ratio`` times as many old ones
    (:func:`warm_sample_matrix`). ``pairs_reader`` (a :class:`~.pairs.PairReader`) is fed every row of
    the same pass. Returns the matrix and what the report says about it."""
    from .data import load_matrix
    from .progress import CountingStore

    with stages.stage("read table", total=store.count_runs()) as tick:
        counting = CountingStore(store, tick, also=None if pairs_reader is None else pairs_reader.add)
        m = load_matrix(counting, candidates, sources)
    info: dict[str, Any] = {"rows_read": counting.rows_read, "table_queries": len(m)}
    cap = budget.query_cap(report_dir)
    n = len(m) if cap is None else min(len(m), int(np.ceil(cap / (1 - holdout_fraction))))
    new = None if warm_since is None or m.last_run is None else m.last_run > warm_since
    if new is not None:
        n = min(n, max(int(np.ceil(new.sum() * (1 + budget.replay_ratio))), 50))
    if n >= len(m):
        return m, info
    u = None
    if serving_dir is not None and budget.uncertainty_boost:
        with stages.stage("score uncertainty", total=len(m)) as tick:
            try:
                from litellm_energy_router.router.scoring import load_scorer

                u = serving_uncertainty(load_scorer(serving_dir, expect_candidates=m.candidates), m, tick=tick)
            except Exception as e:  # noqa: BLE001 - an unloadable serving checkpoint only loses the favouring
                log(f"sampling: serving checkpoint not used for uncertainty ({type(e).__name__})")
    with stages.stage("sample"):
        m, s = sample_matrix(m, n, budget, u) if new is None else warm_sample_matrix(m, new, n, budget, u)
    info["sample"] = summary(s, info["table_queries"])
    log(
        f"sampling: {len(m)} of {info['table_queries']} queries (budget {cap} training queries; "
        f"effective sample size {info['sample']['effective_sample_size']})"
    )
    return m, info


def bound_pairs(pairs: Any, train_ids: Sequence[str], cap: int | None, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The labelled pairs (:class:`~.pairs.PairTable`) a bounded retrain trains on: every pair of the complete
    queries it trains on (``train_ids``; the other complete queries were left out by the sample or held out)
    and at most ``cap`` of the queries only partial feedback labels (production traffic: the part of the
    table that grows), drawn uniformly without replacement with their pair weights divided by the inclusion
    probability ``cap / N`` (Horvitz–Thompson: weighted sums stay unbiased). ``cap`` None: all of them."""
    K = len(pairs.candidates)
    labelled = np.bincount(pairs.q, minlength=len(pairs.ids))
    ids = pairs.ids.astype(str)
    complete = labelled >= K
    drop = complete & ~np.isin(ids, np.asarray([str(i) for i in train_ids]))
    partial = np.flatnonzero(~complete)
    info: dict[str, Any] = {"partial_queries": int(len(partial)), "partial_sampled": int(len(partial))}
    if cap is not None and len(partial) > cap:
        keep = np.random.default_rng(seed).choice(partial, size=cap, replace=False)
        drop[np.setdiff1d(partial, keep)] = True
        info.update(partial_sampled=int(cap), partial_pi=round(cap / len(partial), 6))
    out = pairs.exclude(ids[drop])
    if "partial_pi" in info:
        kept = out.ids[np.bincount(out.q, minlength=len(out.ids)) < K]
        out.scale_weights(kept, np.full(len(kept), 1 / info["partial_pi"]))
    return out, info
