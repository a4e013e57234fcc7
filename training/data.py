"""The tournament table as a dense matrix, query-level splits, and the routing-time energy estimator.

numpy only at module level: serving code may import :class:`EnergyEstimator` (it is serialised into a
checkpoint manifest with :meth:`EnergyEstimator.to_dict`).

Units: energy in joules (J), tokens as counts, scores (correctness) in [0, 1].

* :func:`load_matrix` — one row per query, one column per candidate: correctness ``Y[n, K]``, true
  energy ``E[n, K]`` (J), completion tokens ``T[n, K]``, plus id, task, text and prompt tokens.
* :func:`kfold` / :func:`holdout_split` — splits **by query** (a query is never in train and test).
* :class:`EnergyEstimator` — ``Ê[n, K]`` from what is known at routing time: the prompt length and the
  task. ``Ê_j = prompt_tokens · j_prompt_j + expected_output_tokens_j(task) · j_output_j``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

UNKNOWN_TASK = "*"


class MatrixError(ValueError):
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

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def K(self) -> int:
        return len(self.candidates)

    def subset(self, idx: Sequence[int] | np.ndarray) -> "TableMatrix":
        """Rows ``idx`` (indices into this matrix), same candidates."""
        idx = np.asarray(idx, dtype=np.int64)
        return TableMatrix(
            candidates=list(self.candidates), ids=self.ids[idx], tasks=self.tasks[idx],
            texts=[self.texts[i] for i in idx], prompt_tokens=self.prompt_tokens[idx],
            Y=self.Y[idx], E=self.E[idx], T=self.T[idx], dropped=dict(self.dropped),
        )  # fmt: skip

    def task_names(self) -> list[str]:
        return sorted(set(self.tasks.tolist()))

    def summary(self) -> str:
        acc = ", ".join(f"{c}: acc {self.Y[:, k].mean():.3f} / {self.E[:, k].mean():.1f} J" for k, c in enumerate(self.candidates))
        return f"{self.n} queries x {self.K} candidates ({acc})"


def load_matrix(
    store: Any,
    candidates: Sequence[str] | None = None,
    *,
    sources: Sequence[str] | None = None,
) -> TableMatrix:
    """Read ``store.iter_runs(sources=...)`` into a :class:`TableMatrix`.

    A query is kept only when every candidate has a labelled run (score and energy present) for it;
    the counts of dropped queries are in ``matrix.dropped``. When a (query, candidate) pair has several
    runs (several sources), the most recently written one (largest run id) wins. ``candidates``
    default: every candidate with a labelled run, ordered by mean energy ascending.
    """
    best: dict[tuple[str, str], dict[str, Any]] = {}
    qinfo: dict[str, tuple[str, str | None]] = {}
    ptoks: dict[str, list[int]] = {}
    wanted = set(candidates) if candidates is not None else None
    for r in store.iter_runs(sources=sources):
        if wanted is not None and r["candidate"] not in wanted:
            continue
        qid = r["query_id"]
        qinfo.setdefault(qid, (r["task"], r["text"]))
        if r.get("prompt_tokens") is not None:
            ptoks.setdefault(qid, []).append(int(r["prompt_tokens"]))
        if r.get("score") is None or r.get("energy_j") is None:
            continue
        key = (qid, r["candidate"])
        if key not in best or r["id"] > best[key]["id"]:
            best[key] = r
    if not best:
        raise MatrixError(f"table {getattr(store, 'url', '?')}: no labelled runs (score and energy_j) "
                          f"{'for sources ' + ','.join(sources) if sources else ''}".rstrip())
    if candidates is None:
        energy: dict[str, list[float]] = {}
        for (_, c), r in best.items():
            energy.setdefault(c, []).append(float(r["energy_j"]))
        cands = sorted(energy, key=lambda c: (float(np.mean(energy[c])), c))
    else:
        cands = list(candidates)
        if len(set(cands)) != len(cands):
            raise MatrixError(f"candidates: duplicate name in {cands}")
        have = {c for (_, c) in best}
        missing = [c for c in cands if c not in have]
        if missing:
            raise MatrixError(f"candidate {missing[0]!r}: no labelled runs in table {getattr(store, 'url', '?')}")
    K = len(cands)
    col = {c: k for k, c in enumerate(cands)}
    ids, tasks, texts, pt, Y, E, T = [], [], [], [], [], [], []
    dropped = {"missing_label": 0}
    for qid in sorted(qinfo):
        rows = [best.get((qid, c)) for c in cands]
        if any(r is None for r in rows):
            dropped["missing_label"] += 1
            continue
        task, text = qinfo[qid]
        ids.append(qid)
        tasks.append(task)
        texts.append(text)
        toks = ptoks.get(qid)
        if toks:
            pt.append(float(np.median(toks)))
        else:  # unknown: ~4 characters per token, a rough stand-in
            pt.append(float(math.ceil(len(text or "") / 4)))
        y = np.empty(K)
        e = np.empty(K)
        t = np.full(K, np.nan)
        for r in rows:
            k = col[r["candidate"]]
            y[k] = float(r["score"])
            e[k] = float(r["energy_j"])
            if r.get("completion_tokens") is not None:
                t[k] = float(r["completion_tokens"])
        Y.append(y)
        E.append(e)
        T.append(t)
    if not ids:
        raise MatrixError(f"table {getattr(store, 'url', '?')}: no query has labelled runs for all {K} candidates {cands}")
    return TableMatrix(
        candidates=cands, ids=np.array(ids, dtype=object), tasks=np.array(tasks, dtype=object), texts=texts,
        prompt_tokens=np.array(pt), Y=np.array(Y), E=np.array(E), T=np.array(T), dropped=dropped,
    )  # fmt: skip


# -- splits (by query) ---------------------------------------------------------------------------------


def kfold(ids: Sequence[str], k: int = 5, *, seed: int = 0, groups: Sequence[str] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` (train_idx, test_idx) pairs over positions of ``ids`` (query ids), split by query.

    Every query is in exactly one test fold. Duplicate ids stay together (rows of the same query never
    straddle train and test). ``groups`` (e.g. tasks) stratifies: each group is spread evenly over the
    folds. Deterministic in ``seed``.
    """
    ids = np.asarray(list(ids), dtype=object)
    uniq, inv = np.unique(ids.astype(str), return_inverse=True)
    if k < 2 or k > len(uniq):
        raise ValueError(f"folds={k}: need 2 <= folds <= number of queries ({len(uniq)})")
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(uniq), dtype=np.int64)
    if groups is None:
        strata = [np.arange(len(uniq))]
    else:
        g = np.asarray(list(groups), dtype=object).astype(str)
        first = np.zeros(len(uniq), dtype=np.int64)
        first[inv[::-1]] = np.arange(len(ids))[::-1]  # first row of each unique query
        ug = g[first]
        strata = [np.flatnonzero(ug == name) for name in sorted(set(ug.tolist()))]
    offset = 0
    for members in strata:
        perm = rng.permutation(members)
        fold_of[perm] = (np.arange(len(perm)) + offset) % k
        offset += len(perm)  # continue round-robin so small strata do not all land in fold 0
    row_fold = fold_of[inv]
    return [(np.flatnonzero(row_fold != f), np.flatnonzero(row_fold == f)) for f in range(k)]


def holdout_split(ids: Sequence[str], test_fraction: float = 0.2, *, salt: str = "holdout") -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, test_idx) by a stable hash of each query id: a query keeps its side as the table
    grows, so a held-out set used to compare checkpoints never leaks into later training."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction}: must be in (0, 1)")
    u = np.array([int.from_bytes(hashlib.sha256(f"{salt}:{i}".encode()).digest()[:8], "big") / 2**64 for i in ids])
    test = u < test_fraction
    return np.flatnonzero(~test), np.flatnonzero(test)


# -- energy estimate at routing time ------------------------------------------------------------------


def _fit_nonneg_2(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares ``y ≈ a·x1 + b·x2`` with a, b ≥ 0 (no intercept)."""
    X = np.stack([x1, x2], axis=1)
    a, b = np.linalg.lstsq(X, y, rcond=None)[0]
    if a >= 0 and b >= 0:
        return float(a), float(b)
    fits = []
    for j in (0, 1):
        xj = X[:, j]
        c = max(float(xj @ y) / max(float(xj @ xj), 1e-12), 0.0)
        fits.append((float(np.sum((y - c * xj) ** 2)), j, c))
    _, j, c = min(fits)
    return (c, 0.0) if j == 0 else (0.0, c)


@dataclass
class EnergyEstimator:
    """Routing-time energy estimate ``Ê[n, K]`` (J).

    ``Ê_j = prompt_tokens · j_prompt[j] + out_tokens[task][j] · j_output[j]``. Expected output tokens are
    the training mean per (task, candidate), falling back to the candidate's mean over all tasks
    (``out_tokens["*"]``) for an unknown task. J/token come from the energy profile, or are fitted by
    non-negative least squares on the table's rows for a candidate the profile lacks.
    """

    candidates: list[str]
    j_prompt: list[float]  # J per prompt token
    j_output: list[float]  # J per output token
    out_tokens: dict[str, list[float]]  # task -> expected output tokens per candidate; "*" = all tasks
    e_ref: float  # J: reference energy (mean Ê of the most expensive candidate on the training rows)
    origin: dict[str, str] = field(default_factory=dict)  # candidate -> "profile" | "fitted"

    @classmethod
    def fit(cls, m: TableMatrix, profile: Any | None = None) -> "EnergyEstimator":
        """Learn expected output tokens from ``m`` (training rows only); J/token from ``profile``
        (an :class:`~litellm_energy_router.energy.profile.EnergyProfile`; ``None`` loads the bundled one)."""
        if profile is None:
            from litellm_energy_router.energy.profile import load_profile

            profile = load_profile()
        models = getattr(profile, "models", {}) or {}
        jp, jo, origin = [], [], {}
        out: dict[str, list[float]] = {}
        for k, c in enumerate(m.candidates):
            t = m.T[:, k]
            known = ~np.isnan(t)
            if c in models:
                jp.append(float(models[c].j_per_prompt_token))
                jo.append(float(models[c].j_per_output_token))
                origin[c] = "profile"
            else:
                if known.sum() < 2:
                    raise MatrixError(f"candidate {c!r}: not in the energy profile and its runs have no completion_tokens to fit J/token from")
                a, b = _fit_nonneg_2(m.prompt_tokens[known], t[known], m.E[known, k])
                if b <= 0:  # energy does not grow with output: keep a per-token rate from the mean
                    b = float(np.mean(m.E[known, k])) / max(float(np.mean(t[known])), 1.0)
                    a = 0.0
                jp.append(a)
                jo.append(b)
                origin[c] = "fitted"
        jp_a, jo_a = np.array(jp), np.array(jo)
        # expected output tokens; where completion tokens are unknown, back them out of the energy
        T = m.T.copy()
        miss = np.isnan(T)
        if miss.any():
            implied = np.maximum(m.E - m.prompt_tokens[:, None] * jp_a[None, :], 0.0) / jo_a[None, :]
            T[miss] = implied[miss]
        out[UNKNOWN_TASK] = [float(v) for v in T.mean(axis=0)]
        for task in m.task_names():
            rows = m.tasks == task
            out[task] = [float(v) for v in T[rows].mean(axis=0)]
        est = cls(list(m.candidates), jp, jo, out, e_ref=1.0, origin=origin)
        est.e_ref = float(est.predict(m.prompt_tokens, m.tasks).mean(axis=0).max())
        return est

    def predict(self, prompt_tokens: Sequence[float] | np.ndarray, tasks: Iterable[str | None]) -> np.ndarray:
        """``Ê[n, K]`` in J for prompts of ``prompt_tokens`` tokens from ``tasks`` (None/unknown → all-task mean)."""
        pt = np.asarray(prompt_tokens, dtype=np.float64)
        fallback = self.out_tokens[UNKNOWN_TASK]
        ot = np.array([self.out_tokens.get(t, fallback) if t is not None else fallback for t in tasks], dtype=np.float64)
        if ot.shape != (len(pt), len(self.candidates)):
            raise ValueError(f"prompt_tokens has {len(pt)} rows but tasks gave {ot.shape[0]}")
        return pt[:, None] * np.asarray(self.j_prompt)[None, :] + ot * np.asarray(self.j_output)[None, :]

    def predict_matrix(self, m: TableMatrix) -> np.ndarray:
        """``Ê`` for the rows of ``m`` (columns must match ``self.candidates``)."""
        if list(m.candidates) != list(self.candidates):
            raise MatrixError(f"estimator candidates {self.candidates} != matrix candidates {m.candidates}")
        return self.predict(m.prompt_tokens, m.tasks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for a checkpoint manifest)."""
        return {
            "candidates": list(self.candidates), "j_prompt": list(self.j_prompt), "j_output": list(self.j_output),
            "out_tokens": {k: list(v) for k, v in self.out_tokens.items()}, "e_ref": self.e_ref, "origin": dict(self.origin),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnergyEstimator":
        try:
            est = cls(
                candidates=list(d["candidates"]), j_prompt=[float(x) for x in d["j_prompt"]],
                j_output=[float(x) for x in d["j_output"]],
                out_tokens={str(k): [float(x) for x in v] for k, v in d["out_tokens"].items()},
                e_ref=float(d["e_ref"]), origin=dict(d.get("origin", {})),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise MatrixError(f"energy estimator: bad or missing field ({e})") from None
        K = len(est.candidates)
        if len(est.j_prompt) != K or len(est.j_output) != K or UNKNOWN_TASK not in est.out_tokens or any(len(v) != K for v in est.out_tokens.values()):
            raise MatrixError(f"energy estimator: field lengths do not match {K} candidates (or out_tokens lacks '*')")
        return est
