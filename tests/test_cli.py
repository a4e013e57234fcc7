"""The `energy-router` console script, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("energy-router"))


def run(*args, cwd=None, env=None):
    e = {**os.environ, **(env or {})}
    return subprocess.run([EXE, *args], capture_output=True, text=True, cwd=cwd, env=e, timeout=300)


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("table", "demo"):
        assert cmd in r.stdout
    r = run("table", "--help")
    for cmd in ("import-routerbench", "stats", "export", "import"):
        assert cmd in r.stdout


def test_import_and_stats(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    files = sorted(str(p) for p in (ROOT / "litellm_energy_router/data/routerbench").glob("*.csv.gz"))
    r = run(
        "table",
        "import-routerbench",
        *files,
        "--db",
        url,
        "--energy-profile",
        str(ROOT / "config_examples/energy_profile_mlenergy_h100.yaml"),
    )
    assert r.returncode == 0, r.stderr
    assert "imported 2217 queries, 13302 runs (6 models)" in r.stdout
    assert "skipped 48 (query, model) pairs" in r.stdout
    assert "; 13302 new runs (the table holds 13302)" in r.stdout
    r = run("table", "import-routerbench", files[0], "--db", url)  # again: an upsert, nothing added
    assert r.returncode == 0, r.stderr
    assert "; 0 new runs (the table holds 13302)" in r.stdout, r.stdout
    r = run("table", "stats", "--db", url)
    assert r.returncode == 0
    line = next(ln for ln in r.stdout.splitlines() if "zero-one-ai/Yi-34B-Chat" in ln)
    assert "2217" in line and "0.771" in line


def test_config_error_is_one_line_and_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("energy_router:\n  knob: {lambda: -2}\n")
    r = run("table", "stats", "--config", str(cfg))
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "knob.lambda" in err and "-2" in err


def test_env_selects_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    r = run("table", "stats", env={"ENERGY_ROUTER_TABLE__URL": url})
    assert r.returncode == 2 and "env.db" in r.stderr  # read-only: the environment's table is refused, not created
    assert not (tmp_path / "env.db").exists()
    r = run("table", "import", str(tmp_path / "none.csv"), env={"ENERGY_ROUTER_TABLE__URL": url})
    assert r.returncode == 2 and "none.csv" in r.stderr


def test_bad_import_file_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = run("table", "import-routerbench", str(bad), "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert r.returncode == 2 and "missing row-key column" in r.stderr and str(bad) in r.stderr


def test_progress_reaches_a_log_where_the_output_is_not_a_terminal():
    """rich draws no bar where stdout is a file (cron, CI, ``| tee``): ``train`` and ``eval`` were silent for minutes.
    The one progress bar prints a line per unfinished task every few seconds there, and draws as before on a terminal."""
    import io
    import time

    from litellm_energy_router.training.progress import progress_bar
    from rich.console import Console

    log = io.StringIO()
    with progress_bar(Console(file=log, width=120), every_s=0.05) as bar:
        t = bar.add_task("SFT", total=288)
        bar.update(t, completed=120)
        time.sleep(0.3)
    lines = [line for line in log.getvalue().splitlines() if line.strip()]
    assert lines and all(line.startswith("SFT: 120/288, ") and line.endswith(" s") for line in lines), lines
    tty = io.StringIO()
    with progress_bar(Console(file=tty, width=120, force_terminal=True), every_s=0.05) as bar:
        bar.add_task("SFT", total=288)
        time.sleep(0.2)
    assert "SFT: " not in tty.getvalue()  # the bar itself, no lines
