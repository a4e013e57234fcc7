"""The ``energy-router report --plot`` figure (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def plot_days(rows: Sequence[dict[str, Any]], out: Path) -> None:
    """Three panels per UTC day: GPU joules stacked by team, gCO2e stacked by team, and the router's estimated
    joules against the reference deployment's (the gap is what routing saved). ``rows``: ledger sums by
    (day, team)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = sorted({r["day"] for r in rows})
    teams = sorted({r["team"] or "(none)" for r in rows})
    idx = {d: i for i, d in enumerate(days)}

    def series(team: str, key: str) -> list[float]:
        v = [0.0] * len(days)
        for r in rows:
            if (r["team"] or "(none)") == team:
                v[idx[r["day"]]] += float(r[key] or 0.0)
        return v

    fig, axes = plt.subplots(3, 1, figsize=(max(6, len(days) * 0.6 + 3), 9), sharex=True)
    x = list(range(len(days)))
    for ax, key, label in ((axes[0], None, "GPU energy, J"), (axes[1], "co2e_g", "gCO2e")):
        bottom = [0.0] * len(days)
        for team in teams:
            if key is None:
                v = [a + b for a, b in zip(series(team, "joules_measured"), series(team, "joules_estimated"))]
            else:
                v = series(team, key)
            ax.bar(x, v, bottom=bottom, label=team)
            bottom = [a + b for a, b in zip(bottom, v)]
        ax.set_ylabel(label)
    axes[0].legend(title="team", fontsize="small")
    routed = [sum(vals) for vals in zip(*(series(t, "joules_router_estimate") for t in teams))] or [0.0] * len(days)
    ref = [sum(vals) for vals in zip(*(series(t, "joules_reference") for t in teams))] or [0.0] * len(days)
    axes[2].plot(x, ref, marker="o", label="reference deployment (estimated)")
    axes[2].plot(x, routed, marker="o", label="routed (estimated)")
    axes[2].fill_between(x, routed, ref, alpha=0.2, label="saved")
    axes[2].set_ylabel("J, routed requests")
    axes[2].legend(fontsize="small")
    axes[2].set_xticks(x, days, rotation=45, ha="right")
    fig.suptitle("Energy and carbon per day")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
