"""Shared fixtures. Tests run offline: no model or data downloads."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PG_ADMIN_URL = os.environ.get("ENERGY_ROUTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture
def pg_url():
    """A fresh, empty PostgreSQL database for one test, dropped afterwards.

    Skips when the server is unreachable, except under CI=true where that is a failure.
    """
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    try:
        admin = _pg_admin()
        with admin.connect() as c:
            c.execute(text("select 1"))
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} unreachable under CI=true: {e}")
        pytest.skip(f"PostgreSQL unreachable: {e}")
    name = f"er_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as c:
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture
def fresh_litellm_callbacks():
    """LiteLLM's callback lists emptied before and after the test: LiteLLM keeps one instance per
    CustomLogger class in its processed callback lists, so a second EnergyLogger would be ignored while a
    first one (another test's) is registered."""
    import litellm

    litellm.logging_callback_manager._reset_all_callbacks()
    yield
    litellm.logging_callback_manager._reset_all_callbacks()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'table.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request, tmp_path):
    """Each test using this runs on both backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'table.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def planted_ckpt(tmp_path_factory):
    """A router checkpoint trained (seconds, --quick config) on synthetic rows with a planted rule:
    queries containing "proof" are solved only by `large` (see router_fixtures.py). Shared by the
    training, strategy, request-shape and callback tests; read-only."""
    from router_fixtures import train_planted

    from litellm_energy_router.table import open_store

    d = tmp_path_factory.mktemp("planted")
    store = open_store(f"sqlite:///{d / 't.db'}")
    ck = train_planted(store, d / "router")
    store.close()
    return ck


EXAMPLE_PLUGIN_SRC = Path(__file__).parent / "plugin_pkg"


@pytest.fixture(scope="session")
def example_plugin_dir(tmp_path_factory):
    """tests/plugin_pkg (a third-party plugin) pip-installed, offline and without dependencies, into a
    fresh directory — never into the venv. Built from a copy so the source tree stays clean."""
    root = tmp_path_factory.mktemp("example_plugin")
    src, target = root / "src", root / "site"
    shutil.copytree(EXAMPLE_PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--disable-pip-version-check",
        "--target",
        str(target),
        str(src),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def example_plugin(example_plugin_dir):
    """The example plugin installed and seen by this process for one test module: its directory on
    sys.path and its entry point loaded into the plugin manager; all undone afterwards."""
    from litellm_energy_router.plugins import get_plugin_manager, load_entry_points

    pm = get_plugin_manager()
    sys.path.insert(0, str(example_plugin_dir))
    importlib.invalidate_caches()
    added = load_entry_points(pm)
    assert added == ["example"], added
    yield example_plugin_dir
    for name in added:
        pm.unregister(name=name)
    sys.path.remove(str(example_plugin_dir))
    importlib.invalidate_caches()
    for mod in [m for m in sys.modules if m.split(".")[0] == "energy_router_example_plugin"]:
        del sys.modules[mod]


@pytest.fixture(autouse=True)
def _fresh_adaptation():
    """The serving process's online adaptation (router/adapt.ADAPT) is process-wide, as in a proxy: each test
    starts with nothing learned, so one test's settled rows never price another's requests."""
    from litellm_energy_router.router.adapt import ADAPT

    ADAPT.reset()
    yield


@pytest.fixture(autouse=True)
def _writer_caught_up():
    """Whether this process's table writer is behind (budgets.WRITER_LAG) is process-wide, as in a proxy: a test
    that leaves a writer stalled does not keep another test's budget charges."""
    from litellm_energy_router.budgets import WRITER_LAG

    WRITER_LAG.caught_up()
    yield


@pytest.fixture(autouse=True)
def _litellm_logging_on_each_test_s_loop():
    """LiteLLM's logging worker is process-wide; at the oldest supported LiteLLM it stays bound to the first
    test's event loop (router_fixtures.release_litellm_logging_loop)."""
    from router_fixtures import release_litellm_logging_loop

    release_litellm_logging_loop()
    yield
