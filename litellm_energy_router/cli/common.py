"""What every ``energy-router`` command shares: the consoles, the one-line error exit, the settings and
table options. The command modules import it; the package (``cli/__init__.py``) registers them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from litellm_energy_router.settings import ConfigError, Settings, load_settings

# Wide when piped (logs, CI): rich would otherwise cut candidate names at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=400)


def _check_settings_file(value: Optional[Path]) -> Optional[Path]:
    """``--config``: the settings file is read (and refused, one line) before the command starts."""
    if value is not None:
        load_settings(value)
    return value


def _check_db(value: Optional[str]) -> Optional[str]:
    """``--db``: a URL no table can live at is refused, one line, before the command starts."""
    if value is not None:
        from litellm_energy_router.table import check_table_url

        check_table_url(value)
    return value


ConfigOpt = typer.Option(
    None,
    "--config",
    "-c",
    exists=True,
    dir_okay=False,
    help="settings YAML with a top-level energy_router: key (default: $ENERGY_ROUTER_CONFIG)",
    callback=_check_settings_file,
)
DbOpt = typer.Option(
    None, "--db", help="table URL, e.g. sqlite:///x.db (default: settings table.url)", callback=_check_db
)


def _error_line(msg: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)


def fail(msg: str, code: int = 2) -> None:
    """Print one error line and exit non-zero."""
    _error_line(msg)
    raise typer.Exit(code)


def settings_or_fail(config: Optional[Path]) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as e:
        fail(str(e))
        raise  # unreachable


def db_url(db: Optional[str], config: Optional[Path]) -> str:
    return db or settings_or_fail(config).table.url
