"""The table as dense per-query matrices for training: correctness ``Y[n, K]``, true energy ``E[n, K]`` (J),
prompt tokens, completion tokens ``T[n, K]``; queries with a missing label for any candidate are dropped."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from litellm_energy_router.router.checkpoint import EnergyEstimate
from litellm_energy_router.table import TableStore

LABELLED_SOURCES = ("import", "tournament", "shadow", "production")


@dataclass
class Matrix:
    candidates: list[str]
    ids: list[str]
    tasks: list[str]
    texts: list[str]
    prompt_tokens: np.ndarray  # [n]
    Y: np.ndarray  # [n, K] in [0, 1]
    E: np.ndarray  # [n, K] J
    T: np.ndarray  # [n, K] completion tokens
    max_run_id: int = 0
    profile_j: dict[str, tuple[float, float]] = field(default_factory=dict)  # cand -> (J/prompt tok, J/output tok)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: Sequence[int] | np.ndarray) -> "Matrix":
        idx = np.asarray(idx, dtype=int)
        return Matrix(
            self.candidates, [self.ids[i] for i in idx], [self.tasks[i] for i in idx], [self.texts[i] for i in idx],
            self.prompt_tokens[idx], self.Y[idx], self.E[idx], self.T[idx], self.max_run_id, self.profile_j,
        )  # fmt: skip


def load_matrix(store: TableStore, candidates: Sequence[str] | None = None, sources: Sequence[str] = LABELLED_SOURCES,
                since_id: int | None = None) -> Matrix:  # fmt: skip
    """Read labelled runs into a :class:`Matrix`. Candidates default to all, ordered by mean J (cheapest first).
    When a (query, candidate) has rows from several sources, the latest-updated labelled one wins."""
    cell: dict[tuple[str, str], dict] = {}
    meta: dict[str, tuple[str, str, int | None]] = {}
    max_id = 0
    for r in store.iter_runs(sources=list(sources), since_id=since_id):
        max_id = max(max_id, r["id"])
        if r["score"] is None or r["energy_j"] is None:
            continue
        key = (r["query_id"], r["candidate"])
        if key not in cell or r["updated"] >= cell[key]["updated"]:
            cell[key] = r
        if r["text"] is not None:
            meta[r["query_id"]] = (r["task"], r["text"], r["prompt_tokens"])
    if candidates is None:
        energy: dict[str, list[float]] = defaultdict(list)
        for (_, c), r in cell.items():
            energy[c].append(r["energy_j"])
        candidates = sorted(energy, key=lambda c: (float(np.mean(energy[c])), c))
    cands = list(candidates)
    qids = sorted(q for q in meta if all((q, c) in cell for c in cands))
    n, k = len(qids), len(cands)
    Y, E, T = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k))
    ptok = np.zeros(n)
    for i, q in enumerate(qids):
        for j, c in enumerate(cands):
            r = cell[(q, c)]
            Y[i, j], E[i, j], T[i, j] = r["score"], r["energy_j"], r["completion_tokens"] or 0
            ptok[i] = r["prompt_tokens"] or ptok[i]
    return Matrix(cands, qids, [meta[q][0] for q in qids], [meta[q][1] for q in qids], ptok, Y, E, T, max_id)


def fit_energy_estimate(m: Matrix) -> EnergyEstimate:
    """Fit Ê: J per prompt/output token per candidate by least squares on the rows' (tokens, J), and the
    expected output tokens per (task, candidate) and per candidate."""
    jp, jo = {}, {}
    for j, c in enumerate(m.candidates):
        A = np.stack([m.prompt_tokens, m.T[:, j]], axis=1)
        coef, *_ = np.linalg.lstsq(A, m.E[:, j], rcond=None)
        jp[c], jo[c] = float(max(coef[0], 0.0)), float(max(coef[1], 1e-9))
    per_task: dict[str, dict[str, float]] = {}
    tasks = np.asarray(m.tasks)
    for t in sorted(set(m.tasks)):
        sel = tasks == t
        per_task[t] = {c: float(m.T[sel, j].mean()) for j, c in enumerate(m.candidates)}
    any_ = {c: float(m.T[:, j].mean()) for j, c in enumerate(m.candidates)}
    return EnergyEstimate(j_per_prompt_token=jp, j_per_output_token=jo, output_tokens=per_task, output_tokens_any=any_)
