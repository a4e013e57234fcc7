"""The tournament table as a dense matrix and query-level splits.

numpy (and the serving package's pydantic types) only at module level: no torch, no scikit-learn.

Units: energy in joules (J), tokens as counts, scores (correctness) in [0, 1].

* :func:`load_matrix` — one row per query, one column per candidate: correctness ``Y[n, K]``, true
  energy ``E[n, K]`` (J), completion tokens ``T[n, K]``, plus id, task, text and prompt tokens.
* :func:`kfold` / :func:`holdout_split` / :func:`near_duplicate_groups` — splits **by query** (a query is never
  in train and test), in :mod:`.splits`, re-exported here.
* The routing-time energy estimate fitted on a matrix (``Ê[n, K]`` from the prompt length and the task)
  is :func:`~.energy_fit.fit_energy_estimate`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from litellm_energy_router.errors import UserError
from litellm_energy_router.redact import redact_url

from .pair_weights import UNBIASED_SOURCES
from .splits import holdout_split, kfold, near_duplicate_groups  # noqa: F401 (re-exported)


class MatrixError(UserError, ValueError):
    """The table cannot be turned into a training/evaluation matrix; one line saying why."""


@dataclass
class TableMatrix:
    """Dense view of the tournament table: ``n`` queries × ``K`` candidates.

    ``Y`` correctness in [0, 1]; ``E`` true energy (J) of each candidate on each query; ``T`` completion
    tokens (NaN when unknown); ``prompt_tokens`` per query. ``candidates`` are ordered by mean energy,
    ascending, unless given explicitly.
    """

    candidates: list[str]
    ids: np.ndarray  # [n] str
    tasks: np.ndarray  # [n] str
    texts: list[str | None]
    prompt_tokens: np.ndarray  # [n] float (tokens)
    Y: np.ndarray  # [n, K] float in [0, 1]
    E: np.ndarray  # [n, K] float, J
    T: np.ndarray  # [n, K] float, completion tokens (NaN = unknown)
    dropped: dict[str, int] = field(default_factory=dict)
    W: np.ndarray | None = (
        None  # [n, K] pair weights of a partial matrix (NaN Y unlabelled; training/pairs.py), None = complete
    )
    max_run_id: int = 0  # training-data watermark: the largest run id read
    max_updated: float = 0.0  # and the latest ``updated`` time read (Unix s; catches rows labelled later)
    # run id -> ``updated`` of the runs read that are later than ``max_updated`` (its clock-skew margin): the next
    # retrain does not count them as new while unchanged; None: more than MAX_SEEN, all count as new
    seen: dict[int, float] | None = field(default_factory=dict)
    last_run: np.ndarray | None = None  # [n] the largest run id of each query (recency, for sampling)
    weight: np.ndarray | None = None  # [n] row weights (1 / inclusion probability of a sample; None = 1)

    @property
    def n(self) -> int:
        return len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def K(self) -> int:
        return len(self.candidates)

    def subset(self, idx: Sequence[int] | np.ndarray) -> "TableMatrix":
        """Rows ``idx`` (indices into this matrix), same candidates."""
        idx = np.asarray(idx, dtype=np.int64)
        return TableMatrix(
            candidates=list(self.candidates),
            ids=self.ids[idx],
            tasks=self.tasks[idx],
            texts=[self.texts[i] for i in idx],
            prompt_tokens=self.prompt_tokens[idx],
            Y=self.Y[idx],
            E=self.E[idx],
            T=self.T[idx],
            dropped=dict(self.dropped),
            max_run_id=self.max_run_id,
            W=None if self.W is None else self.W[idx],
            max_updated=self.max_updated,
            seen=self.seen,
            last_run=None if self.last_run is None else self.last_run[idx],
            weight=None if self.weight is None else self.weight[idx],
        )

    take = subset

    def task_names(self) -> list[str]:
        return sorted(set(self.tasks.tolist()))

    def summary(self) -> str:
        acc = ", ".join(
            f"{c}: acc {self.Y[:, k].mean():.3f} / {self.E[:, k].mean():.1f} J" for k, c in enumerate(self.candidates)
        )
        return f"{self.n} queries x {self.K} candidates ({acc})"


def concat_rows(a: TableMatrix, b: TableMatrix | None) -> TableMatrix:
    """The rows of ``a`` then those of ``b`` (same candidates): e.g. the complete training queries plus the
    queries only partial feedback labels (NaN where unlabelled). ``W`` is kept when either has one (ones
    for a complete side); watermarks are ``a``'s."""
    if b is None or not len(b):
        return a
    if list(b.candidates) != list(a.candidates):
        raise MatrixError(f"candidates differ: {a.candidates} vs {b.candidates}")
    W = None
    if a.W is not None or b.W is not None:
        W = np.vstack([np.ones_like(m.Y) if m.W is None else m.W for m in (a, b)])
    cat = np.concatenate
    return TableMatrix(
        candidates=list(a.candidates),
        ids=cat([a.ids, b.ids]),
        tasks=cat([a.tasks, b.tasks]),
        texts=list(a.texts) + list(b.texts),
        prompt_tokens=cat([a.prompt_tokens, b.prompt_tokens]),
        Y=np.vstack([a.Y, b.Y]),
        E=np.vstack([a.E, b.E]),
        T=np.vstack([a.T, b.T]),
        dropped=dict(a.dropped),
        W=W,
        max_run_id=a.max_run_id,
        max_updated=a.max_updated,
        seen=a.seen,
    )


def watermark(m: TableMatrix) -> dict[str, Any]:
    """The checkpoint manifest's training-data watermark of ``m`` (what ``retrain`` counts new rows from)."""
    seen = None if m.seen is None else sorted(m.seen.items())
    return {"max_run_id": m.max_run_id, "max_updated": m.max_updated, "seen": seen, "queries": len(m)}


def query_prompt_tokens(tokens: Sequence[int] | None, text: str | None) -> float:
    """A query's prompt tokens: the median over its runs that recorded them, else ~4 characters per token
    (a rough stand-in)."""
    return float(np.median(tokens)) if tokens else float(math.ceil(len(text or "") / 4))


def load_matrix(
    store: Any,
    candidates: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    since_id: int | None = None,
    *,
    require_text: bool = True,
) -> TableMatrix:
    """Read ``store.iter_runs(sources=..., since_id=...)`` into a :class:`TableMatrix`.

    A query is kept only when every candidate has a labelled run (score and energy present) for it;
    the counts of dropped queries are in ``matrix.dropped``. When a (query, candidate) pair has several
    runs (several sources), a tournament, shadow or import run wins over a production one (as in
    :mod:`.pairs`: the same label for the training rows, the pairs and the gate's held-out truth), then the most
    recently updated. ``candidates`` default: every candidate
    with a labelled run, ordered by mean energy ascending. Queries stored without text (privacy) cannot
    be learned from and are dropped (counted in ``dropped["no_text"]``) unless ``require_text=False``,
    which keeps them with ``text=None``.
    """
    scan = _scan_runs(store, candidates, sources, since_id)
    if not scan.best:
        src = f" from sources {','.join(sources)}" if sources else ""
        raise MatrixError(
            f"table {redact_url(getattr(store, 'url', '?'))}: 0 fully labelled queries (no run with score and energy_j{src})"
        )
    cands = _candidate_order(scan.best, candidates, store)
    return _assemble(scan, cands, require_text, store)


WATERMARK_SKEW_S = 5.0  # s: how far the table writers' clocks may run behind the trainer's (NTP keeps it ms)
MAX_SEEN = 2000  # runs read within the skew margin the watermark remembers (more: the next retrain counts them new)


@dataclass
class _RunScan:
    """What :func:`load_matrix` keeps of one pass over the runs."""

    # (unbiased source 0/1, updated, run id, score, energy_j (J), completion_tokens) of the winning run per (query,
    # candidate):
    # a small tuple, not the row, so memory holds what the matrix needs and not every row read
    best: dict[tuple[str, str], tuple[float, float, int, float, float, float]] = field(default_factory=dict)
    qinfo: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # query id -> (task, text)
    ptoks: dict[str, list[int]] = field(default_factory=dict)  # query id -> prompt tokens of its runs
    last: dict[str, int] = field(default_factory=dict)  # query id -> its largest run id
    max_id: int = 0  # the largest run id read
    max_upd: float = 0.0  # the latest ``updated`` time read (Unix s)
    seen: dict[int, float] | None = field(default_factory=dict)  # runs read updated within the skew margin


def _scan_runs(
    store: Any, candidates: Sequence[str] | None, sources: Sequence[str] | None, since_id: int | None
) -> _RunScan:
    """One pass over ``store.iter_runs``: the winning labelled run per (query, candidate) (a tournament, shadow or
    import run first, then the most recently updated, then the largest id), each query's task, text and prompt
    tokens, and the watermarks."""
    s = _RunScan()
    best, last = s.best, s.last
    wanted = set(candidates) if candidates is not None else None
    cut = time.time() - WATERMARK_SKEW_S  # the scan's start, less the writers' clock skew
    for r in store.iter_runs(sources=list(sources) if sources else None, since_id=since_id):
        upd = float(r.get("updated") or 0.0)
        s.max_id = max(s.max_id, int(r["id"]))
        s.max_upd = max(s.max_upd, upd)
        if s.seen is not None and upd > cut:
            s.seen[int(r["id"])] = upd
            s.seen = s.seen if len(s.seen) <= MAX_SEEN else None
        if wanted is not None and r["candidate"] not in wanted:
            continue
        qid = r["query_id"]
        s.qinfo.setdefault(qid, (r["task"], r["text"]))
        last[qid] = max(last.get(qid, 0), int(r["id"]))
        if r.get("prompt_tokens") is not None:
            s.ptoks.setdefault(qid, []).append(int(r["prompt_tokens"]))
        if r.get("score") is None or r.get("energy_j") is None:
            continue
        key = (qid, r["candidate"])
        rank = (float(r["source"] in UNBIASED_SOURCES), upd, int(r["id"]))
        if key not in best or rank >= best[key][:3]:
            ct = r.get("completion_tokens")
            best[key] = (*rank, float(r["score"]), float(r["energy_j"]), np.nan if ct is None else float(ct))
    # the ``updated`` watermark is no later than the scan's start (less a clock-skew margin between the table's
    # writers and this process): a label written to a row the scan had passed, while rows updated after it were
    # read, counts as new for the next run instead of falling between two watermarks; the runs read within the
    # margin are remembered (``seen``) so the next run does not count them again while they are unchanged
    s.max_upd = min(s.max_upd, cut)
    return s


def _candidate_order(best: dict[tuple[str, str], tuple], candidates: Sequence[str] | None, store: Any) -> list[str]:
    """The matrix's columns: ``candidates`` checked (no duplicate, each with a labelled run), or by default
    every candidate with a labelled run, ordered by mean energy (J) ascending, then name."""
    if candidates is None:
        energy: dict[str, list[float]] = {}
        for (_, c), r in best.items():
            energy.setdefault(c, []).append(r[4])
        return sorted(energy, key=lambda c: (float(np.mean(energy[c])), c))
    cands = list(candidates)
    if len(set(cands)) != len(cands):
        raise MatrixError(f"candidates: duplicate name in {cands}")
    have = {c for (_, c) in best}
    missing = [c for c in cands if c not in have]
    if missing:
        raise MatrixError(
            f"candidate {missing[0]!r}: no labelled runs in table {redact_url(getattr(store, 'url', '?'))}"
        )
    return cands


def _assemble(scan: _RunScan, cands: list[str], require_text: bool, store: Any) -> TableMatrix:
    """The matrix of the queries with a labelled run for every candidate in ``cands`` (and text, when
    ``require_text``), in query-id order; the others counted in ``dropped``."""
    K = len(cands)
    ids, tasks, texts, pt, Y, E, T = [], [], [], [], [], [], []
    dropped = {"missing_label": 0, "no_text": 0}
    for qid in sorted(scan.qinfo):
        rows = [scan.best.get((qid, c)) for c in cands]
        if any(r is None for r in rows):
            dropped["missing_label"] += 1
            continue
        task, text = scan.qinfo[qid]
        if require_text and text is None:
            dropped["no_text"] += 1
            continue
        ids.append(qid)
        tasks.append(task)
        texts.append(text)
        pt.append(query_prompt_tokens(scan.ptoks.get(qid), text))
        y = np.empty(K)
        e = np.empty(K)
        t = np.full(K, np.nan)
        for k, r in enumerate(rows):
            y[k], e[k], t[k] = r[3], r[4], r[5]
        Y.append(y)
        E.append(e)
        T.append(t)
    if not ids and dropped["no_text"]:
        raise MatrixError(
            f"table {redact_url(getattr(store, 'url', '?'))}: {dropped['no_text']} fully labelled queries are stored "
            "without their text (privacy.store_text: false), and this scorer learns from text"
        )
    if not ids:
        raise MatrixError(
            f"table {redact_url(getattr(store, 'url', '?'))}: 0 fully labelled queries (none has labelled runs for all {K} candidates {cands})"
        )
    return TableMatrix(
        candidates=cands,
        ids=np.array(ids, dtype=object),
        tasks=np.array(tasks, dtype=object),
        texts=texts,
        prompt_tokens=np.array(pt),
        Y=np.array(Y),
        E=np.array(E),
        T=np.array(T),
        dropped=dropped,
        max_run_id=scan.max_id,
        max_updated=scan.max_upd,
        seen=scan.seen,
        last_run=np.array([scan.last[i] for i in ids], dtype=np.int64),
    )
