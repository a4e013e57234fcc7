"""``retrain``: lock, "nothing new", the promotion gate (a worse candidate is refused, a better one is
promoted) and hot reload of the promoted checkpoint by a running router runtime."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
from router_fixtures import planted_rows, retrain_yaml

from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.table import open_store

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false"}


def _add(url: str, prefix: str, n: int = 80) -> None:
    store = open_store(url)
    cands, queries, runs = planted_rows(n, prefix=prefix)
    store.write(queries, runs, candidates=cands)
    store.close()


def _shuffled(m):
    """A deliberately worse training set: each query gets another query's labels."""
    perm = np.random.default_rng(1).permutation(len(m))
    return dataclasses.replace(m, Y=m.Y[perm])


def _cfg(tmp_path: Path, url: str, **kw) -> RetrainConfig:
    return RetrainConfig(
        table_url=url,
        pointer=tmp_path / "current.json",
        quick=True,
        min_new_rows=100,
        holdout_fraction=0.3,
        lam=0.3,
        epsilon=0.0,
        **kw,
    )


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "litellm_energy_router.cli", *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_gate_refuses_a_worse_candidate_and_promotes_a_better_one_which_serving_reloads(tmp_path, sqlite_url):
    from litellm_energy_router.router.runtime import RouterRuntime

    _add(sqlite_url, "a")
    cfg = _cfg(tmp_path, sqlite_url)
    first = run_retrain(cfg, log=lambda s: None)  # no serving checkpoint yet: trains and promotes
    assert first.status == "promoted" and resolve(cfg.pointer) == first.checkpoint.resolve()
    assert json.loads(first.report_json.read_text())["comparison"]["promote"] is True
    runtime = RouterRuntime(cfg.pointer)
    runtime.maybe_reload(block=True)
    assert runtime.version == first.version

    _add(sqlite_url, "b")  # new rows, so retrain trains again
    worse = run_retrain(cfg, log=lambda s: None, transform_train=_shuffled)
    assert worse.status == "rejected", worse.message
    report = json.loads(worse.report_json.read_text())
    assert report["comparison"]["candidate"]["aiq"] < report["comparison"]["serving"]["aiq"]
    assert resolve(cfg.pointer) == first.checkpoint.resolve()  # pointer did not move
    assert not list((tmp_path / "versions").glob(".tmp-*"))  # the rejected candidate is gone
    # the next cron tick, no row since: the rows the rejected candidate learnt from are not trained on again
    again = run_retrain(cfg, log=lambda s: None, transform_train=_shuffled)
    assert again.status == "nothing_new" and f"rejected candidate {worse.version}" in again.message, again.message

    # a worse serving checkpoint (trained on shuffled labels), then an honest retrain beats it
    bad_cfg = _cfg(tmp_path / "b", sqlite_url)
    bad = run_retrain(bad_cfg, log=lambda s: None, transform_train=_shuffled)
    assert bad.status == "promoted"
    # a running strategy core (what EnergyRoutingStrategy and the proxy filter hold) serves from the pointer
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
    from litellm_energy_router.settings import Settings

    core = EnergyRouterCore(
        Settings.model_validate({"router": {"checkpoint": str(bad_cfg.pointer), "timeout_ms": 10_000}})
    )
    deps = [
        {
            "model_name": "pool",
            "litellm_params": {"model": f"openai/{c}"},
            "model_info": {"id": c, "energy_router_candidate": c},
        }
        for c in ("small", "medium", "large")
    ]
    ask = lambda text: core.choose_sync(deps, [{"role": "user", "content": text}])[1]  # noqa: E731
    core.runtime.maybe_reload(block=True)
    assert ask("Tell me about rivers number 1000").router_version == bad.version
    _add(sqlite_url, "c")
    better = run_retrain(bad_cfg, log=lambda s: None)
    assert better.status == "promoted", better.message
    cmp_ = better.details["comparison"]
    assert cmp_["candidate"]["aiq"] >= cmp_["serving"]["aiq"]
    assert read_manifest(bad_cfg.pointer).version == better.version
    # rows since the rejection ("c"): the first pointer's retrain trains (and judges) again
    assert run_retrain(cfg, log=lambda s: None, transform_train=_shuffled).status == "rejected"
    deadline = time.time() + 60  # the runtime notices the moved pointer and swaps in the background
    while ask("Tell me about rivers number 1001").router_version != better.version and time.time() < deadline:
        time.sleep(0.2)
    hard, easy = ask("Give a proof about rivers number 1001"), ask("Tell me about rivers number 1002")
    assert hard.router_version == easy.router_version == better.version
    assert hard.scores["large"] > hard.scores["small"] and easy.scores["small"] > hard.scores["small"]
    runtime.close()
    core.runtime.close()


def test_nothing_new_and_lock_exit_zero(tmp_path, sqlite_url):
    _add(sqlite_url, "a")
    conf = retrain_yaml(tmp_path, sqlite_url, 100)
    p = _cli("retrain", "--config", str(conf))
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "promoted" in out, out
    p = _cli("retrain", "--config", str(conf))
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "nothing new: 0 labelled rows" in out, out
    # a held lock: the run exits 0 without training
    vdir = tmp_path / "versions"
    with open(vdir / ".retrain.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        p = _cli("retrain", "--config", str(conf), "--since", "0")
        out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "another retrain is running" in out, out
    assert len(list(vdir.glob("v-*"))) == 1


def test_two_concurrent_runs_train_once(tmp_path, sqlite_url):
    _add(sqlite_url, "a")
    conf = retrain_yaml(tmp_path, sqlite_url, 100)
    procs = [_cli("retrain", "--config", str(conf)) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum("promoted" in o for o in outs) == 1, outs
    assert sum(("another retrain is running" in o) or ("nothing new" in o) for o in outs) == 1, outs
    assert len(list((tmp_path / "versions").glob("v-*"))) == 1


def test_bad_config_is_one_line_error(tmp_path, sqlite_url):
    conf = tmp_path / "bad.yaml"
    conf.write_text(
        f'energy_router:\n  table: {{url: "{sqlite_url}"}}\n  router: {{checkpoint: "{tmp_path / "p.json"}"}}\nretrain:\n  rule: fastest\n'
    )
    p = _cli("retrain", "--config", str(conf))
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and "retrain" in out and "rule" in out and "fastest" in out, out
    d = tmp_path / "ckdir"
    d.mkdir()
    conf.write_text(f'energy_router:\n  table: {{url: "{sqlite_url}"}}\n  router: {{checkpoint: "{d}"}}\n')
    p = _cli("retrain", "--config", str(conf))
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and "is a checkpoint directory" in out, out


def test_shipped_example_retrain_section_loads(tmp_path):
    from litellm_energy_router.training.retrain import load_retrain_config

    from litellm_energy_router.settings import ConfigError

    example = Path(__file__).resolve().parents[1] / "config_examples/energy-router.yaml"
    cfg = load_retrain_config(example, pointer=tmp_path / "current.json")
    assert (cfg.rule, cfg.min_new_rows, cfg.keep, cfg.table_url) == ("both", 200, 5, "sqlite:///energy_router.db")
    with pytest.raises(ConfigError, match="router.checkpoint"):
        load_retrain_config(example)  # the example leaves the pointer unset


def test_a_pointer_moved_during_training_is_not_overwritten(tmp_path):
    """The serving checkpoint changed while the candidate trained (an operator's rollback, another run): the
    candidate was judged against the old one, so it is not promoted over the new one, which stays on disk."""
    from litellm_energy_router.training.retrain_gate import promote_or_delete

    from litellm_energy_router.router.checkpoint import point_to, resolve

    vdir = tmp_path / "versions"
    a, b = vdir / "v-20240101T000000Z-000", vdir / "v-20240102T000000Z-000"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
    ptr = tmp_path / "current.json"
    point_to(ptr, a)
    compared_with = resolve(ptr)
    point_to(ptr, b)  # meanwhile
    tmp = vdir / ".tmp-x"
    tmp.mkdir()
    cfg = RetrainConfig(table_url="sqlite://", pointer=ptr, keep=1, select_scorers=["knn"])
    status, ck, msg = promote_or_delete(
        tmp, "20240103T000000Z-000", {"promote": True, "why": "x"}, vdir, cfg, compared_with
    )
    assert (status, ck) == ("rejected", None) and "moved" in msg
    assert resolve(ptr) == b and b.exists() and not tmp.exists()
    tmp.mkdir()  # judged against what serves: promoted
    status, ck, _ = promote_or_delete(tmp, "20240103T000000Z-000", {"promote": True, "why": "x"}, vdir, cfg, b)
    assert status == "promoted" and resolve(ptr) == ck


def test_a_label_written_during_the_training_scan_counts_as_new_for_the_next_run(sqlite_url, monkeypatch):
    """Feedback labels a row the scan has passed while production keeps writing rows the scan reads later: the
    ``updated`` watermark stays at the scan's start (less the skew margin), so the next run counts that label."""
    from litellm_energy_router.training import data as data_mod

    from litellm_energy_router.table import open_store

    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(6, prefix="a")
    store.write(queries, runs, candidates=cands)
    first = next(store.iter_runs())
    keep = ("query_id", "candidate", "source", "energy_j", "prompt_tokens", "completion_tokens")
    unlabelled = {k: first[k] for k in keep}
    store.write(runs=[{**unlabelled, "score": None}])
    monkeypatch.setattr(data_mod, "WATERMARK_SKEW_S", 0.0)  # one clock here

    class Live:  # the table while feedback and production write during the scan
        def iter_runs(self, **kw):
            for i, r in enumerate(store.iter_runs(**{**kw, "batch": 2})):
                if i == 2:  # past the unlabelled row
                    store.write(runs=[{**unlabelled, "score": 1.0}])
                    time.sleep(0.01)
                    _, q2, r2 = planted_rows(1, prefix="late")
                    store.write(q2, r2)
                yield r

    time.sleep(0.01)
    scan = data_mod._scan_runs(Live(), None, None, None)
    assert scan.best.get((unlabelled["query_id"], unlabelled["candidate"])) is None  # not in this run's matrix
    assert store.count_labelled(since_id=scan.max_id, since_updated=scan.max_upd) >= 1  # so the next run sees it
    store.close()


def test_rows_read_within_the_skew_margin_are_not_new_again_unless_relabelled(sqlite_url):
    """The watermark sits a clock-skew margin before the scan's start; the runs the scan read inside that margin are
    remembered with their ``updated``, so a retrain right after the first finds nothing new, while one of them
    labelled again since counts."""
    from litellm_energy_router.training import data as data_mod

    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(6, prefix="a")
    store.write(queries, runs, candidates=cands)  # just now: inside the margin of a scan starting now
    scan = data_mod._scan_runs(store, None, None, None)
    total = store.count_runs()
    assert 0 < len(scan.seen) == total and scan.max_upd < min(scan.seen.values())
    assert store.count_labelled(since_id=scan.max_id, since_updated=scan.max_upd) == total  # without: all again
    assert store.count_labelled(since_id=scan.max_id, since_updated=scan.max_upd, seen=scan.seen) == 0
    first = next(store.iter_runs())
    keep = ("query_id", "candidate", "source", "energy_j", "prompt_tokens", "completion_tokens")
    time.sleep(0.01)
    store.write(runs=[{**{k: first[k] for k in keep}, "score": 1.0 - float(first["score"])}])  # relabelled
    assert store.count_labelled(since_id=scan.max_id, since_updated=scan.max_upd, seen=scan.seen) == 1
    store.close()


def test_the_joules_rule_does_not_pass_a_worse_checkpoint_when_neither_reaches_the_target():
    """Neither checkpoint reaches the target accuracy on the held-out rows ("never" both): the joules rule compares
    the best accuracy each reaches instead of passing any candidate (a shuffled-label one was promoted)."""
    from litellm_energy_router.training.retrain_gate import compare

    rng = np.random.default_rng(0)
    n = 200
    Y = (rng.random((n, 2)) < [0.5, 0.8]).astype(float)
    hold = _hold(Y, [10.0, 50.0])
    good = Fixed(np.where(Y > 0, 0.9, 0.1))  # knows each answer: reaches what the data allows
    bad = Fixed(rng.random((n, 2)))  # noise
    cfg = RetrainConfig.model_validate({"rule": "joules", "target_accuracy": 1.0})
    out = compare(bad, good, hold, cfg)
    assert out["candidate"]["joules_at_target"] is None and out["serving"]["joules_at_target"] is None
    assert out["promote"] is False, out["why"]
    assert compare(good, bad, hold, cfg)["promote"] is True


def test_a_split_with_nothing_held_out_stops_before_training(tmp_path, sqlite_url):
    """Too few queries for the held-out share: one line before any training (it trained, then the gate crashed
    on an empty held-out set with a traceback), and no checkpoint or pointer is written."""
    from litellm_energy_router.training.data import MatrixError

    _add(sqlite_url, "a", n=4)
    with pytest.raises(MatrixError, match=r"4 queries split into 4 to train on and 0 held out"):
        run_retrain(_cfg(tmp_path, sqlite_url).model_copy(update={"holdout_fraction": 0.01}))
    assert not (tmp_path / "current.json").exists()


def test_reports_hold_no_nan_or_infinity(tmp_path):
    """An off-policy estimate that does not exist (one logged row: an infinite interval; SNIPS with no overlap: NaN)
    is null in the retrain report and in eval's off_policy.json: strict JSON parsers (jq, JS) read them."""
    from litellm_energy_router.training.ope import Estimate
    from litellm_energy_router.training.retrain import _write_reports

    est = Estimate(value=math.nan, lo=-math.inf, hi=math.inf, n=1, ess=1.0)
    assert est.as_dict() == {"value": None, "lo": None, "hi": None, "n": 1, "ess": 1.0, "level": 0.95}
    report = {
        "status": "rejected",
        "message": "m",
        "new_rows": 1,
        "train_queries": 10,
        "train_seconds": 1.0,
        "comparison": {},
        "off_policy": {"candidate": {"n": 1, "accuracy_snips": est.as_dict(), "joules_snips": est.as_dict()}},
        "other": [np.float64("nan"), {"x": math.inf}],
    }
    jp, mp = _write_reports(tmp_path, "v1", report)

    def refuse(c):
        raise ValueError(c)

    doc = json.loads(jp.read_text(), parse_constant=refuse)
    assert doc["other"] == [None, {"x": None}] and "accuracy n/a [n/a, n/a]" in mp.read_text()


def test_a_report_that_cannot_be_written_leaves_the_decision_standing(tmp_path, sqlite_url):
    """The gate decided and the pointer moved; then the report cannot be written (a full disk, here a report_dir
    under a file): the run says so in one line and returns its decision, instead of a traceback that hides it."""
    _add(sqlite_url, "a")
    (tmp_path / "afile").write_text("")
    logs: list[str] = []
    res = run_retrain(_cfg(tmp_path, sqlite_url, report_dir=str(tmp_path / "afile" / "reports")), log=logs.append)
    assert res.status == "promoted" and res.report_json is None
    assert resolve(tmp_path / "current.json") == res.checkpoint.resolve()
    assert any("promoted, but its report was not written" in line and "afile" in line for line in logs), logs


def test_a_candidate_that_ties_the_serving_checkpoint_is_promoted_and_says_so(tmp_path):
    """A tie on the held-out queries promotes (the candidate learnt from newer rows the held-out set does not show:
    production energy, new candidates); the reason says it was a tie."""
    from litellm_energy_router.training.data import TableMatrix
    from litellm_energy_router.training.retrain_gate import compare

    n = 60
    rng = np.random.default_rng(0)
    Y = rng.integers(0, 2, (n, 2)).astype(float)
    E = np.tile([10.0, 90.0], (n, 1))
    hold = TableMatrix(
        ["small", "large"],
        np.array([f"q{i}" for i in range(n)], object),
        np.array(["t"] * n, object),
        ["x"] * n,
        np.ones(n),
        Y,
        E,
        np.full((n, 2), np.nan),
    )

    class Same:  # the same predictions as the serving checkpoint's
        def predict_proba(self, m):
            return np.tile([0.6, 0.8], (m.n, 1))

        def predict_energy(self, m):
            return m.E

    cfg = RetrainConfig(pointer=str(tmp_path / "p.json"), table_url="sqlite:///x")
    out = compare(Same(), Same(), hold, cfg)
    assert out["promote"] is True and "a tie: the fresher checkpoint serves" in out["why"]


def test_the_gate_calls_a_lead_inside_the_spread_a_tie():
    """A candidate 0.001 AIQ under the serving checkpoint on 152 held-out queries was "worse" and rejected at every
    step of the closed loop, so a new task learnt from production rows (never among the held-out queries) never
    served. A difference whose paired bootstrap 95 % interval holds 0 is a tie, and a tie promotes; a clearly worse
    candidate is still rejected, and resamples: 0 compares the point figures."""
    from litellm_energy_router.training.retrain_gate import compare

    rng = np.random.default_rng(1)
    n = 150
    Y = (rng.random((n, 3)) < [0.5, 0.65, 0.8]).astype(float)
    hold = _hold(Y, [10.0, 30.0, 90.0])
    informed = np.clip(0.6 * Y + 0.2 + 0.05 * rng.standard_normal((n, 3)), 0, 1)
    serving = Fixed(informed)
    nudged = informed.copy()
    flip = rng.random(n) < 0.03  # a few queries scored differently: a lead or a loss inside the spread
    nudged[flip] = nudged[flip][:, ::-1]
    near = Fixed(nudged)
    noise = Fixed(rng.random((n, 3)))  # knows nothing
    cfg = RetrainConfig.model_validate({"rule": "both"})
    out = compare(near, serving, hold, cfg)
    assert out["promote"] is True and "tie" in out["why"], out["why"]
    lo, hi = out["aiq_diff_ci"]
    assert lo <= 0 <= hi
    bad = compare(noise, serving, hold, cfg)
    assert bad["promote"] is False and bad["aiq_diff_ci"][1] < 0, bad["why"]
    exact = compare(near, serving, hold, RetrainConfig.model_validate({"rule": "both", "resamples": 0}))
    assert "aiq_diff_ci" not in exact
    assert out["candidate"]["aiq"] < out["serving"]["aiq"] and exact["promote"] is False  # point figures: "worse"


def _hold(Y: np.ndarray, joules: list[float]):
    """Held-out queries with correctness ``Y[n, K]`` and each candidate's constant joules (candidates small, ...)."""
    from litellm_energy_router.training.data import TableMatrix

    n, k = Y.shape
    return TableMatrix(
        candidates=["small", "medium", "large"][:k] if k == 3 else ["small", "large"],
        ids=np.array([f"q{i}" for i in range(n)], dtype=object),
        tasks=np.array(["t"] * n, dtype=object),
        texts=["x"] * n,
        prompt_tokens=np.full(n, 10.0),
        Y=Y,
        E=np.tile(joules, (n, 1)),
        T=np.full((n, k), np.nan),
    )


class Fixed:
    """A checkpoint stand-in scoring the held-out queries with fixed ``P`` and their true joules."""

    def __init__(self, P):
        self.P = P

    def predict_proba(self, m):
        return self.P

    def predict_energy(self, m):
        return m.E
