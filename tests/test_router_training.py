from __future__ import annotations

import json

import numpy as np
import pytest
from router_fixtures import CANDS

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.checkpoint import CheckpointError, point_to, read_manifest
from litellm_energy_router.router.decide import decide
from litellm_energy_router.router.model import RouterModel
from litellm_energy_router.table import open_store


def test_quick_train_learns_planted_rule(planted_ckpt):
    r = RouterModel(planted_ckpt)
    assert r.candidates == CANDS  # cheapest first
    texts = [
        "Give a proof about chess number 999",
        "Tell me about chess number 999",
        "Give a proof about birds number 1234",
        "Tell me about rivers number 77",
    ]
    P = r.score(texts)
    assert P[0, 2] > P[0, 0] + 0.3 and P[2, 2] > P[2, 0] + 0.3  # large beats small on proofs
    assert P[1, 0] > 0.7 and P[3, 0] > 0.7  # small is fine elsewhere
    E = r.energy(texts)
    choice = decide(P, E, Knob(**{"lambda": 0.05}))
    assert [CANDS[i] for i in choice] == ["large", "small", "large", "small"]
    assert [CANDS[i] for i in decide(P, E, Knob(target_accuracy=0.8))] == ["large", "small", "large", "small"]


def test_manifest_contents_and_mismatch(planted_ckpt, tmp_path):
    m = read_manifest(planted_ckpt)
    assert m.candidates == CANDS and m.label_tokens["large"] == "<er:c2>"
    assert "e_ref_j" not in m.knob and m.knob["lambda_max"] > 0  # λ's unit is the settings', not the checkpoint's
    assert m.watermark["queries"] == 60 and "transformers" in m.versions
    assert (planted_ckpt / "model.safetensors").exists()
    with pytest.raises(CheckpointError, match="candidates do not match the pool"):
        RouterModel(planted_ckpt, expect_candidates=["small", "large", "medium"])
    # a pointer file resolves to the checkpoint
    ptr = tmp_path / "current.json"
    point_to(ptr, planted_ckpt)
    assert RouterModel(ptr).version == m.version
    ptr.write_text("not json")
    with pytest.raises(CheckpointError, match="not a checkpoint pointer"):
        RouterModel(ptr)


def test_broken_manifest_refused(planted_ckpt, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(planted_ckpt, bad)
    doc = json.loads((bad / "manifest.json").read_text())
    doc["format"] = "something-else/9"
    (bad / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="format 'something-else/9'"):
        RouterModel(bad)
    (bad / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        RouterModel(bad)


def test_long_and_odd_prompts_are_bounded(planted_ckpt):
    r = RouterModel(planted_ckpt)
    P = r.score(["x" * 1_000_000, "", "emoji 🚀 and \ud800 surrogate", "   "])
    assert P.shape == (4, 3) and np.isfinite(P).all()


def _cli(*args):
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("energy-router"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600, env={**os.environ})


def test_route_cli_reads_only_routing_columns(planted_ckpt, tmp_path):
    import csv

    inp = tmp_path / "in.csv"
    with open(inp, "w", newline="") as fh:
        w = csv.writer(fh)
        # outcome columns hold values that would break any parser that touched them
        w.writerow(["", "sample_id", "prompt", "eval_name", "large", "large|model_response", "large|total_cost"])
        w.writerow([7, "s.7", "['Give a proof about glass number 5']", "synthetic", "not-a-number", "['broken", "x"])
        w.writerow([8, "s.8", "['Tell me about glass number 6']", "synthetic", "", "]]]", "?"])
    out = tmp_path / "d.jsonl"
    r = _cli(
        "route",
        "--checkpoint",
        str(planted_ckpt),
        "--input",
        str(inp),
        "--output",
        str(out),
        "--lambda",
        "0,0.05",
        "--sweep",
        "3",
        "--target-accuracy",
        "0.8",
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(lines) == 2 * 6
    assert set(lines[0]) == {"row", "eval_name", "model", "lambda", "scores", "energy_j"}
    assert set(lines[0]["scores"]) == set(CANDS)
    at = {(d["row"], d.get("lambda")): d["model"] for d in lines}
    assert at[(7, 0.05)] == "large" and at[(8, 0.05)] == "small"
    sweep = sorted({d["lambda"] for d in lines if "lambda" in d})
    assert len(sweep) == 4 and sweep[0] == 0.0  # 0, 0.05 and the sweep's 0 merge; 2 more sweep points
    tgt = [d for d in lines if "target_accuracy" in d]
    assert {d["row"]: d["model"] for d in tgt} == {7: "large", 8: "small"}


def test_route_refuses_input_without_prompt(planted_ckpt, tmp_path):
    inp = tmp_path / "in.csv"
    inp.write_text(",sample_id,eval_name\n1,a,synthetic\n")
    r = _cli("route", "--checkpoint", str(planted_ckpt), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert r.returncode == 2 and "missing column 'prompt'" in r.stderr


def test_train_cli_quick(tmp_path):
    from router_fixtures import planted_rows

    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    c, q, runs = planted_rows(30)
    store.write(q, runs, candidates=c)
    store.close()
    r = _cli("train", "--db", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "ck"), "--quick")
    assert r.returncode == 0, r.stderr
    assert "calibration Brier" in r.stdout and (tmp_path / "ck" / "manifest.json").exists()
    assert not (tmp_path / "ck" / "_trainer").exists()  # the trainer's scratch was left in the checkpoint
    # no library noise in the output: the checkpointing rename's FutureWarning, the shard writer's progress bar
    assert "FutureWarning" not in r.stderr and "Writing model shards" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert read_manifest(tmp_path / "ck").probe["encoder"] == "all-MiniLM-L6-v2"
    open_store(f"sqlite:///{tmp_path / 'empty.db'}").close()  # an empty table (a missing one is refused)
    empty = _cli("train", "--db", f"sqlite:///{tmp_path / 'empty.db'}", "--out", str(tmp_path / "ck2"), "--quick")
    assert empty.returncode == 2 and "fully labelled queries" in empty.stderr
    r = _cli(
        "train", "--db", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "ck3"), "--quick", "--probe-c", "0"
    )
    assert r.returncode == 0, r.stderr
    man = read_manifest(tmp_path / "ck3")  # the LM alone: per-task Platt intercepts, a student of its slot logits
    assert man.probe is None and "offset" not in man.calibration and man.student["target"] == "slot_logit"
    assert not (tmp_path / "ck3" / "probe.npz").exists()
    P = RouterModel(tmp_path / "ck3").score(["Give a proof about tea number 3"])
    assert P.shape == (1, len(man.candidates)) and np.isfinite(P).all()


def test_calibration_split_keeps_near_duplicates_together():
    from litellm_energy_router.training.data import load_matrix, near_duplicate_groups
    from litellm_energy_router.training.pipeline import calibration_split
    from router_fixtures import planted_rows

    store = open_store("sqlite://")
    c, q, runs = planted_rows(60)
    from litellm_energy_router.table import make_query

    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(300)]
    bases = [" ".join(rng.choice(words, 12, replace=False)) for _ in range(len(q) // 2)]
    # pairs of twins: the same sentence, the last word changed
    q = [
        make_query(x.id, x.task, f"{bases[i // 2]} because it was too {('big', 'small')[i % 2]}", source="tournament")
        for i, x in enumerate(q)
    ]
    store.write(q, runs, candidates=c)
    m = load_matrix(store)
    fit, cal = calibration_split(m, 0.2, seed=0)
    assert set(fit).isdisjoint(cal) and len(fit) + len(cal) == m.n and 0.15 * m.n <= len(cal) <= 0.3 * m.n
    g = near_duplicate_groups(m.texts, m.ids, m.tasks)
    assert len(set(g)) == m.n // 2
    assert {g[i] for i in fit}.isdisjoint({g[i] for i in cal})
    same = load_matrix(store)  # one giant group (every text alike): still a usable split, by query
    same.texts = ["the same question"] * same.n
    fit, cal = calibration_split(same, 0.2, seed=0)
    assert len(cal) == 12 and len(fit) == 48


def test_grpo_reward_is_a_table_lookup_and_stage_runs(tmp_path):
    from litellm_energy_router.training.grpo import GRPOStageConfig, make_reward
    from litellm_energy_router.training.pipeline import TrainConfig, train
    from router_fixtures import planted_rows

    reward = make_reward([101, 102, 103], e_ref=90.0)
    got = reward(
        prompts=["p"] * 3,
        completions=["a"] * 3,
        completion_ids=[[101], [103], [7]],
        correct=[[1, 0, 1]] * 3,
        joules=[[10, 30, 90]] * 3,
        lam=[0.5, 0.5, 0.5],
    )
    assert got == pytest.approx([1 - 0.5 * 10 / 90, 1 - 0.5 * 90 / 90, -1.0])
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    c, q, runs = planted_rows(30)
    store.write(q, runs, candidates=c)
    cfg = TrainConfig.quick()
    cfg.grpo = GRPOStageConfig(steps=4, num_generations=3, prompts_per_step=2)
    ck = train(store, tmp_path / "ck", cfg, log=lambda s: None)
    m = read_manifest(ck)
    assert len(m.knob["grpo_lambda_buckets"]) == 8 and m.knob["grpo_lambda_buckets"][0] == 0.0
    assert RouterModel(ck).score(["Give a proof about x"]).shape == (1, 3)


def test_eval_cli_judges_a_given_checkpoint_on_held_out_rows(planted_ckpt, tmp_path):
    """`eval --checkpoint` scores a trained checkpoint as it is (not refitted) on every held-out fold of
    another table, next to the baselines fitted on that table's training folds."""
    from router_fixtures import planted_rows

    from litellm_energy_router.table import make_query, open_store

    store = open_store(f"sqlite:///{tmp_path / 'held.db'}")
    cands, queries, runs = planted_rows(60, seed=7)
    held = [
        make_query(f"h{i}", q.task, q.text.replace("number", "item"), source="tournament")
        for i, q in enumerate(queries)
    ]
    ids = {q.id: h.id for q, h in zip(queries, held)}
    store.write(held, [{**r, "query_id": ids[r["query_id"]]} for r in runs], candidates=cands)
    store.close()
    out = tmp_path / "rep"
    r = _cli(
        "eval",
        "--db",
        f"sqlite:///{tmp_path / 'held.db'}",
        "--out",
        str(out),
        "--no-router",
        "--baselines",
        "task_prior",
        "--folds",
        "3",
        "--checkpoint",
        str(planted_ckpt),
    )
    assert r.returncode == 0, r.stderr
    version = read_manifest(planted_ckpt).version
    rows = {
        ln.split("|")[1].strip(): ln.split("|")[2].strip()
        for ln in (out / "report.md").read_text().splitlines()
        if ln.startswith("| ") and ln.count("|") > 5
    }
    assert f"checkpoint {version}" in rows and "task_prior" in rows
    assert float(rows[f"checkpoint {version}"]) > float(rows["task_prior"]) + 0.05  # it knows the planted rule
    bad = _cli(
        "eval",
        "--db",
        f"sqlite:///{tmp_path / 'held.db'}",
        "--out",
        str(out),
        "--no-router",
        "--checkpoint",
        str(tmp_path / "nope"),
    )
    assert bad.returncode == 2 and str(tmp_path / "nope") in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_calibration_keeps_the_lm_slope_non_negative():
    from litellm_energy_router.training.calibrate import fit_calibration

    rng = np.random.default_rng(0)
    n = 400
    Y = (rng.random((n, 2)) < 0.5).astype(float)
    q = np.zeros((n, 2))  # the probe knows nothing
    # candidate 0: the LM's logit rises with correctness; candidate 1: it falls (a calibration set's noise)
    z = np.column_stack([2 * Y[:, 0] - 1, 1 - 2 * Y[:, 1]]) + rng.normal(0, 0.5, (n, 2))
    cal = fit_calibration(z, z, Y, ["t"] * n, q, q)
    assert cal["a"][0] > 1 and cal["a_any"][0] > 1  # real signal is used
    assert cal["a"][1] == 0 and cal["a_any"][1] == 0  # an upside-down LM is ignored, never inverted


def test_a_pointer_to_a_missing_directory_says_so(tmp_path):
    """It said "<dir>: no manifest.json (not a router checkpoint)" for a directory that does not exist."""
    ptr = tmp_path / "router.json"
    ptr.write_text(json.dumps({"checkpoint": str(tmp_path / "gone")}))
    with pytest.raises(CheckpointError, match=r"gone: no such checkpoint directory \(named by .*router\.json\)"):
        read_manifest(ptr)
