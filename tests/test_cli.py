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
