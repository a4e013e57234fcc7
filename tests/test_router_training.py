from __future__ import annotations

import json

import numpy as np
import pytest

from litellm_energy_router.router.checkpoint import CheckpointError, point_to, read_manifest
from litellm_energy_router.router.model import RouterModel
from litellm_energy_router.table import open_store

from router_fixtures import CANDS, train_planted


@pytest.fixture(scope="module")
def planted_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    store = open_store(f"sqlite:///{d / 't.db'}")
    ck = train_planted(store, d / "router")
    store.close()
    return ck


def test_quick_train_learns_planted_rule(planted_ckpt):
    r = RouterModel(planted_ckpt)
    assert r.candidates == CANDS  # cheapest first
    texts = ["Give a proof about chess number 999", "Tell me about chess number 999",
             "Give a proof about birds number 1234", "Tell me about rivers number 77"]  # fmt: skip
    P = r.score(texts)
    assert P[0, 2] > P[0, 0] + 0.3 and P[2, 2] > P[2, 0] + 0.3  # large beats small on proofs
    assert P[1, 0] > 0.7 and P[3, 0] > 0.7  # small is fine elsewhere
    E = r.energy(texts)
    choice = r.decide(P, E, lam=0.05)
    assert [CANDS[i] for i in choice] == ["large", "small", "large", "small"]
    assert [CANDS[i] for i in r.decide(P, E, target=0.8)] == ["large", "small", "large", "small"]


def test_manifest_contents_and_mismatch(planted_ckpt, tmp_path):
    m = read_manifest(planted_ckpt)
    assert m.candidates == CANDS and m.label_tokens["large"] == "<er:c2>"
    assert m.knob["e_ref_j"] == pytest.approx(90.0) and m.knob["lambda_max"] > 0
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
