"""The no-support rule of :mod:`litellm_energy_router.router.adapt`, measured by leave-task-out CV.

    python -m litellm_energy_router.training.support_fit [--db URL] [--k 20] [--boot 1000]

For each task of the development rows (default: the bundled RouterBench rows) held out in turn, with its tag
hidden: a reference sample of the other tasks' rows (at most ``MAX_REF``, as a checkpoint's length model ships)
gives each held-out query its **support**, the largest cosine between n-gram sketches
(:func:`~litellm_energy_router.router.length_model.sketch`: the same figure serving reads from the decision's
note); a query-dependent scorer fitted on the other tasks (cosine kNN on the same sketches, ``k`` neighbours
shrunk toward the pooled prior: numpy, as the served student, whose per-fold training costs minutes) gives
``P``; the pooled prior (the other tasks' mean correctness per candidate: the best simple policy on an unseen
task, docs/training.md) gives ``π``. The rule ``w = clip((s - lo) / (hi - lo), 0, 1)``, ``P' = w P + (1 - w) π``
is chosen on a grid by the mean Brier score over the *other* held-out tasks, and judged on this one: Brier
score and the accuracy of each query's argmax candidate (λ = 0), with bootstrap 95 % intervals over the
held-out queries of the difference to the pooled prior. In-distribution rows (5 random folds, tags hidden)
check that the rule leaves supported traffic to the scorer. numpy only; rows read through the table.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from litellm_energy_router.router.length_model import buckets, sketch

MAX_REF = 2000
LO_GRID = np.round(np.arange(0.0, 0.71, 0.05), 2)
WIDTH_GRID = (0.05, 0.1, 0.15, 0.25, 0.4)


def sketches(texts: list[str]) -> np.ndarray:
    return np.stack([sketch(buckets(t or "")) for t in texts]).astype(np.float32)


def knn_fold(
    S_tr: np.ndarray, Y_tr: np.ndarray, S_te: np.ndarray, k: int, shrink: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``P[n, K]`` kNN on the training sketches, support ``s[n]`` against a ``MAX_REF`` sample, pooled prior ``π[K]``)."""
    prior = np.nanmean(Y_tr, axis=0)
    Y = np.where(np.isnan(Y_tr), prior, Y_tr)
    sim = S_te @ S_tr.T
    nn = np.argpartition(-sim, k - 1, axis=1)[:, :k]
    P = (Y[nn].sum(axis=1) + shrink * prior) / (k + shrink)
    ref = np.random.default_rng(seed).choice(len(S_tr), min(MAX_REF, len(S_tr)), replace=False)
    return P, np.max(sim[:, ref], axis=1), prior


def blend(P: np.ndarray, prior: np.ndarray, s: np.ndarray, lo: float, hi: float) -> np.ndarray:
    w = np.clip((s - lo) / max(hi - lo, 1e-9), 0.0, 1.0)[:, None]
    return w * P + (1 - w) * prior[None, :]


def brier_rows(P: np.ndarray, Y: np.ndarray) -> np.ndarray:
    return np.nanmean((P - Y) ** 2, axis=1)


def acc_rows(P: np.ndarray, Y: np.ndarray) -> np.ndarray:
    return np.nan_to_num(Y)[np.arange(len(P)), np.argmax(P, axis=1)]


def choose_rule(folds: list[dict[str, Any]]) -> tuple[float, float]:
    """(lo, hi) minimising the mean (over ``folds``) Brier score of the blend."""
    best = None
    for lo in LO_GRID:
        for wd in WIDTH_GRID:
            b = np.mean([brier_rows(blend(f["P"], f["prior"], f["s"], lo, lo + wd), f["Y"]).mean() for f in folds])
            if best is None or b < best[0]:
                best = (b, float(lo), float(lo + wd))
    return best[1], best[2]


def boot_ci(d: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    means = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(n_boot)]
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def leave_task_out(m: Any, k: int, shrink: float) -> dict[str, dict[str, Any]]:
    S = sketches(list(m.texts))
    out = {}
    for t in m.task_names():
        tr, te = np.flatnonzero(m.tasks != t), np.flatnonzero(m.tasks == t)
        P, s, prior = knn_fold(S[tr], m.Y[tr], S[te], k, shrink)
        out[t] = {"P": P, "s": s, "prior": prior, "Y": m.Y[te]}
    return out


def in_distribution(m: Any, k: int, shrink: float, folds: int = 5, seed: int = 0) -> dict[str, Any]:
    S = sketches(list(m.texts))
    part = np.random.default_rng(seed).integers(0, folds, m.n)
    res = {"P": np.zeros((m.n, m.K)), "s": np.zeros(m.n), "prior": None, "Y": m.Y, "priors": np.zeros((m.n, m.K))}
    for f in range(folds):
        tr, te = np.flatnonzero(part != f), np.flatnonzero(part == f)
        P, s, prior = knn_fold(S[tr], m.Y[tr], S[te], k, shrink)
        res["P"][te], res["s"][te], res["priors"][te] = P, s, prior
    return res


def report(m: Any, k: int = 20, shrink: float = 5.0, n_boot: int = 1000) -> str:
    """Markdown: per held-out task, the rule chosen on the other tasks and its Brier / accuracy against the
    pooled prior and the scorer alone (differences with bootstrap 95 % intervals); then in-distribution."""
    lto = leave_task_out(m, k, shrink)
    head = (
        "| held-out task | rule (lo, hi) chosen on the others | support median | w = 0 share | Brier: prior / scorer / blend "
        "| blend − prior Brier [95 % CI] | argmax accuracy: prior / scorer / blend | blend − prior accuracy [95 % CI] |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for t, f in lto.items():
        lo, hi = choose_rule([g for u, g in lto.items() if u != t])
        Pp, Pb = np.broadcast_to(f["prior"], f["P"].shape), blend(f["P"], f["prior"], f["s"], lo, hi)
        b = [brier_rows(X, f["Y"]) for X in (Pp, f["P"], Pb)]
        a = [acc_rows(X, f["Y"]) for X in (Pp, f["P"], Pb)]
        db, da = boot_ci(b[2] - b[0], n_boot), boot_ci(a[2] - a[0], n_boot)
        lines.append(
            f"| {t} (n={len(f['s'])}) | ({lo:.2f}, {hi:.2f}) | {np.median(f['s']):.3f} | {np.mean(f['s'] <= lo):.2f} | "
            + " / ".join(f"{x.mean():.4f}" for x in b)
            + f" | {db[0]:+.4f} [{db[1]:+.4f}, {db[2]:+.4f}] | "
            + " / ".join(f"{x.mean():.4f}" for x in a)
            + f" | {da[0]:+.4f} [{da[1]:+.4f}, {da[2]:+.4f}] |"
        )
    lo, hi = choose_rule(list(lto.values()))
    d = in_distribution(m, k, shrink)
    w = np.clip((d["s"] - lo) / (hi - lo), 0, 1)
    Pb = w[:, None] * d["P"] + (1 - w[:, None]) * d["priors"]
    bs, bb = brier_rows(d["P"], d["Y"]), brier_rows(Pb, d["Y"])
    db = boot_ci(bb - bs, n_boot)
    da = boot_ci(acc_rows(Pb, d["Y"]) - acc_rows(d["P"], d["Y"]), n_boot)
    lines += [
        "",
        f"Rule chosen on all held-out tasks: lo = {lo:.2f}, hi = {hi:.2f}.",
        (
            f"In-distribution (5 random folds, tags hidden, n={m.n}): support median {np.median(d['s']):.3f}, "
            f"w < 1 for {np.mean(w < 1):.3f} of rows; Brier scorer {bs.mean():.4f}, blend {bb.mean():.4f}, "
            f"blend − scorer {db[0]:+.4f} [{db[1]:+.4f}, {db[2]:+.4f}]; argmax accuracy blend − scorer "
            f"{da[0]:+.4f} [{da[1]:+.4f}, {da[2]:+.4f}]."
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None, help="table URL (default: the bundled RouterBench rows)")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--boot", type=int, default=1000)
    a = ap.parse_args(argv)
    from .crossval import routerbench_matrix
    from .data import load_matrix

    if a.db:
        from litellm_energy_router.table import open_store

        store = open_store(a.db, create=False)
        m = load_matrix(store)
        store.close()
    else:
        m = routerbench_matrix()
    print(report(m, k=a.k, n_boot=a.boot))


if __name__ == "__main__":
    main()
