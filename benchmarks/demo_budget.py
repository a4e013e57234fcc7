"""What the demo's training budget costs: the first checkpoints of two demo runs on the same held-back queries.

    python benchmarks/demo_budget.py LONG_WORKDIR SHORT_WORKDIR [--boot 1000]

Each workdir is one finished ``energy-router demo`` (e.g. ``--full-training`` and the default). Both first
checkpoints (the ones that served) are scored as the demo's comparison scores them (serving scorer, no task tag)
on the demo's 461 held-back queries; AIQ (accuracy-vs-estimated-J hull) of each and the paired bootstrap 95 %
interval of the difference (the same query resamples for both). Also each run's retrain gate numbers and the
wall/CPU seconds of its stages (from ``summary.json``). Last line ``aiq_long=... aiq_short=... diff=... lo=... hi=...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    from litellm_energy_router.demo import compare
    from litellm_energy_router.demo.loop import DemoConfig, _served_matrices, held_back
    from litellm_energy_router.router.checkpoint import read_manifest

    ap = argparse.ArgumentParser()
    ap.add_argument("long", type=Path)
    ap.add_argument("short", type=Path)
    ap.add_argument("--boot", type=int, default=1000)
    a = ap.parse_args()
    runs = {k: json.loads((d / "summary.json").read_text()) for k, d in (("long", a.long), ("short", a.short))}
    _, held = held_back(DemoConfig())
    sweeps = {}
    for k, s in runs.items():
        ck = Path(s["first_version"]["checkpoint"])
        cands = list(read_manifest(ck).candidates)
        pt, _, Y, E = _served_matrices(held, cands)
        sweeps[k] = compare.router_sweep(ck, [r.prompt for r in held], pt, Y, E, s["lambda"], n_boot=a.boot)
        sw = sweeps[k]
        g = s["retrain"].get("comparison") or {}
        print(
            f"{k}: {s['first_version']['version']}  AIQ {sw.evaluation.method('router').aiq:.4f} (static hull "
            f"{sw.evaluation.method('zero router (static hull)').aiq:.4f}) on {len(held)} held-back queries; "
            f"retrain {s['retrain']['status']} (candidate AIQ {g.get('candidate', {}).get('aiq')}, serving "
            f"{g.get('serving', {}).get('aiq')} on {g.get('held_out_queries')} retrain held-out queries); "
            f"wall {s['wall_s']} s {s['steps_s']}; CPU {s.get('cpu_s')}"
        )
    la, sa = (sweeps[k].evaluation.method("router").aiq for k in ("long", "short"))
    d = sweeps["short"].aiq_boot - sweeps["long"].aiq_boot
    lo, hi = np.percentile(d, [2.5, 97.5])
    print(f"short - long AIQ {sa - la:+.4f}, paired bootstrap 95% [{lo:+.4f}, {hi:+.4f}] ({a.boot} resamples)")
    print(f"aiq_long={la:.4f} aiq_short={sa:.4f} diff={sa - la:+.4f} lo={lo:+.4f} hi={hi:+.4f}")


if __name__ == "__main__":
    main()
