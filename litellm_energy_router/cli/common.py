"""What every ``energy-router`` command shares: the consoles, the one-line error exit, the settings and
table options. The command modules import it; the package (``cli/__init__.py``) registers them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..settings import ConfigError, Settings, load_settings

# Wide when piped (logs, CI): rich would otherwise cut candidate names at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=400)

ConfigOpt = typer.Option(None, "--config", "-c", help="settings YAML (default: $ENERGY_ROUTER_CONFIG)")
DbOpt = typer.Option(None, "--db", help="table URL, e.g. sqlite:///x.db (default: settings table.url)")


def fail(msg: str, code: int = 2) -> None:
    """Print one error line and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def settings_or_fail(config: Optional[Path]) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as e:
        fail(str(e))
        raise  # unreachable


def db_url(db: Optional[str], config: Optional[Path]) -> str:
    return db or settings_or_fail(config).table.url
