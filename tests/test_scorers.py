"""The scorer registry: every kind is served from a checkpoint through one protocol, and an exported
baseline serves exactly the P the evaluation's baseline predicts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from router_fixtures import planted_rows

from litellm_energy_router.router.checkpoint import CheckpointError
from litellm_energy_router.router.runtime import RouterRuntime
from litellm_energy_router.router.scoring import Scorer, load_scorer, scorer_factories
from litellm_energy_router.table import open_store


@pytest.fixture(scope="module")
def planted_matrix(tmp_path_factory):
    from litellm_energy_router.training.data import load_matrix

    d = tmp_path_factory.mktemp("bl")
    store = open_store(f"sqlite:///{d / 't.db'}")
    cands, queries, runs = planted_rows(60, seed=1)
    store.write(queries, runs, candidates=cands)
    return load_matrix(store)


def test_builtin_kinds_are_registered():
    assert {"student", "lm", "task_prior", "knn", "logreg"} <= set(scorer_factories())


def test_auto_kind_is_the_manifests_and_an_unknown_kind_is_refused(planted_ckpt):
    s = load_scorer(planted_ckpt)
    assert isinstance(s, Scorer) and s.name == "student" and s.inline
    with pytest.raises(CheckpointError, match="scorer 'nope' is not registered"):
        load_scorer(planted_ckpt, "nope")


@pytest.mark.parametrize("kind", ["task_prior", "knn", "logreg", "mf"])
def test_exported_baseline_serves_the_evaluation_baselines_p(kind, planted_matrix, tmp_path):
    from litellm_energy_router.training.baselines import export_baseline, make_baseline

    train_idx, test_idx = np.arange(0, 60, 2)[:20].tolist() + list(range(1, 41, 2)), list(range(41, 60, 2)) + [40, 42]
    train, test = planted_matrix.take(np.array(sorted(train_idx))), planted_matrix.take(np.array(test_idx))
    ck = export_baseline(kind, train, tmp_path / kind)
    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["scorer"] == kind and manifest["baseline"]["kind"] == kind
    served = load_scorer(ck)
    assert served.name == kind and served.candidates == train.candidates
    expected = make_baseline(kind, **manifest["baseline"]["params"]).fit(train).predict_proba(test)
    np.testing.assert_allclose(served.score(list(test.texts), list(test.tasks)), expected, atol=1e-6)
    E = served.energy(list(test.texts), list(test.tasks))
    assert E.shape == (len(test), len(train.candidates)) and (E > 0).all()
    # an unseen task gets the pooled prior, not an error
    assert served.score(["Give a proof about rivers"], ["never-seen"]).shape == (1, len(train.candidates))


def test_runtime_serves_an_exported_baseline(planted_matrix, tmp_path):
    from litellm_energy_router.training.baselines import export_baseline

    ck = export_baseline("task_prior", planted_matrix, tmp_path / "tp")
    rt = RouterRuntime(ck)
    s = rt.score_sync("Tell me about bread number 3", "synthetic")
    assert rt.model.name == "task_prior" and s.P.shape == (3,)
    np.testing.assert_allclose(s.P, (planted_matrix.Y.sum(0) + planted_matrix.Y.mean(0)) / (len(planted_matrix) + 1))


def test_broken_baseline_is_refused_with_one_line(planted_matrix, tmp_path):
    from litellm_energy_router.training.baselines import export_baseline

    ck = export_baseline("task_prior", planted_matrix, tmp_path / "tp")
    (ck / "baseline.npz").write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as e:
        load_scorer(ck)
    assert "baseline.npz" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["j_per_prompt_token", "j_per_output_token", "output_tokens_prior"])
def test_a_manifest_whose_energy_misses_a_candidate_is_refused_with_one_line(planted_matrix, tmp_path, key):
    """The manifest is not among the hashed files: an energy table that lacks a candidate (edited, or written by
    another tool) is refused when the checkpoint is read, naming the key and the candidate, not a KeyError later."""
    from litellm_energy_router.training.baselines import export_baseline

    ck = export_baseline("task_prior", planted_matrix, tmp_path / "tp")
    m = json.loads((ck / "manifest.json").read_text())
    first = m["candidates"][0]
    m["energy"][key].pop(first)
    (ck / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=rf"energy\.{key} has no entry for candidate '{first}'$"):
        load_scorer(ck)


def test_train_cli_exports_a_baseline_that_route_serves(tmp_path):
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("energy-router"))
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    c, q, runs = planted_rows(30)
    store.write(q, runs, candidates=c)
    store.close()
    run = lambda *a: subprocess.run([exe, *a], capture_output=True, text=True, timeout=600, env={**os.environ})  # noqa: E731
    r = run("train", "--db", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "ck"), "--scorer", "task_prior")
    assert r.returncode == 0, r.stderr
    inp = tmp_path / "in.csv"
    with open(inp, "w", newline="") as fh:
        csv.writer(fh).writerows(
            [["", "sample_id", "prompt", "eval_name"], [1, "s.1", "['Tell me about glass']", "synthetic"]]
        )
    r = run(
        "route",
        "--checkpoint",
        str(tmp_path / "ck"),
        "--input",
        str(inp),
        "--output",
        str(tmp_path / "d.jsonl"),
        "--sweep",
        "3",
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["model"] == "large"  # λ = 0: the most accurate on the task (large solves all)
    e = lines[-1]["energy_j"]  # the sweep spans this input's curve: its last point is the cheapest choice
    assert lines[-1]["model"] == min(e, key=e.get)
    r = run("train", "--db", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "x"), "--scorer", "forest")
    assert r.returncode == 2 and "--scorer 'forest'" in r.stderr
