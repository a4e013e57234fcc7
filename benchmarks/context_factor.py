"""Offline: what 50 production rows of the served candidate could teach about the others, per held-out task.

    python benchmarks/context_factor.py [--workdir DIR] [--rows 50] [--draws 200] [--no-routerbench] [--no-llmrouter]

Each task of a development matrix in turn is the new app. Its rows of the one candidate a pooled-prior router serves
at λ (the served candidate: argmax of pooled accuracy − λ·J/100 J) are drawn (``--rows`` labels, binomial at that
candidate's accuracy on the task, ``--draws`` times), and the other candidates' accuracy on the task is predicted by

* **pooled**: the other tasks' pooled accuracy (no row of the app used);
* **shift**: the context's shift as served (``router/context._shrink``): every candidate moved by the served one's
  shrunk residual, the served one by its own rows (n0 pseudo-rows);
* **factor**: a rank-1 logit model of candidate × task fitted on the other tasks, ``logit A[t, k] = b_k + u_t·v_k``
  (SVD of the centred logits), the app's ``u`` from the served candidate's rows (a Gaussian prior on ``u`` of the
  other tasks' spread, the rows' binomial variance), the served candidate by its own rows as in *shift*.

Each prediction's choice at λ is scored by its true value on the task (accuracy − λ·J/100 J, the matrix's J) minus
the best candidate's: the regret (≤ 0). Per task the mean over the draws; over tasks the mean and a 95 % bootstrap
interval (2,000 resamples of the tasks) of factor − shift. Not served: a lead for the context prior
(docs/unseen_traffic.md). Last line: ``tasks=<n> regret_pooled=<x> regret_shift=<y> regret_factor=<z>
factor_minus_shift_lo=<a> factor_minus_shift_hi=<b>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from litellm_energy_router.training.data import load_matrix  # noqa: E402
from unseen_traffic import ensure_tables  # noqa: E402

from litellm_energy_router.table import open_store  # noqa: E402


def _logit(p):
    p = np.clip(p, 0.02, 0.98)
    return np.log(p / (1 - p))


def task_means(m) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(tasks, accuracy ``[T, K]``, J ``[T, K]``, queries per task ``[T]``) of a :class:`TableMatrix`."""
    tasks = sorted(set(m.tasks.tolist()))
    A = np.array([m.Y[m.tasks == t].mean(0) for t in tasks])
    J = np.array([m.E[m.tasks == t].mean(0) for t in tasks])
    return tasks, A, J, np.array([(m.tasks == t).sum() for t in tasks], dtype=float)


def fit(A_other, n_other) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(pooled accuracy ``[K]``, the factor's ``b[K]``, ``v[K]`` and prior variance of ``u``) of the other tasks."""
    pooled = (A_other * n_other[:, None]).sum(0) / n_other.sum()
    L = _logit(A_other)
    b = L.mean(0)
    _, S, Vt = np.linalg.svd(L - b, full_matrices=False)
    return pooled, b, Vt[0], S[0] ** 2 / len(A_other)


def predict(fitted, g, a_obs, rows, n0) -> dict[str, np.ndarray]:
    """Each method's accuracy per candidate on the app, from ``rows`` labels of candidate ``g`` at rate ``a_obs``."""
    pooled, b, v, prior_var = fitted
    own = lambda parent: (a_obs * rows + n0 * parent) / (rows + n0)  # noqa: E731 - the served one's own rows
    shift = np.clip(pooled + (a_obs - pooled[g]) * rows / (rows + n0), 0, 1)
    shift[g] = own(shift[g])
    obs_var = 1.0 / (rows * max(a_obs * (1 - a_obs), 0.02))
    u = prior_var * v[g] * (_logit(a_obs) - b[g]) / (prior_var * v[g] ** 2 + obs_var)
    factor = 1 / (1 + np.exp(-(b + u * v)))
    factor[g] = own(factor[g])
    return {"pooled": pooled, "shift": shift, "factor": factor}


def regrets(A, J, n, lam, rows, draws, n0, rng) -> dict[str, np.ndarray]:
    """Per method, the mean regret per held-out task ``[T]``."""
    out = {k: np.zeros(len(A)) for k in ("pooled", "shift", "factor")}
    for h in range(len(A)):
        other = np.arange(len(A)) != h
        cost = lam * J[h] / 100.0
        value = A[h] - cost
        fitted = fit(A[other], n[other])
        g = int(np.argmax(fitted[0] - cost))  # the candidate the pooled prior serves
        for _ in range(draws):
            a_obs = rng.binomial(rows, A[h, g]) / rows
            for k, P in predict(fitted, g, a_obs, rows, n0).items():
                out[k][h] += (value[int(np.argmax(P - cost))] - value.max()) / draws
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "unseen_traffic")
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--lam", type=float, default=0.22, help="operator λ, accuracy per 100 J")
    ap.add_argument("--n0", type=float, default=2.0, help="pseudo-rows of the served candidate's parent")
    ap.add_argument("--no-routerbench", action="store_true")
    ap.add_argument("--no-llmrouter", action="store_true")
    a = ap.parse_args()
    a.routerbench_db = a.llmrouter_db = a.llmrouter = None
    a.workdir.mkdir(parents=True, exist_ok=True)
    rng, all_r = np.random.default_rng(0), {k: [] for k in ("pooled", "shift", "factor")}
    for name, url, _ in ensure_tables(a, a.workdir, print):
        with open_store(url) as s:
            tasks, A, J, n = task_means(load_matrix(s, require_text=False))
        r = regrets(A, J, n, a.lam, a.rows, a.draws, a.n0, rng)
        for i, t in enumerate(tasks):
            print(f"{name:12s} {t:22s} " + "  ".join(f"{k} {r[k][i]:+.3f}" for k in r))
        for k in r:
            all_r[k] += r[k].tolist()
    R = {k: np.array(v) for k, v in all_r.items()}
    d = R["factor"] - R["shift"]
    boot = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(
        f"tasks={len(d)} regret_pooled={R['pooled'].mean():.4f} regret_shift={R['shift'].mean():.4f} "
        f"regret_factor={R['factor'].mean():.4f} factor_minus_shift_lo={lo:.4f} factor_minus_shift_hi={hi:.4f}"
    )


if __name__ == "__main__":
    main()
