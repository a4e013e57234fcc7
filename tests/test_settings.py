from __future__ import annotations

import pytest

from litellm_energy_router.settings import DEFAULT_TABLE_URL, ConfigError, load_settings


def test_defaults_need_no_file():
    s = load_settings(None, environ={})
    assert s.table.url == DEFAULT_TABLE_URL
    assert s.energy.meter == "estimate" and s.router.timeout_ms == 50


def test_yaml_env_and_env_refs(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        """
energy_router:
  table: {url: os.environ/MY_DB}
  knob: {lambda: 0.3, per_key: {team-a: {target_accuracy: 0.9}}}
  candidates:
    - {name: small, params_b: 7}
    - {name: big, params_b: 70, deployment_id: os.environ/BIG_ID}
  privacy: {salt: os.environ/SALT}
"""
    )
    env = {
        "MY_DB": "sqlite:///from_env.db",
        "BIG_ID": "dep-2",
        "SALT": "pepper",
        "ENERGY_ROUTER_ROUTER__TIMEOUT_MS": "20",
    }
    s = load_settings(cfg, environ=env)
    assert s.table.url == "sqlite:///from_env.db"
    assert s.knob.lambda_ == 0.3 and s.knob.per_key["team-a"].target_accuracy == 0.9
    assert s.candidates[1].deployment_id == "dep-2" and s.privacy.salt == "pepper"
    assert s.router.timeout_ms == 20.0
    # environment beats the file
    s2 = load_settings(cfg, environ={**env, "ENERGY_ROUTER_TABLE__URL": "postgresql+psycopg://h/db"})
    assert s2.table.url == "postgresql+psycopg://h/db"


@pytest.mark.parametrize(
    "yaml_text, env, expected",
    [
        ("knob: {lambda: -1}", {}, "config key 'knob.lambda' = -1: Input should be greater than or equal to 0"),
        ("router: {timeout_ms: fast}", {}, "config key 'router.timeout_ms' = 'fast'"),
        ("table: {url: 'mysql://x'}", {}, "config key 'table.url' = 'mysql://x'"),
        ("energy: {meter: magic}", {}, "config key 'energy.meter' = 'magic'"),
        ("routr: {}", {}, "unknown config key 'routr'"),
        ("candidates: [{params_b: 3}]", {}, "config key 'candidates.0.name' is required"),
        ("table: {url: os.environ/NOPE}", {}, "config key 'table.url': environment variable 'NOPE' is not set"),
        ("knob: [1, 2", {}, "not valid YAML"),
        ("", {"ENERGY_ROUTER_KNOB__TARGET_ACCURACY": "1.5"}, "config key 'knob.target_accuracy' = '1.5'"),
        # a bearer token YAML reads as a number is never echoed (it was: `= 8843920173554: Input should be ...`)
        ("energy: {agent_token: 8843920173554}", {}, "config key 'energy.agent_token' = <redacted>"),
        # non-finite energy settings (NaN idle power gave every joule to idle; inf history kept everything)
        ("energy: {idle_power_w: .nan}", {}, "config key 'energy.idle_power_w"),
        ("energy: {idle_power_w: .inf}", {}, "config key 'energy.idle_power_w"),
        ("energy: {prefill_weight: .inf}", {}, "config key 'energy.prefill_weight' = inf"),
        ("energy: {decode_weight: .inf}", {}, "config key 'energy.decode_weight' = inf"),
        ("energy: {history_s: .inf}", {}, "config key 'energy.history_s' = inf"),
        ("energy: {settle_timeout_s: .nan}", {}, "config key 'energy.settle_timeout_s' = nan"),
    ],
)
def test_errors_are_one_line_naming_key_and_value(tmp_path, yaml_text, env, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("energy_router:\n  " + yaml_text if yaml_text else "energy_router: {}\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg, environ=env)
    msg = str(ei.value)
    assert expected in msg and "\n" not in msg
    assert str(cfg) in msg


def test_file_without_top_key_is_refused(tmp_path):
    cfg = tmp_path / "flat.yaml"
    cfg.write_text("table: {url: 'sqlite:///flat.db'}\n")
    with pytest.raises(ConfigError, match=r"flat\.yaml: no top-level 'energy_router:' key \(found: table\)"):
        load_settings(cfg, environ={})


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_settings("nope.yaml", environ={})


def test_shipped_example_loads():
    from pathlib import Path

    s = load_settings(Path(__file__).resolve().parents[1] / "config_examples/energy-router.yaml", environ={})
    assert s.router.threads == 1 and s.router.batch_wait_ms == 0 and len(s.candidates) == 3


def test_env_vars_nest_by_double_underscore(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("energy_router: {knob: {lambda: 0.1}, router: {timeout_ms: 30}}")
    env = {
        "ENERGY_ROUTER_CONFIG": str(cfg),  # the file, not a config key
        "ENERGY_ROUTER_SALT": "pepper",  # names no section: ignored
        "energy_router_knob__per_key__team-a__lambda": "0.2",
        "ENERGY_ROUTER_ENERGY__GPUS": "[0, 1]",
        "ENERGY_ROUTER_CANDIDATES": "[{name: small}, {name: big}]",
        "ENERGY_ROUTER_ROUTER__THREADS": "2",
    }
    s = load_settings(environ=env)
    assert s.knob.lambda_ == 0.1 and s.knob.per_key["team-a"].lambda_ == 0.2
    assert s.energy.gpus == [0, 1] and [c.name for c in s.candidates] == ["small", "big"]
    assert s.router.timeout_ms == 30 and s.router.threads == 2  # file and environment merge per key
    with pytest.raises(
        ConfigError, match=r"^.*c\.yaml: environment value of config key 'candidates' = .*not valid JSON or YAML"
    ):
        load_settings(environ={**env, "ENERGY_ROUTER_CANDIDATES": "[{name: small"})
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown config key 'router\.timeoutms'"):
        load_settings(environ={**env, "ENERGY_ROUTER_ROUTER__TIMEOUTMS": "5"})
