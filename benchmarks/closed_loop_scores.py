"""The closed-loop benchmark's scoring (:mod:`closed_loop`): a serving checkpoint on the held-out queries, scored
without a task tag as serving does, the arms' table, and the paired bootstrap of one arm against another
(accuracy difference, J ratio)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from litellm_energy_router.training.data import TableMatrix, load_matrix
from litellm_energy_router.training.evaluate import evaluate

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide
from litellm_energy_router.router.scoring import load_scorer
from litellm_energy_router.table import open_store

LABEL = {
    "loop": "loop (production rows used)",
    "ignored": "(a) production ignored",
    "tournament": "(b) tournament rows of the task",
}


@dataclass
class Scores:
    acc: np.ndarray  # [n] correctness of the chosen candidate per held-out query
    joules: np.ndarray  # [n] its estimated J
    aiq_new: float
    aiq_pooled: float
    version: str


def load_eval(url: str) -> TableMatrix:
    store = open_store(url)
    try:
        return load_matrix(store)
    finally:
        store.close()


def score_checkpoint(pointer: Path, m: TableMatrix, new_mask: np.ndarray, lam: float) -> Scores:
    """The serving checkpoint on the held-out queries, scored without a task tag (as serving does)."""
    model = load_scorer(pointer)
    cols = [m.candidates.index(c) for c in model.candidates]
    Y, E = m.Y[:, cols], m.E[:, cols]
    texts, none = list(m.texts), [None] * len(m)
    P = model.score(texts, none)
    Eh = model.energy(texts, none, prompt_tokens=list(m.prompt_tokens))
    ch = decide(P, Eh, Knob.point(lambda_=lam, e_ref_j=DEFAULT_E_REF_J))
    idx = np.arange(len(m))

    def aiq(k: np.ndarray) -> float:
        return evaluate(Y[k], E[k], {"r": (P[k], Eh[k])}, model.candidates).method("r").aiq

    return Scores(
        Y[idx, ch], E[idx, ch], aiq(new_mask), aiq(np.ones(len(m), dtype=bool)), read_manifest(resolve(pointer)).version
    )


def table_lines(scores: dict[str, Scores], status: dict[str, str], new_mask: np.ndarray, task: str) -> list[str]:
    lines = [
        f"| arm | retrain | {task} acc | {task} J/q | {task} AIQ | pooled acc | pooled J/q | pooled AIQ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in scores.items():
        n = new_mask
        lines.append(
            f"| {LABEL.get(arm, arm)} | {status.get(arm, '-')} | {s.acc[n].mean():.3f} | {s.joules[n].mean():.1f} | "
            f"{s.aiq_new:.4f} | {s.acc.mean():.3f} | {s.joules.mean():.1f} | {s.aiq_pooled:.4f} |"
        )
    return lines


def gain(
    a: Scores, b: Scores, new_mask: np.ndarray, n_boot: int, seed: int = 0
) -> tuple[float, float, tuple[float, ...]]:
    """New-task accuracy difference a − b and J ratio a / b, with paired bootstrap 95 % intervals."""
    acc_a, acc_b = a.acc[new_mask], b.acc[new_mask]
    j_a, j_b = a.joules[new_mask], b.joules[new_mask]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(acc_a), size=(n_boot, len(acc_a)))
    d = acc_a[idx].mean(axis=1) - acc_b[idx].mean(axis=1)
    r = j_a[idx].mean(axis=1) / j_b[idx].mean(axis=1)
    lo_d, hi_d = np.percentile(d, [2.5, 97.5])
    lo_r, hi_r = np.percentile(r, [2.5, 97.5])
    return float(acc_a.mean() - acc_b.mean()), float(j_a.mean() / j_b.mean()), (lo_d, hi_d, lo_r, hi_r)


def task_lines(m: TableMatrix, task: str) -> list[str]:
    out = []
    for name, k in ((task, m.tasks == task), ("other tasks", m.tasks != task)):
        acc = ", ".join(f"{c.split('/')[-1]} {m.Y[k, j].mean():.2f}" for j, c in enumerate(m.candidates))
        out.append(f"  held-out {name} ({int(k.sum())} queries), accuracy per candidate (cheapest first): {acc}")
    return out
