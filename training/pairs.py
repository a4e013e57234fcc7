"""Every labelled (query, candidate) run, with the weight that undoes the logging router's selection bias.

:func:`~.data.load_matrix` keeps a query only when every candidate has a labelled run. A production
row labels one candidate, the one the serving router chose, so this module reads *pairs* instead:
:func:`load_pairs` streams ``store.iter_runs`` once into flat arrays (one entry per labelled
(query, candidate) pair, one per query, and one per run with measured or estimated joules).

**Which row labels a pair.** A pair can have one run per source. A tournament, shadow or import run
(chosen independently of the router, *unbiased*) wins over a production run of the same pair; among
runs of the same kind the most recently updated wins (as in ``load_matrix``). Keeping both would count
such a query twice (once as itself, once as the production row standing for 1/p queries); the
unbiased run needs no correction, so it is the one kept.

**Weights** (:mod:`.pair_weights`, :func:`~.pair_weights.ips_weights`): unbiased rows weigh 1; a production
row weighs its clipped inverse propensity ``1/p``, self-normalised per (logging router version, candidate).

**Energy** (:func:`~.energy_fit.fit_energy_from_pairs`): J per prompt / output token per candidate are fitted on the
runs whose joules were *measured* (an ``energy_method`` of a meter registered as ``measured``,
:func:`~litellm_energy_router.energy.meter.measured_methods`: NVML counter, power sampling, the GPU-node
agent, a plugin meter that says so) once a candidate has :data:`MIN_MEASURED_RUNS` of them; before that on
every run with joules (profile-derived ``estimate``/``simulated`` ones included), then on the bundled
energy profile. Expected output tokens per (task, candidate) are the weighted mean over every run with
joules. The estimate records per candidate what it was fitted on (``EnergyEstimate.fitted_on``).

numpy only at module level.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from litellm_energy_router.energy.meter import measured_methods
from litellm_energy_router.redact import redact_url

from .data import MatrixError, TableMatrix, query_prompt_tokens
from .pair_weights import SOURCES, UNBIASED_SOURCES, PairWeighting, ips_weights  # noqa: F401 (re-exported)

MIN_MEASURED_RUNS = 20


@dataclass
class PairTable:
    """Labelled (query, candidate) pairs (index arrays ``q``, ``c`` into ``ids`` and ``candidates``).

    Per pair: ``y`` score in [0, 1], ``energy_j`` (J), ``completion_tokens`` (NaN unknown), ``source``
    (code into :data:`SOURCES`), ``propensity`` (NaN unless production), ``router_version`` (None if
    unknown), ``weight``. Per query: ``ids``, ``tasks``, ``texts``, ``prompt_tokens``. ``runs_*``: every
    run with joules (labelled or not), for the energy estimate.
    """

    candidates: list[str]
    ids: np.ndarray
    tasks: np.ndarray
    texts: list[str | None]
    prompt_tokens: np.ndarray
    q: np.ndarray
    c: np.ndarray
    y: np.ndarray
    energy_j: np.ndarray
    completion_tokens: np.ndarray
    source: np.ndarray
    propensity: np.ndarray
    router_version: np.ndarray
    weight: np.ndarray
    runs: dict[str, np.ndarray] = field(
        default_factory=dict
    )  # q (into run_ids), c, task (into run_tasks), pt, ct, e, measured, src, prop, w
    run_ids: np.ndarray = field(default_factory=lambda: np.array([], dtype=object))
    run_tasks: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    max_run_id: int = 0
    max_updated: float = 0.0

    @property
    def n(self) -> int:
        return len(self.q)

    def counts(self) -> dict[str, Any]:
        """Pairs per source, per candidate, and the weighting counts (what a fit was fitted on)."""
        out: dict[str, Any] = {"pairs": self.n, "queries": len(self.ids), **self.stats}
        for s, name in enumerate(SOURCES):
            out[f"pairs_{name}"] = int((self.source == s).sum())
        out["complete_queries"] = int((np.bincount(self.q, minlength=len(self.ids)) == len(self.candidates)).sum())
        return out

    def exclude(self, ids: Sequence[str]) -> "PairTable":
        """The pairs and energy runs of every query not in ``ids`` (e.g. a held-out set)."""
        ids_a = np.asarray([str(i) for i in ids])
        drop = np.isin(self.ids.astype(str), ids_a)
        rdrop = np.isin(self.runs["q"], np.flatnonzero(np.isin(self.run_ids.astype(str), ids_a)))
        keep_q = np.flatnonzero(~drop)
        new = -np.ones(len(self.ids), dtype=np.int64)
        new[keep_q] = np.arange(len(keep_q))
        sel = ~drop[self.q]
        return PairTable(
            candidates=list(self.candidates),
            ids=self.ids[keep_q],
            tasks=self.tasks[keep_q],
            texts=[self.texts[i] for i in keep_q],
            prompt_tokens=self.prompt_tokens[keep_q],
            q=new[self.q[sel]],
            c=self.c[sel],
            y=self.y[sel],
            energy_j=self.energy_j[sel],
            completion_tokens=self.completion_tokens[sel],
            source=self.source[sel],
            propensity=self.propensity[sel],
            router_version=self.router_version[sel],
            weight=self.weight[sel],
            runs={k: v[~rdrop] for k, v in self.runs.items()},
            run_ids=self.run_ids,
            run_tasks=list(self.run_tasks),
            stats=dict(self.stats),
            max_run_id=self.max_run_id,
            max_updated=self.max_updated,
        )

    def scale_weights(self, ids: Sequence[str], factor: Sequence[float]) -> None:
        """Multiply the weight of every pair and energy run of query ``ids[i]`` by ``factor[i]`` (a sample's
        1/π: weighted sums over the kept pairs then estimate the whole table's); other queries keep theirs."""
        f = dict(zip((str(i) for i in ids), (float(x) for x in factor)))
        self.weight = self.weight * np.array([f.get(str(i), 1.0) for i in self.ids])[self.q]
        if len(self.runs.get("w", ())):
            rf = np.array([f.get(str(i), 1.0) for i in self.run_ids])
            self.runs["w"] = self.runs["w"] * rf[self.runs["q"].astype(np.int64)]

    def matrix(self, *, require_text: bool = True, unweighted: bool = False) -> TableMatrix:
        """A partial :class:`~.data.TableMatrix` of every query with a labelled pair: ``Y``/``E``/``T`` NaN
        where a candidate is unlabelled, ``W[n, K]`` the pair weights (0 where unlabelled; 1 for every
        labelled pair if ``unweighted``). Queries without text are left out when ``require_text``."""
        Q, K = len(self.ids), len(self.candidates)
        Y, E, T, W = np.full((Q, K), np.nan), np.full((Q, K), np.nan), np.full((Q, K), np.nan), np.zeros((Q, K))
        Y[self.q, self.c] = self.y
        E[self.q, self.c] = self.energy_j
        T[self.q, self.c] = self.completion_tokens
        W[self.q, self.c] = 1.0 if unweighted else self.weight
        rows = np.array([t is not None for t in self.texts], dtype=bool) if require_text else np.ones(Q, dtype=bool)
        idx = np.flatnonzero(rows)
        return TableMatrix(
            candidates=list(self.candidates),
            ids=self.ids[idx],
            tasks=self.tasks[idx],
            texts=[self.texts[i] for i in idx],
            prompt_tokens=self.prompt_tokens[idx],
            Y=Y[idx],
            E=E[idx],
            T=T[idx],
            W=W[idx],
            dropped={"no_text": int(Q - len(idx))},
            max_run_id=self.max_run_id,
            max_updated=self.max_updated,
        )


class PairReader:
    """Streaming accumulator behind :func:`load_pairs`: ``add(row)`` per run read (compact arrays, no row
    dicts kept), then :meth:`table`. Fed alongside the matrix read, it turns one pass over the table into
    both (``progress.CountingStore(also=reader.add)``)."""

    def __init__(self, wanted: set[str] | None) -> None:
        self.wanted = wanted
        self.qix: dict[str, int] = {}
        self.cix: dict[str, int] = {}
        self.tasks: list[str] = []
        self.texts: list[str | None] = []
        self.ptok: list[list[int]] = []
        self.slot: dict[tuple[int, int], int] = {}
        self.rk_u, self.rk_upd, self.rk_id = array("b"), array("d"), array("q")  # which run labels the pair
        self.pq, self.pc, self.src = array("q"), array("q"), array("b")
        self.y, self.e, self.ct, self.prop = array("d"), array("d"), array("d"), array("d")
        self.ver: list[str | None] = []
        self.task_ix: dict[str, int] = {}
        self.rq: dict[str, int] = {}
        self.run_cols: dict[str, array] = {
            k: array("d") for k in ("q", "c", "task", "pt", "ct", "e", "measured", "src", "prop")
        }
        self.run_ver: list[str | None] = []
        self.max_id, self.max_upd = 0, 0.0

    def table(
        self, candidates: Sequence[str] | None = None, url: Any = "?", weighting: PairWeighting | None = None
    ) -> PairTable:
        """The :class:`PairTable` of the pairs read, over ``candidates`` (default: every candidate with a
        labelled run, cheapest mean energy first); ``url`` names the table in errors."""
        return _table(self, candidates, url, weighting)

    def _measured_methods(self) -> frozenset[str]:
        """The meter registry's measured ``energy_method`` values, asked once per reader."""
        if getattr(self, "_measured", None) is None:
            self._measured = measured_methods()
        return self._measured

    def add(self, r: dict[str, Any]) -> None:
        self.max_id = max(self.max_id, int(r["id"]))
        self.max_upd = max(self.max_upd, float(r.get("updated") or 0.0))
        cand = r["candidate"]
        if (self.wanted is not None and cand not in self.wanted) or r.get("energy_j") is None:
            return
        src = SOURCES.index(r["source"]) if r["source"] in SOURCES else SOURCES.index("production")
        ci = self.cix.setdefault(cand, len(self.cix))
        prop = float(r["propensity"]) if r.get("propensity") is not None else np.nan
        ct = float(r["completion_tokens"]) if r.get("completion_tokens") is not None else np.nan
        pt = float(r["prompt_tokens"]) if r.get("prompt_tokens") is not None else np.nan
        rc = self.run_cols
        ti = self.task_ix.setdefault(r["task"], len(self.task_ix))
        for k, v in (
            ("q", self.rq.setdefault(r["query_id"], len(self.rq))),
            ("c", ci),
            ("task", ti),
            ("pt", pt),
            ("ct", ct),
            ("e", float(r["energy_j"])),
            ("measured", float(r.get("energy_method") in self._measured_methods())),
            ("src", src),
            ("prop", prop),
        ):
            rc[k].append(v)
        self.run_ver.append(r.get("router_version"))
        if r.get("score") is None:
            return
        qid = r["query_id"]
        qi = self.qix.get(qid)
        if qi is None:
            qi = self.qix[qid] = len(self.tasks)
            self.tasks.append(r["task"])
            self.texts.append(r["text"])
            self.ptok.append([])
        if r.get("prompt_tokens") is not None:
            self.ptok[qi].append(int(r["prompt_tokens"]))
        rank = (int(r["source"] in UNBIASED_SOURCES), float(r.get("updated") or 0.0), int(r["id"]))
        ranks = (self.rk_u, self.rk_upd, self.rk_id)
        vals = (qi, ci, src, float(r["score"]), float(r["energy_j"]), ct, prop)
        s = self.slot.get((qi, ci))
        if s is None:
            self.slot[(qi, ci)] = len(self.pq)
            for arr, v in zip(ranks, rank):
                arr.append(v)
            self.ver.append(r.get("router_version"))
            for arr, v in zip((self.pq, self.pc, self.src, self.y, self.e, self.ct, self.prop), vals):
                arr.append(v)
        elif rank >= (self.rk_u[s], self.rk_upd[s], self.rk_id[s]):
            for arr, v in zip(ranks, rank):
                arr[s] = v
            self.ver[s] = r.get("router_version")
            for arr, v in zip((self.pq, self.pc, self.src, self.y, self.e, self.ct, self.prop), vals):
                arr[s] = v


def load_pairs(
    store: Any,
    candidates: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    since_id: int | None = None,
    weighting: PairWeighting | None = None,
) -> PairTable:
    """Stream ``store.iter_runs`` into a :class:`PairTable` of every labelled (score and energy_j present)
    pair of ``candidates`` (default: every candidate with a labelled run, cheapest mean energy first)."""
    acc = PairReader(set(candidates) if candidates is not None else None)
    for r in store.iter_runs(sources=list(sources) if sources else None, since_id=since_id):
        acc.add(r)
    return acc.table(candidates, getattr(store, "url", "?"), weighting)


def _table(acc: PairReader, candidates: Sequence[str] | None, url: Any, weighting: PairWeighting | None) -> PairTable:
    """The :class:`PairTable` of what ``acc`` read (``url``: the table, named in errors)."""
    if not len(acc.pq):
        raise MatrixError(f"table {redact_url(url)}: 0 labelled runs (score and energy_j)")
    seen = sorted(acc.cix, key=acc.cix.get)
    pc, e = np.frombuffer(acc.pc, dtype=np.int64), np.frombuffer(acc.e, dtype=np.float64)
    if candidates is None:
        labelled = [c for c in seen if (pc == acc.cix[c]).any()]
        cands = sorted(labelled, key=lambda c: (float(e[pc == acc.cix[c]].mean()), c))
    else:
        cands = list(candidates)
        missing = [c for c in cands if c not in acc.cix or not (pc == acc.cix[c]).any()]
        if missing:
            raise MatrixError(f"candidate {missing[0]!r}: no labelled runs in table {redact_url(url)}")
    remap = np.full(max(len(seen), 1), -1, dtype=np.int64)
    for c in seen:
        remap[acc.cix[c]] = cands.index(c) if c in cands else -1
    keep = remap[pc] >= 0
    q = np.frombuffer(acc.pq, dtype=np.int64)[keep]
    c = remap[pc][keep]
    src = np.frombuffer(acc.src, dtype=np.int8)[keep].astype(np.int64)
    prop = np.frombuffer(acc.prop, dtype=np.float64)[keep]
    ver = np.array(acc.ver, dtype=object)[keep]
    w, stats = ips_weights(src, prop, c, ver, weighting)
    rc = {k: np.frombuffer(v, dtype=np.float64) for k, v in acc.run_cols.items()}
    rkeep = remap[rc["c"].astype(np.int64)] >= 0
    runs = {k: v[rkeep] for k, v in rc.items()}
    runs["c"] = remap[runs["c"].astype(np.int64)]
    runs["w"], _ = ips_weights(
        runs["src"].astype(np.int64), runs["prop"], runs["c"], np.array(acc.run_ver, dtype=object)[rkeep], weighting
    )
    texts = acc.texts
    pt = np.array([query_prompt_tokens(t, texts[i]) for i, t in enumerate(acc.ptok)])
    return PairTable(
        candidates=cands,
        ids=np.array(list(acc.qix), dtype=object),
        tasks=np.array(acc.tasks, dtype=object),
        texts=texts,
        prompt_tokens=pt,
        q=q,
        c=c,
        y=np.frombuffer(acc.y, dtype=np.float64)[keep],
        energy_j=e[keep],
        completion_tokens=np.frombuffer(acc.ct, dtype=np.float64)[keep],
        source=src,
        propensity=prop,
        router_version=ver,
        weight=w,
        runs=runs,
        run_ids=np.array(list(acc.rq), dtype=object),
        run_tasks=sorted(acc.task_ix, key=acc.task_ix.get),
        stats=stats,
        max_run_id=acc.max_id,
        max_updated=acc.max_upd,
    )


# -- partial rows in the correctness models --------------------------------------------------------


def label_weights(m: TableMatrix) -> np.ndarray:
    """``W[n, K]``: the pair weights of a partial matrix (0 where unlabelled), ones for a complete one."""
    if getattr(m, "W", None) is None:
        return np.ones_like(m.Y, dtype=np.float64)
    return np.where(np.isfinite(m.Y), m.W, 0.0)


def weighted_brier(P: np.ndarray, m: TableMatrix) -> float:
    """Brier score over the labelled pairs of ``m``, weighted by their pair weights."""
    W = label_weights(m)
    return float(np.sum(W * (np.asarray(P) - np.nan_to_num(m.Y)) ** 2) / max(W.sum(), 1e-12))


def partial_only(pairs: PairTable, m: TableMatrix) -> TableMatrix:
    """The queries of ``pairs`` (with text) that are not rows of ``m`` (the queries only partial feedback labels)."""
    pm = pairs.matrix()
    return pm.subset(np.flatnonzero(~np.isin(pm.ids.astype(str), m.ids.astype(str))))


# -- energy estimate ------------------------------------------------------------------------------
