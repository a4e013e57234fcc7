"""Extension points through pluggy: the built-ins register through entry points, a third-party plugin
(tests/plugin_pkg, pip-installed by the ``example_plugin`` fixture) adds a meter and a task that are
selected and used through the same code paths; listing plugins stays lean; conflicts are one line."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from litellm_energy_router.profiling.config import parse_tournament_config
from litellm_energy_router.profiling.runner import Tournament, build_jobs
from litellm_energy_router.profiling.tasks import GradeContext, get_task, task_names

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.demo.task_answers import TaskAnswers
from litellm_energy_router.energy import AttributedMeter, FallbackMeter, RequestUsage, make_meter, open_request_meter
from litellm_energy_router.plugins import (
    GROUP,
    PluginError,
    get_plugin_manager,
    hookimpl,
    load_entry_points,
    meter_factories,
    scorer_factories,
    task_factories,
)
from litellm_energy_router.settings import ConfigError, load_settings
from litellm_energy_router.table import open_store

TASK_DIR = Path(__file__).parent / "data" / "tasks"

BUILTIN_METERS = {"agent", "estimate", "nvml", "simulated"}
BUILTIN_TASKS = {"arc_challenge", "gsm8k", "hellaswag", "mbpp", "mmlu", "mt_bench", "winogrande"}


def test_builtins_are_entry_points_of_the_package():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
    assert eps["builtin_meters"].value == "litellm_energy_router.energy.builtin_meters"
    assert eps["builtin_tasks"].value == "litellm_energy_router.profiling.tasks.builtin_tasks"
    assert eps["builtin_scorers"].value == "litellm_energy_router.router.builtin_scorers"
    assert eps["builtin_meters"].dist.name == "litellm-energy-router"
    names = {n for n, _ in get_plugin_manager().list_name_plugin()}
    assert {"builtin_meters", "builtin_tasks"} <= names
    assert BUILTIN_METERS <= set(meter_factories()) and BUILTIN_TASKS <= set(task_factories())
    assert {"student", "lm", "task_prior", "knn", "logreg", "mf", "stacked"} <= set(scorer_factories())


LIST_IN_FRESH_PROCESS = """
import json, sys
from litellm_energy_router import plugins
from litellm_energy_router.settings import EnergySettings
EnergySettings(meter="constant-power")  # validated against the registry
heavy = ("torch", "transformers", "trl", "litellm", "datasets", "sklearn", "sentence_transformers", "vllm",
         "pynvml", "httpx")
print(json.dumps({
    "plugins": sorted(n for n, _ in plugins.get_plugin_manager().list_name_plugin()),
    "meters": sorted(plugins.meter_factories()), "tasks": sorted(plugins.task_factories()),
    "scorers": sorted(plugins.scorer_factories()),
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
}))
"""


def test_fresh_process_finds_the_installed_plugin_and_stays_lean(example_plugin_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example_plugin_dir), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", LIST_IN_FRESH_PROCESS], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert {"builtin_meters", "builtin_tasks", "example"} <= set(got["plugins"])
    assert set(got["meters"]) == BUILTIN_METERS | {"constant-power", "fake-rocm"}
    assert set(got["tasks"]) == BUILTIN_TASKS | {"echo"}
    assert set(got["scorers"]) == {
        "student",
        "lm",
        "task_prior",
        "knn",
        "logreg",
        "mf",
        "stacked",
        "slow-student",
        "keyword-prior",
    }
    assert got["heavy"] == []  # listing every plugin imports no implementation (lazy factories)


def test_plugin_meter_selected_by_settings_measures_like_the_builtins(example_plugin, tmp_path):
    cfg = tmp_path / "router.yaml"
    cfg.write_text("energy_router:\n  energy: {meter: constant-power, options: {power_w: 50.0}, sample_hz: 50}\n")
    s = load_settings(cfg, environ={})
    assert s.energy.meter == "constant-power"
    meter = open_request_meter(s.energy)  # what the callback builds
    try:
        assert isinstance(meter, FallbackMeter) and isinstance(meter.primary, AttributedMeter)
        assert type(meter.primary.meter).__name__ == "ConstantPowerMeter" and meter.primary.meter.power_w == 50.0
        t0 = time.time()
        meter.request_started("r1", t0)
        time.sleep(0.3)
        t1 = time.time()
        time.sleep(0.1)  # let the sampler close an interval past the request's end
        e = meter.energy_for_request(
            RequestUsage("r1", "small", t0, t1, prompt_tokens=10, completion_tokens=20), final=True
        )
    finally:
        meter.close()
    assert e.method == "simulated" and e.gpu == "1x constant 50 W"
    assert e.energy_j == pytest.approx(50.0 * (t1 - t0), rel=0.35)  # the only request in flight gets the joules

    bad = tmp_path / "bad.yaml"
    bad.write_text("energy_router:\n  energy: {meter: rocm}\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(bad, environ={})
    msg = str(ei.value)
    assert "config key 'energy.meter' = 'rocm': energy meter 'rocm' is not registered (known: " in msg
    assert "constant-power" in msg and "nvml" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="power_w = -1.0 must be >= 0"):
        make_meter("constant-power", power_w=-1.0)


def test_plugin_task_and_meter_run_a_tiny_tournament(example_plugin, tmp_path):
    assert "echo" in task_names()
    echo = get_task("echo")
    items = echo.load()  # the plugin's bundled records
    assert len(items) == 6 and items[0].query_id.startswith("echo:e1:")
    assert asyncio.run(echo.grade(items[0], "A zebra ran by.", GradeContext())).score == 1.0
    assert asyncio.run(echo.grade(items[0], "No idea.", GradeContext())).score == 0.0

    acc = {"small": {"open": 0.3}, "large": {"open": 0.9}}
    backend = LocalBackend(TaskAnswers(acc, TASK_DIR))
    backend.start()
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    try:
        cfg = parse_tournament_config(
            {
                "candidates": [backend.deployment(c, energy_profile_key="meta/llama-2-70b-chat") for c in acc],
                "tasks": ["echo"],
                "concurrency": 2,
                "generation": {"num_retries": 0},
                "energy": {"meter": "constant-power", "options": {"power_w": 80.0}, "gpu": "plugin GPU"},
            }
        )
        t = Tournament(cfg, store)
        try:
            summary = asyncio.run(t.run(build_jobs(cfg)))
        finally:
            t.close()
        rows = list(store.iter_runs())
    finally:
        backend.stop()
        store.close()
    assert summary.complete and len(rows) == 12
    for r in rows:
        ok = backend.answers.correct(r["candidate"], r["text"], "open")  # the server's intended outcome
        assert r["task"] == "echo" and r["status"] == "success" and r["score"] == (1.0 if ok else 0.0), r
        assert r["energy_method"] == "simulated" and r["gpu"] == "plugin GPU" and r["energy_j"] > 0
        assert r["avg_power_w"] <= 80.0 + 1e-6


def test_plugin_scorer_is_trained_selected_by_retrain_and_served(example_plugin, tmp_path, sqlite_url):
    """`keyword-prior` is written only in the plugin: retrain (select: true) cross-validates it beside a
    built-in, promotes it, and the strategy, `route` and the runtime serve its checkpoint."""
    from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
    from litellm_energy_router.training.selection import selectable
    from router_fixtures import CANDS, planted_rows

    from litellm_energy_router.cli.router_cmds import route_cmd
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
    from litellm_energy_router.router.checkpoint import read_manifest, resolve
    from litellm_energy_router.router.runtime import RouterRuntime
    from litellm_energy_router.settings import CandidateSettings, Settings

    assert "keyword-prior" in selectable()
    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(60)
    store.write(queries, runs, candidates=cands)
    store.close()
    cfg = RetrainConfig(
        table_url=sqlite_url,
        pointer=tmp_path / "current.json",
        quick=True,
        min_new_rows=10,
        holdout_fraction=0.2,
        lam=0.3,
        epsilon=0.0,
        select=True,
        select_folds=3,
        select_scorers=["task_prior", "keyword-prior"],
    )
    res = run_retrain(cfg, log=lambda s: None)
    assert res.status == "promoted", res.message
    sel = json.loads(res.report_json.read_text())["selection"]
    assert sel["chosen"] == "keyword-prior" and set(sel["scorers"]) == {"task_prior", "keyword-prior"}
    assert sel["scorers"]["keyword-prior"]["aiq"] > sel["scorers"]["task_prior"]["aiq"]
    ck = resolve(cfg.pointer)
    assert read_manifest(ck).scorer == "keyword-prior"

    settings = Settings(candidates=[CandidateSettings(name=c) for c in CANDS])
    settings.router.checkpoint = cfg.pointer
    core = EnergyRouterCore(settings, runtime=RouterRuntime(cfg.pointer, background=False))
    assert core.runtime.model.name == "keyword-prior"
    deps = [
        {"model_name": "pool", "litellm_params": {"model": f"openai/{c}"}, "model_info": {"id": f"dep-{c}"}}
        for c in CANDS
    ]
    for text, want in (("Give a proof about rivers number 999", "large"), ("Tell me about rivers number 999", "small")):
        dep, d = core.choose_sync(
            deps, [{"role": "user", "content": text}], request_kwargs={"metadata": {"energy_router": {"lambda": 0.3}}}
        )
        assert d.fallback is None and d.candidate == want and d.router_version == read_manifest(ck).version

    inp, out = tmp_path / "in.csv", tmp_path / "d.jsonl"
    inp.write_text(",sample_id,prompt,eval_name\n1,a,\"['Give a proof about glass number 5']\",synthetic\n")
    route_cmd(
        checkpoint=cfg.pointer,
        input=inp,
        output=out,
        lambdas="0.3",
        sweep=None,
        target_accuracy=None,
        scorer="auto",
        config=None,
    )
    assert json.loads(out.read_text())["model"] == "large"


def test_plugin_meter_declares_measured_joules_and_gets_the_device_options(example_plugin, tmp_path):
    """A plugin meter that says its joules are measured: its rows are valid and count as measured in the
    energy fit; `energy.gpus` reaches it (not only nvml); a meter that declares nothing is not measured."""
    from litellm_energy_router.training.pairs import PairReader

    from litellm_energy_router.energy.meter import is_measured, measured_methods
    from litellm_energy_router.table.rows import Run

    assert {"nvml_counter", "power_sampling", "agent", "rocm_smi"} <= measured_methods()
    assert not is_measured("simulated") and not is_measured("estimate") and not is_measured(None)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("energy_router:\n  energy: {meter: fake-rocm, gpus: [1, 3], options: {power_w: 40.0}}\n")
    meter = open_request_meter(load_settings(cfg, environ={}).energy)
    try:
        assert type(meter.primary.meter).__name__ == "FakeRocmMeter" and meter.primary.meter.devices == [1, 3]
    finally:
        meter.close()
    Run(query_id="q", candidate="c", source="production", energy_j=5.0, energy_method="rocm_smi")  # a valid row
    reader = PairReader(None)
    for i, method in enumerate(("rocm_smi", "simulated")):
        reader.add(
            {
                "id": i + 1,
                "candidate": "c",
                "source": "tournament",
                "task": "t",
                "query_id": f"q{i}",
                "text": "x",
                "energy_j": 5.0,
                "energy_method": method,
                "score": 1.0,
            }
        )
    assert list(reader.run_cols["measured"]) == [1.0, 0.0]


class _Clash:
    @hookimpl
    def energy_router_meters(self):
        return {"nvml": lambda **kw: None}


class _NotADict:
    @hookimpl
    def energy_router_tasks(self):
        return ["echo"]


def test_conflicts_and_bad_plugins_are_one_line():
    pm = get_plugin_manager()
    pm.register(_Clash(), name="clash")
    try:
        with pytest.raises(PluginError) as ei:
            meter_factories()
        msg = str(ei.value)
        assert msg.startswith(
            "energy meter 'nvml' is provided by two plugins: 'builtin_meters' (litellm-energy-router "
        )
        assert msg.endswith(" and 'clash'") and "\n" not in msg
    finally:
        pm.unregister(name="clash")
    pm.register(_NotADict(), name="listy")
    try:
        with pytest.raises(
            PluginError, match=r"^plugin 'listy': energy_router_tasks\(\) returned list, expected a dict"
        ):
            task_factories()
    finally:
        pm.unregister(name="listy")
    assert "nvml" in meter_factories() and "mmlu" in task_factories()


def test_entry_point_that_does_not_import_or_misnames_a_hook_is_named(monkeypatch):
    import types

    import pluggy

    from litellm_energy_router import plugins

    def load(ep):
        monkeypatch.setattr(plugins.importlib.metadata, "entry_points", lambda group: [ep])
        fresh = pluggy.PluginManager(GROUP)
        fresh.add_hookspecs(plugins.Hookspecs)
        with pytest.raises(PluginError) as ei:
            load_entry_points(fresh)
        assert "\n" not in str(ei.value)
        return str(ei.value)

    msg = load(importlib.metadata.EntryPoint("broken", "no_such_module_for_energy_router", GROUP))
    assert msg == (
        "plugin 'broken' (unknown distribution): cannot load 'no_such_module_for_energy_router': "
        "ModuleNotFoundError: No module named 'no_such_module_for_energy_router'"
    )
    typo = types.ModuleType("energy_router_typo_plugin")
    typo.energy_router_meter = hookimpl(lambda: {})  # singular: no such hook
    monkeypatch.setitem(sys.modules, typo.__name__, typo)
    msg = load(importlib.metadata.EntryPoint("typo", typo.__name__, GROUP))
    assert msg.startswith("plugin 'typo' (unknown distribution): unknown hook 'energy_router_meter'")
