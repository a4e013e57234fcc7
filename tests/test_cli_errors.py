"""Every ``energy-router`` command, walked from the command-line parser itself (a new command is walked
too): a bad ``--db``, a missing input file and an unknown settings or tournament key each end as one
line on stderr naming the bad value, exit status 2, no traceback. Read-only commands refuse a SQLite
file that does not exist instead of creating an empty table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from litellm_energy_router.cli import app, main

EXE = str(Path(sys.executable).with_name("energy-router"))
TASKS = Path(__file__).parent / "data" / "tasks"
# Paths a command writes (or creates): every other path parameter is an input that must exist.
OUTPUTS = {"out", "output", "workdir", "pointer", "plot"}


def _walk(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in sorted(cmd.commands.items()):
            yield from _walk(sub, (*path, name))
    else:
        yield path, cmd


COMMANDS = dict(_walk(typer.main.get_command(app)))


def _is_path(p) -> bool:
    return "Path" in str(p.type_descriptor.annotation)


def _flag(p) -> str | None:
    return next((o for o in p.opts if o.startswith("--")), None)


def _cases(pick):
    """(command path, parameter) for every parameter of every command that ``pick`` selects."""
    out = [
        pytest.param(path, p, id=f"{' '.join(path)} {_flag(p) or p.name}")
        for path, cmd in COMMANDS.items()
        for p in cmd.params
        if pick(p)
    ]
    assert out, "the walk found no parameter to check"
    return out


def _argv(path: tuple, bad, value: str, tmp: Path) -> list[str]:
    """The command line: the parameter under test with ``value`` first, every other required parameter
    with a plausible value (an existing file for an input path)."""
    dummy = tmp / "dummy.txt"
    dummy.write_text("x\n")
    opts, args = [], []
    for p in COMMANDS[path].params:
        if p is bad:
            v = value
        elif p.required:
            v = str(tmp / "out") if p.name in OUTPUTS else str(dummy) if _is_path(p) else "1"
        else:
            continue
        if p.param_type_name == "argument":
            args.append(v)
        elif p is bad:
            opts[:0] = [_flag(p), v]
        else:
            opts += [_flag(p), v]
    return [*path, *opts, *args]


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    return ei.value.code, capsys.readouterr().err


def _one_line(code: int, err: str, named: str, argv: list[str]) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, f"{argv}: exit {code}, stderr:\n{err}"
    assert "Traceback" not in err and named in lines[0], f"{argv}: {lines[0]!r} does not name {named!r}"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that got as far as creating files creates them here
    monkeypatch.delenv("ENERGY_ROUTER_CONFIG", raising=False)


@pytest.mark.parametrize("path, param", _cases(lambda p: p.name == "db"))
@pytest.mark.parametrize("url", ["sqlite://energy_router_demo.db", "mysql://u@127.0.0.1/x", "not a url"])
def test_bad_db_url_is_one_line(capsys, tmp_path, path, param, url):
    argv = _argv(path, param, url, tmp_path)
    _one_line(*_run(capsys, argv), url, argv)
    assert not (tmp_path / "energy_router_demo.db").exists()


@pytest.mark.parametrize("path, param", _cases(lambda p: _is_path(p) and p.name not in OUTPUTS))
def test_missing_input_file_is_one_line(capsys, tmp_path, path, param):
    missing = str(tmp_path / "no-such-dir" / "missing.yaml")
    argv = _argv(path, param, missing, tmp_path)
    _one_line(*_run(capsys, argv), missing, argv)


def _bad_keys_yaml(tmp: Path) -> Path:
    """A file with an unknown key for every reader: the settings (``energy_router.tabel``) and an
    otherwise valid tournament (``tournament.concurrencyy``)."""
    f = tmp / "typo.yaml"
    f.write_text(
        "energy_router:\n  tabel: {url: 'sqlite:///x.db'}\n"
        "tournament:\n  candidates: [{model_name: small, litellm_params: {model: openai/small, api_base: 'http://127.0.0.1:9/v1'}}]\n"
        f"  tasks: [{{name: mmlu, source: '{TASKS / 'mmlu.jsonl'}'}}]\n  concurrencyy: 2\n"
    )
    return f


@pytest.mark.parametrize("path, param", _cases(lambda p: p.name in ("config", "settings")))
def test_unknown_key_is_one_line(capsys, tmp_path, path, param):
    f = _bad_keys_yaml(tmp_path)
    argv = _argv(path, param, str(f), tmp_path)
    code, err = _run(capsys, argv)
    _one_line(code, err, str(f), argv)
    assert "tabel" in err or "concurrencyy" in err, err


@pytest.mark.parametrize("path, param", _cases(lambda p: p.name in ("config", "settings")))
def test_settings_without_top_key_is_refused(capsys, tmp_path, path, param):
    if path[-1] in ("tournament", "shadow-tournament") and param.name == "config":
        pytest.skip("a tournament file, not settings")
    f = tmp_path / "flat.yaml"
    f.write_text("table: {url: 'sqlite:///flat.db'}\n")  # the settings, but not under energy_router:
    argv = _argv(path, param, str(f), tmp_path)
    code, err = _run(capsys, argv)
    _one_line(code, err, str(f), argv)
    assert "energy_router" in err


READ_ONLY = {
    "table stats": [],
    "report": [],
    "table export": ["out.csv"],
    "eval": ["--out", "rep", "--no-router", "--baselines", "task_prior"],
    "train": ["--out", "ck", "--scorer", "task_prior"],
    "feedback set": ["call-1", "1"],
    "feedback serve": ["--token", "t", "--port", "0"],
}


@pytest.mark.parametrize("cmd", sorted(READ_ONLY))
def test_read_only_commands_refuse_a_missing_sqlite_file(capsys, tmp_path, cmd):
    db = tmp_path / "typo.db"
    argv = [*cmd.split(), "--db", f"sqlite:///{db}", *READ_ONLY[cmd]]
    _one_line(*_run(capsys, argv), str(db.name), argv)
    assert not db.exists(), "a read-only command created the database"


def test_the_installed_command_prints_one_line(tmp_path):
    """The issue's example through the real ``energy-router`` executable."""
    env = {**os.environ, "ENERGY_ROUTER_CONFIG": ""}
    r = subprocess.run(
        [EXE, "table", "stats", "--db", "sqlite://energy_router_demo.db"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "sqlite://energy_router_demo.db" in r.stderr and "sqlite:///energy_router_demo.db" in r.stderr
    r = subprocess.run([EXE, "--version"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.startswith("energy-router ") and "litellm" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["bytes.yaml", "bytes.csv", "bytes.jsonl", "bytes.csv.gz", "bytes.parquet"])
@pytest.mark.parametrize("path, param", _cases(lambda p: _is_path(p) and p.name not in OUTPUTS))
def test_an_unreadable_input_file_is_one_line(capsys, tmp_path, path, param, name):
    """An input file whose bytes are not what its name says (not UTF-8, not gzip, not Parquet): one line naming it,
    exit 2, wherever a command reads it."""
    f = tmp_path / name
    f.write_bytes(b"\xff\xfe\x00\x81 not text, not gzip, not parquet \x9c\x00" * 8)
    argv = _argv(path, param, str(f), tmp_path)
    code, err = _run(capsys, argv)
    _one_line(code, err, "", argv)
    # names the file, unless the command refused another of its required inputs first (the walk's dummy values)
    assert str(f) in err or "dummy.txt" in err or " is not set" in err, f"{argv}: {err!r}"


@pytest.mark.parametrize("path, param", _cases(lambda p: p.name == "db"))
def test_a_db_file_that_is_not_a_database_is_one_line(capsys, tmp_path, path, param):
    """``--db`` naming a file that is not a SQLite database: one line naming it, exit 2, the file untouched."""
    f = tmp_path / "notes.txt"
    f.write_text("not a database\n" * 100)
    argv = _argv(path, param, f"sqlite:///{f}", tmp_path)
    code, err = _run(capsys, argv)
    _one_line(code, err, "", argv)
    assert f.read_text() == "not a database\n" * 100


def test_report_plot_must_be_a_png_file(capsys, tmp_path):
    for bad in (tmp_path / "x.txt", tmp_path):
        argv = ["report", "--db", f"sqlite:///{tmp_path / 'none.db'}", "--plot", str(bad)]
        _one_line(*_run(capsys, argv), "--plot", argv)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["route", "--checkpoint", "ck", "--input", "in.txt", "--output", "o.jsonl", "--lambda=-1"], "--lambda -1.0"),
        (
            ["route", "--checkpoint", "ck", "--input", "in.txt", "--output", "o.jsonl", "--lambda", "nan"],
            "--lambda nan",
        ),
        (["route", "--checkpoint", "ck", "--input", "in.txt", "--output", "o.jsonl", "--lambda", "0.1,inf"], "inf"),
        (["train", "--out", "ck", "--epochs", "-1"], "--epochs -1.0"),
        (["train", "--out", "ck", "--epochs", "nan"], "--epochs nan"),
        (["train", "--out", "ck", "--grpo-steps", "-5"], "--grpo-steps"),
    ],
)
def test_out_of_range_numbers_on_the_command_line_are_one_line(capsys, tmp_path, argv, named):
    """A λ that is negative or not finite, epochs <= 0, negative GRPO steps: refused before any work, nothing written."""
    (tmp_path / "in.txt").write_text("What is 2+2?\n")
    (tmp_path / "ck").mkdir()
    _one_line(
        *_run(capsys, [*argv, "--db", f"sqlite:///{tmp_path / 'none.db'}"] if argv[0] == "train" else argv), named, argv
    )
    assert not (tmp_path / "o.jsonl").exists() and not any((tmp_path / "ck").iterdir())


@pytest.mark.parametrize("argv", [["feedback", "serve", "--token", "t"], ["agent"], ["replay-backend"]])
def test_a_port_out_of_range_is_one_line(capsys, tmp_path, argv):
    full = [*argv, "--port", "99999"]
    _one_line(*_run(capsys, full), "--port", full)


def test_a_full_disk_is_one_line_not_a_traceback():
    """ENOSPC (and a quota, a read-only file system) names no file: it was a traceback and exit 1; it is the
    machine's state, so one line like any other user-facing error."""
    import errno

    from litellm_energy_router.errors import user_error_line

    assert user_error_line(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device (errno ENOSPC)"
    assert user_error_line(OSError(errno.EROFS, "Read-only file system")) == "Read-only file system (errno EROFS)"
    assert user_error_line(OSError(errno.EPIPE, "Broken pipe")) is None  # not the machine's state: a bug's traceback


def test_a_full_disk_met_by_safetensors_is_one_line():
    """safetensors wraps the OS error in its own type (``... (os error 28)``): a full disk while a checkpoint's weights
    are written was a traceback."""
    import errno

    pytest.importorskip("safetensors")
    from safetensors import SafetensorError

    from litellm_energy_router.errors import user_error_line

    full = SafetensorError(f"Error while serializing: I/O error: No space left on device (os error {errno.ENOSPC})")
    assert user_error_line(full) == "No space left on device (errno ENOSPC)"
    assert user_error_line(SafetensorError("Error while deserializing header: HeaderTooLarge")) is None


def test_a_pointer_not_written_for_a_full_disk_stays_as_it_was_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """``point_to`` on a full disk: the pointer still names the old checkpoint, and no ``.pointer-*`` file is left."""
    import errno
    import json
    import os

    from litellm_energy_router.router.checkpoint import point_to

    pointer = tmp_path / "current.json"
    point_to(pointer, tmp_path / "v1")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        point_to(pointer, tmp_path / "v2")
    assert json.loads(pointer.read_text())["checkpoint"] == str((tmp_path / "v1").resolve())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current.json"]


@pytest.mark.parametrize("scorer", ["lm", "task_prior"])
def test_train_refuses_an_out_that_is_not_a_checkpoint_and_touches_nothing(capsys, tmp_path, scorer):
    """``train --out`` replaces what is there whole: a directory of other files, the table's own SQLite file and the
    working directory (``.``, a traceback) were deleted or failed. Refused in one line before anything is read."""
    from litellm_energy_router.table import open_store

    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("important")
    db = tmp_path / "t.db"
    open_store(f"sqlite:///{db}").close()
    size = db.stat().st_size
    for out in ("precious", str(db), "."):
        argv = ["train", "--out", out, "--db", f"sqlite:///{db}", "--scorer", scorer, "--quick"]
        _one_line(*_run(capsys, argv), "is not a checkpoint", argv)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "important" and db.stat().st_size == size


def test_report_since_too_far_back_is_one_line(capsys, tmp_path):
    from litellm_energy_router.table import open_store

    db = f"sqlite:///{tmp_path / 't.db'}"
    open_store(db).close()
    argv = ["report", "--db", db, "--since", "3000000d"]
    _one_line(*_run(capsys, argv), "--since '3000000d': too far back", argv)


def test_route_refuses_to_write_its_decisions_over_its_input(capsys, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("What is 2+2?\n")
    argv = ["route", "--checkpoint", str(tmp_path), "--input", str(prompts), "--output", str(prompts)]
    _one_line(*_run(capsys, argv), "is the --input file", argv)
    assert prompts.read_text() == "What is 2+2?\n"


def test_an_infinite_decision_budget_is_refused():
    """``router.timeout_ms: .inf`` turned the fail-open timeout off."""
    from litellm_energy_router.settings import Settings

    with pytest.raises(ValueError, match="timeout_ms"):
        Settings.model_validate({"router": {"timeout_ms": float("inf")}})


def test_import_routerbench_with_an_unknown_model_creates_no_database(capsys, tmp_path):
    from litellm_energy_router.profiling.routerbench import bundled_files

    db = tmp_path / "new.db"
    argv = ["table", "import-routerbench", str(bundled_files()[-1]), "--db", f"sqlite:///{db}", "--models", "nosuch"]
    _one_line(*_run(capsys, argv), "no entry for candidate 'nosuch'", argv)
    assert not db.exists()


def test_a_file_that_is_not_routerbench_creates_no_table(capsys, tmp_path):
    """A wrong file was refused only after the table was opened: an empty database was left behind, which later
    commands read as an empty table (exit 0)."""
    bad = tmp_path / "q.txt"
    bad.write_text("just some prompts\none per line\n")
    db = tmp_path / "imp.db"
    argv = ["table", "import-routerbench", str(bad), "--db", f"sqlite:///{db}"]
    _one_line(*_run(capsys, argv), "missing row-key column", argv)
    assert not db.exists(), "the failed import created the database"


def test_table_stats_refuses_an_unknown_source(capsys, tmp_path):
    """`--source prod` printed "table is empty" with exit 0 on a table with rows."""
    from litellm_energy_router.table import open_store

    db = tmp_path / "t.db"
    open_store(f"sqlite:///{db}").close()
    argv = ["table", "stats", "--db", f"sqlite:///{db}", "--source", "prod"]
    _one_line(*_run(capsys, argv), "--source 'prod': expected one of tournament|production|shadow|import", argv)
