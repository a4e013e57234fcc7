"""``retrain`` trains what its config's ``train:`` section names (backbone, stages, budgets), and
refuses a bad key with a one-line error naming it."""

from __future__ import annotations

import pytest
from litellm_energy_router.training.retrain import load_retrain_config, run_retrain
from litellm_energy_router.training.train_config import TrainSection
from router_fixtures import planted_rows, retrain_yaml

from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import ConfigError
from litellm_energy_router.table import open_store


def test_retrain_builds_the_backbone_its_config_names(tmp_path, sqlite_url):
    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(60)
    store.write(queries, runs, candidates=cands)
    store.close()
    conf = retrain_yaml(
        tmp_path,
        sqlite_url,
        10,
        """
        train:
          backbone: {name: tiny, hidden_size: 48, layers: 3, vocab_size: 384}
          sft: {epochs: 2, batch_size: 8}
          max_len: 48
          student: false
        """,
    )
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
    assert (
        TrainSection().build(quick=True).probe_c == 0.3 and TrainSection().build(quick=True).backbone.hidden_size == 64
    )


@pytest.mark.parametrize(
    "train, key",
    [
        ("train: {backbone: {hidden_sise: 64}}", "train.backbone.hidden_sise"),
        ("train: {sft: {epochs: -1}}", "train.sft.epochs"),
        ("train: {grpo: {steps: 5}}\ngrpo_steps: 3", "grpo_steps"),
        ("train: {backbone: {name: nope}}", "train.backbone.name"),
    ],
)
def test_a_bad_train_key_is_a_one_line_error_naming_it(tmp_path, sqlite_url, train, key):
    conf = retrain_yaml(tmp_path, sqlite_url, 10, train)
    with pytest.raises(ConfigError) as e:
        load_retrain_config(conf)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_each_train_key_is_defined_once_by_its_training_dataclass():
    """The ``train:`` keys are derived from the dataclasses beside the trainers: same names and defaults, the
    bounds of the field's metadata, the docstring's description; nothing is declared twice."""
    import dataclasses

    from litellm_energy_router.training.backbones import BackboneSpec
    from litellm_energy_router.training.grpo import GRPOStageConfig
    from litellm_energy_router.training.pipeline import TrainConfig
    from litellm_energy_router.training.sft import SFTStageConfig
    from litellm_energy_router.training.train_config import NOT_KEYS, BackboneSection, GRPOSection, SFTSection
    from pydantic import ValidationError

    pairs = [
        (BackboneSection, BackboneSpec(), ()),
        (SFTSection, SFTStageConfig(), ()),
        (GRPOSection, GRPOStageConfig(), ("enabled",)),
        (TrainSection, TrainConfig(), ("backbone", "sft", "grpo")),
    ]
    for section, base, own in pairs:
        fields = [
            f.name for f in dataclasses.fields(base) if not (isinstance(base, TrainConfig) and f.name in NOT_KEYS)
        ]
        assert set(section.model_fields) == set(fields) | set(own), section.__name__
        for k in fields:
            assert section.model_fields[k].default == getattr(base, k), (section.__name__, k)
            assert section.model_fields[k].description, (section.__name__, k)
    for section, key, bad in [
        (SFTSection, "epochs", 0),
        (GRPOSection, "num_generations", 1),
        (BackboneSection, "layers", 0),
        (TrainSection, "max_len", 8),
        (TrainSection, "probe_c", -1.0),
    ]:
        with pytest.raises(ValidationError):
            section.model_validate({key: bad})
    tc = TrainSection.model_validate({"grpo": {"beta": 0.1}, "seed": 3}).build(quick=True)
    assert tc.grpo.beta == 0.1 and tc.grpo.steps == GRPOStageConfig().steps and tc.seed == 3 and tc.max_len == 64


def test_a_retrain_that_fails_while_training_leaves_no_version_directory(tmp_path, sqlite_url, monkeypatch):
    """Training raises half-way (here: the trainer itself): the error reaches the caller, and the half-written
    ``versions/.tmp-*`` directory is gone (a cron retrying every hour does not pile them up)."""
    from litellm_energy_router.training import pipeline

    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(60)
    store.write(queries, runs, candidates=cands)
    store.close()
    cfg = load_retrain_config(retrain_yaml(tmp_path, sqlite_url, 10, "train: {student: false}"))

    def broken(m, out, *a, **k):
        (out / "partial.bin").parent.mkdir(parents=True, exist_ok=True)
        (out / "partial.bin").write_bytes(b"x")
        raise RuntimeError("trainer crashed")

    monkeypatch.setattr(pipeline, "train_matrix", broken)
    with pytest.raises(RuntimeError, match="trainer crashed"):
        run_retrain(cfg, log=lambda s: None)
    assert not list(tmp_path.rglob(".tmp-*"))
    killed = next(tmp_path.rglob(".retrain.lock")).parent / ".tmp-20240101T000000Z-000"  # a run killed by a signal
    (killed / "_trainer").mkdir(parents=True)
    monkeypatch.undo()
    logged: list[str] = []
    run_retrain(cfg, log=logged.append)  # the next run removes what the killed one left
    assert not killed.exists() and any(".tmp-20240101T000000Z-000" in m for m in logged)


def test_the_retrain_section_is_read_from_the_settings_file_named_by_the_environment(tmp_path, monkeypatch):
    """``retrain`` without ``--config`` reads ``$ENERGY_ROUTER_CONFIG`` (as every command): its ``energy_router:``
    part was read but its ``retrain:`` section silently ignored (the rule, the budget and a misspelt key alike)."""
    from litellm_energy_router.training.retrain_config import load_retrain_config

    from litellm_energy_router.settings import ConfigError

    f = tmp_path / "er.yaml"
    f.write_text(
        f"energy_router:\n  router:\n    checkpoint: {tmp_path / 'current.json'}\n"
        "retrain:\n  min_new_rows: 7\n  rule: aiq\n"
    )
    monkeypatch.setenv("ENERGY_ROUTER_CONFIG", str(f))
    cfg = load_retrain_config(None)
    assert (cfg.min_new_rows, cfg.rule) == (7, "aiq")
    f.write_text(f.read_text() + "  bogus_key: 1\n")
    with pytest.raises(ConfigError, match="bogus_key"):
        load_retrain_config(None)
