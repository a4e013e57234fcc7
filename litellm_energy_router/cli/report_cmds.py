"""``energy-router report``: the energy and carbon ledger by key, team, model group, user, deployment or day."""

from __future__ import annotations

import csv
import io
import json
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from litellm_energy_router.cli.common import ConfigOpt, DbOpt, console, db_url, fail
from litellm_energy_router.cli.table_cmds import _store
from litellm_energy_router.table.ledger import BY

COLUMNS = [
    ("requests", "requests", "d"),
    ("tokens", None, "d"),
    ("J measured", "joules_measured", ".1f"),
    ("J estimated", "joules_estimated", ".1f"),
    ("gCO2e", "co2e_g", ".3f"),
    ("J router est.", "joules_router_estimate", ".1f"),
    ("J reference", "joules_reference", ".1f"),
    ("J saved", "joules_saved", ".1f"),
    ("saved %", None, ".1f"),
]


def _since(v: Optional[str], option: str = "--since") -> Optional[str]:
    """``YYYY-MM-DD`` or ``Nd`` (N days ago, UTC) -> ``YYYY-MM-DD``; ``option`` names it in an error."""
    if v is None:
        return None
    if v.endswith("d") and v[:-1].isdigit():
        try:
            return (datetime.now(timezone.utc).date() - timedelta(days=int(v[:-1]))).isoformat()
        except OverflowError:
            fail(f"{option} {v!r}: too far back (the calendar starts at year 1)")
    try:
        return date.fromisoformat(v).isoformat()
    except ValueError:
        fail(f"{option} {v!r}: expected YYYY-MM-DD or a number of days such as 7d")
        raise  # unreachable


def _row(r: dict[str, Any], by: str) -> dict[str, Any]:
    col = BY[by][0]
    out = {by: r[col] or "(none)"}
    if "label" in r:
        out["label"] = r["label"]
    out.update({k: r[k] for k in r if k not in (col, "label")})
    out["tokens"] = int(r["prompt_tokens"] or 0) + int(r["completion_tokens"] or 0)
    ref = r["joules_reference"] or 0.0
    out["saved_pct"] = 100.0 * r["joules_saved"] / ref if ref > 0 else None
    return out


def _table(rows: list[dict[str, Any]], by: str, title: str) -> Table:
    t = Table(title=title)
    t.add_column(by)
    if any("label" in r for r in rows):
        t.add_column("alias")
    for name, _, _ in COLUMNS:
        t.add_column(name, justify="right")
    no_carbon = not any(r.get("co2e_g") for r in rows)  # no row priced in grams: no carbon settings, not 0 g
    for r in rows:
        cells = [str(r[by])] + ([str(r.get("label") or "-")] if "label" in r else [])
        for name, key, spec in COLUMNS:
            v = r["tokens"] if name == "tokens" else r["saved_pct"] if name == "saved %" else r[key]
            cells.append("-" if v is None or (key == "co2e_g" and no_carbon) else format(v, spec))
        t.add_row(*cells)
    if rows and no_carbon:
        t.caption = "gCO2e: - (no request was priced in grams: carbon.sites not configured; docs/accounting.md)"
    return t


def report_cmd(
    by: str = typer.Option("team", "--by", help="key | team | model | day | user | deployment"),
    since: Optional[str] = typer.Option(None, "--since", help="first day, YYYY-MM-DD or e.g. 7d (UTC)"),
    until: Optional[str] = typer.Option(None, "--until", help="last day, YYYY-MM-DD (UTC)"),
    fmt: str = typer.Option("table", "--format", help="table | csv | json"),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="PNG: joules and gCO2e per day stacked by team, saved vs reference"
    ),
    config: Optional[Path] = ConfigOpt,
    db: Optional[str] = DbOpt,
) -> None:
    """Energy (J, measured and estimated apart), gCO2e and joules saved against the reference deployment,
    per key, team, model group, user, deployment or day, from the ledger (docs/accounting.md)."""
    if by not in BY:
        fail(f"--by {by!r}: expected one of {', '.join(BY)}")
    if fmt not in ("table", "csv", "json"):
        fail(f"--format {fmt!r}: expected table, csv or json")
    if plot is not None and not plot.resolve().parent.is_dir():
        fail(f"--plot {plot}: its directory does not exist")
    if plot is not None and (plot.is_dir() or plot.suffix.lower() != ".png"):
        fail(f"--plot {plot}: expected a .png file name")
    url = db_url(db, config)
    lo, hi = _since(since), _since(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        fail(f"--since {lo} is after --until {hi}: an empty report")
    with _store(url, create=False) as store:  # reads an existing table, creates none
        rows = [_row(r, by) for r in store.ledger(by, since=lo, until=hi)]
        per_day = store.ledger("day", since=lo, until=hi, extra="team") if plot is not None else []
    if fmt == "json":
        typer.echo(json.dumps(rows, indent=1))
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [by], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
    else:
        span = f" {lo or '…'} .. {hi or '…'}" if lo or hi else ""
        console.print(_table(rows, by, f"energy ledger by {by}{span}"))
        console.print(
            "J measured / J estimated: the served requests' settled joules (metered, or from their tokens). J router "
            "est., J reference and J saved: the router's decision-time estimates (Ê of the chosen and of the "
            "reference candidate for each prompt), not the joules spent (docs/accounting.md).",
            highlight=False,
            style="dim",
        )
    if plot is not None:
        from litellm_energy_router.cli.report_plot import plot_days

        plot_days(per_day, plot)
        console.print(f"plot written to {plot}")
