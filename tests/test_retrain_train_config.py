"""``retrain`` trains what its config's ``train:`` section names (backbone, stages, budgets), and
refuses a bad key with a one-line error naming it."""

from __future__ import annotations


import pytest
from router_fixtures import planted_rows, retrain_yaml

from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import ConfigError
from litellm_energy_router.table import open_store
from litellm_energy_router.training.retrain import load_retrain_config, run_retrain
from litellm_energy_router.training.train_config import TrainSection


def test_retrain_builds_the_backbone_its_config_names(tmp_path, sqlite_url):
    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(60)
    store.write(queries, runs, candidates=cands)
    store.close()
    conf = retrain_yaml(tmp_path, sqlite_url, 10, """
        train:
          backbone: {name: tiny, hidden_size: 48, layers: 3, vocab_size: 384}
          sft: {epochs: 2, batch_size: 8}
          max_len: 48
          student: false
        """)
    cfg = load_retrain_config(conf)
    res = run_retrain(cfg, log=lambda s: None)
    assert res.status == "promoted"
    m = read_manifest(resolve(tmp_path / "current.json"))
    assert (m.backbone["name"], m.backbone["hidden_size"], m.backbone["layers"]) == ("tiny", 48, 3)
    assert m.max_len == 48 and m.student is None
    tc = res.details["train_config"]
    assert tc["backbone"]["vocab_size"] == 384 and tc["sft"]["epochs"] == 2
    assert tc["sft"]["learning_rate"] == 5e-3  # not named: the quick configuration's value stays
    assert tc["grpo"] is None


def test_train_section_maps_stages_and_keeps_grpo_steps_working():
    tc = TrainSection.model_validate({"grpo": {"steps": 7}, "probe_c": None}).build()
    assert tc.grpo.steps == 7 and tc.probe_c is None and tc.backbone.hidden_size == 128  # over TrainConfig()
    assert TrainSection.model_validate({"grpo": {"enabled": False, "steps": 7}}).build().grpo is None
    assert TrainSection().build(grpo_steps=9).grpo.steps == 9
    assert TrainSection().build(quick=True).probe_c == 0.3 and TrainSection().build(quick=True).backbone.hidden_size == 64


@pytest.mark.parametrize("train, key", [
    ("train: {backbone: {hidden_sise: 64}}", "train.backbone.hidden_sise"),
    ("train: {sft: {epochs: -1}}", "train.sft.epochs"),
    ("train: {grpo: {steps: 5}}\ngrpo_steps: 3", "grpo_steps"),
])  # fmt: skip
def test_a_bad_train_key_is_a_one_line_error_naming_it(tmp_path, sqlite_url, train, key):
    conf = retrain_yaml(tmp_path, sqlite_url, 10, train)
    with pytest.raises(ConfigError) as e:
        load_retrain_config(conf)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg
