"""The knob policy (issue: trust in production, item 3): which key may override λ / target / energy budget
from request metadata, within which bounds. An invalid value or a forbidden override is a caller error:
HTTP 400 naming the field from the real LiteLLM proxy, an exception with ``status_code`` 400 from a real
``litellm.Router`` (SDK); values within bounds still route."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import litellm
import pytest
import yaml
from proxy_process import ProxyProcess
from router_fixtures import CANDS, drain_litellm_logging, pool_deployments, train_planted

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.knob import KnobError, resolve_knob
from litellm_energy_router.litellm_glue.litellm_compat import (
    PROXY_CALLBACKS_MODULE,
    proxy_imports_installed_callbacks,
    register_strategy,
)
from litellm_energy_router.litellm_glue.strategy import EnergyRouterFilter, EnergyRoutingStrategy
from litellm_energy_router.router.checkpoint import point_to
from litellm_energy_router.settings import Settings
from litellm_energy_router.table import open_store

PROOF = "Give a proof about chess number 4242"
POLICY = {
    "lambda": 0.05,
    "per_key": {
        "free-tier": {"lambda": 7.0, "policy": {"allow_override": False}},
        "eco-team": {"policy": {"lambda_range": [0, 10], "max_energy_j_range": [1, 500]}},
    },
}
BAD = [float("nan"), float("inf"), -1.0, 1e12, 10**400, "0.3", True, [1]]  # 10**400: JSON allows it, no float holds it
FIELDS = ["lambda", "target_accuracy", "max_energy_j"]
# Real LiteLLM (Router / proxy): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = pytest.mark.litellm_integration


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend().start()
    yield b
    b.stop()


def _settings(ckpt, knob):
    return Settings.model_validate(
        {
            "router": {"checkpoint": str(ckpt), "timeout_ms": 5000},
            "candidates": [{"name": c} for c in CANDS],
            "knob": knob,
        }
    )


def _pool(backend):
    return litellm.Router(model_list=pool_deployments(backend))


@pytest.fixture
def router(planted_ckpt, backend):
    """The routing strategy with the default policy (overrides allowed within sane bounds)."""
    r = _pool(backend)
    register_strategy(r, EnergyRoutingStrategy(r, _settings(planted_ckpt, {"lambda": 0.05})))
    return r


@pytest.fixture
def keyed_router(planted_ckpt, backend):
    """The routing strategy with per-key policies (POLICY)."""
    r = _pool(backend)
    register_strategy(r, EnergyRoutingStrategy(r, _settings(planted_ckpt, POLICY)))
    return r


def _sdk(router, backend, metadata, text=PROOF):
    """(the exception raised or None, {backend: requests received})."""
    before = {c: backend.count(c) for c in CANDS}

    async def go():
        try:
            await router.acompletion(model="pool", messages=[{"role": "user", "content": text}], metadata=metadata)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            return e
        finally:
            await asyncio.sleep(0.05)
            await drain_litellm_logging()  # LiteLLM's logging of this call runs here, not in another test
        return None

    err = asyncio.run(go())
    return err, {c: backend.count(c) - before[c] for c in CANDS}


def _is_400_naming(err, field):
    return err is not None and getattr(err, "status_code", None) == 400 and field in str(err) and "\n" not in str(err)


def test_sdk_key_without_override_permission_is_refused_naming_lambda(keyed_router, backend):
    r = keyed_router
    err, sent = _sdk(r, backend, {"user_api_key_alias": "free-tier", "energy_router": {"lambda": 100}})
    assert _is_400_naming(err, "lambda") and sum(sent.values()) == 0
    # the same key without an override is served, with its own per-key default (λ = 7: the cheapest)
    err, sent = _sdk(r, backend, {"user_api_key_alias": "free-tier"})
    assert err is None and sent == {"small": 1, "medium": 0, "large": 0}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_sdk_invalid_knob_value_is_refused_naming_the_field(router, backend, field, bad):
    r = router
    err, sent = _sdk(r, backend, {"energy_router": {field: bad}})
    assert _is_400_naming(err, field) and sum(sent.values()) == 0


def test_sdk_values_outside_the_keys_bounds_are_refused(keyed_router, backend):
    r = keyed_router
    err, sent = _sdk(r, backend, {"user_api_key_team_alias": "eco-team", "energy_router": {"lambda": 100}})
    assert _is_400_naming(err, "lambda") and sum(sent.values()) == 0
    err, _ = _sdk(r, backend, {"user_api_key_team_alias": "eco-team", "energy_router": {"max_energy_j": 1000}})
    assert _is_400_naming(err, "max_energy_j")
    err, _ = _sdk(r, backend, {"energy_router": {"lamda": 1}})  # a misspelt field is named, not ignored
    assert _is_400_naming(err, "lamda")
    err, _ = _sdk(r, backend, {"energy_router": "cheap"})
    assert _is_400_naming(err, "energy_router")


def test_sdk_allowed_values_within_bounds_still_route(keyed_router, backend):
    r = keyed_router
    err, sent = _sdk(r, backend, {"energy_router": {"lambda": 100}})  # default policy: [0, 1000]
    assert err is None and sent["small"] == 1
    err, sent = _sdk(r, backend, {"energy_router": {"target_accuracy": 0.8}})
    assert err is None and sent["large"] == 1
    err, sent = _sdk(r, backend, {"user_api_key_team_alias": "eco-team", "energy_router": {"lambda": 10}})
    assert err is None and sent["small"] == 1
    err, sent = _sdk(r, backend, {"energy_router": {"lambda": None, "target_accuracy": None}})  # null = not given
    assert err is None and sent["large"] == 1


def test_a_keys_own_defaults_do_not_lift_its_teams_policy():
    """A key alias with knob defaults but no policy of its own stays under its team's policy; a key's own
    policy is the more specific one and wins."""
    knob = Settings.model_validate(
        {
            "knob": {
                "per_key": {
                    "alice": {"lambda": 0.5},
                    "restricted-team": {"policy": {"allow_override": False}},
                    "bob": {"policy": {"lambda_range": [0, 2]}},
                }
            }
        }
    ).knob
    team = {"user_api_key_team_alias": "restricted-team", "energy_router": {"lambda": 1}}
    with pytest.raises(KnobError, match="restricted-team"):
        resolve_knob(knob, {"metadata": {"user_api_key_alias": "alice", **team}})
    assert (
        resolve_knob(knob, {"metadata": {"user_api_key_alias": "alice", **{**team, "energy_router": {}}}}).lambda_
        == 0.5
    )
    assert resolve_knob(knob, {"metadata": {"user_api_key_alias": "bob", **team}}).lambda_ == 1.0
    with pytest.raises(KnobError, match=r"out of range \[0, 2\] \(key 'bob'\)"):
        resolve_knob(knob, {"metadata": {"user_api_key_alias": "bob", **{**team, "energy_router": {"lambda": 3}}}})


def test_sdk_filter_refuses_too(planted_ckpt, backend):
    """The proxy's entry point used in the SDK (a callback filter, no pre-call hook): the same refusal."""
    r = _pool(backend)
    filt = EnergyRouterFilter(_settings(planted_ckpt, {"lambda": 0.05}))
    assert filt.core.runtime.model is not None  # built outside an event loop: loaded now, not on first use
    litellm.callbacks = [filt]
    try:
        err, sent = _sdk(r, backend, {"energy_router": {"target_accuracy": 2}})
        assert _is_400_naming(err, "target_accuracy") and sum(sent.values()) == 0
        err, sent = _sdk(r, backend, {"energy_router": {"target_accuracy": 0.8}})
        assert err is None and sent["large"] == 1
    finally:
        litellm.callbacks = []


# -- the real LiteLLM proxy ---------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
NAMES = ["mistralai/mistral-7b-chat", "zero-one-ai/Yi-34B-Chat", "meta/llama-2-70b-chat"]
KEYS = {"free": "sk-free-tier-0123456789", "eco": "sk-eco-team-0123456789", "open": "sk-open-0123456789"}
PROXY_LOG: dict[str, Path] = {}  # the proxy process's log, for the log test


def _write_configs(d, pointer):
    """The example proxy config with a custom-auth module (three keys), and the router's settings file."""
    cfg = yaml.safe_load((ROOT / "config_examples/proxy_config.yaml").read_text())
    cfg["general_settings"]["custom_auth"] = "proxy_keys.user_api_key_auth"
    if not proxy_imports_installed_callbacks():  # an older proxy: callbacks from a module beside the config
        (d / "energy_router_callbacks.py").write_text(PROXY_CALLBACKS_MODULE)
        cfg["litellm_settings"]["callbacks"] = [
            "energy_router_callbacks." + c.rsplit(".", 1)[1] if c.startswith("litellm_energy_router.") else c
            for c in cfg["litellm_settings"]["callbacks"]
        ]
    (d / "proxy.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copy(Path(__file__).with_name("proxy_keys.py"), d / "proxy_keys.py")
    er = {
        "router": {"checkpoint": str(pointer), "timeout_ms": 5000},
        "knob": POLICY,
        "table": {"url": f"sqlite:///{d / 'production.db'}"},
        "writer": {"spool_dir": str(d / "spool")},
    }
    (d / "energy-router.yaml").write_text(yaml.safe_dump({"energy_router": er}))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, backend):
    d = tmp_path_factory.mktemp("knob_proxy")
    store = open_store(f"sqlite:///{d / 't.db'}")
    point_to(d / "current.json", train_planted(store, d / "v1", names=NAMES))
    store.close()
    _write_configs(d, d / "current.json")
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": "sk-master-0123456789",
        "VLLM_API_KEY": "none",
        "SMALL_API_BASE": backend.base("small"),
        "MEDIUM_API_BASE": backend.base("medium"),
        "LARGE_API_BASE": backend.base("large"),
        "ENERGY_ROUTER_CONFIG": str(d / "energy-router.yaml"),
    }
    server = ProxyProcess(d / "proxy.yaml", env, d, ready_timeout_s=180)
    port = server.port
    PROXY_LOG["path"] = server.log_path
    server.start()
    deadline = time.time() + 180
    while time.time() < deadline and _post(port, "open", "{}")[2] != "vllm-llama-70b":
        time.sleep(0.5)  # the router loads its checkpoint on first use; until then LiteLLM picks
    yield port
    server.stop(20)


def _post(port, key, knob, text=PROOF):
    """(status, JSON body, served deployment id). ``knob`` is raw JSON text (so NaN can be sent)."""
    body = '{"model": "chat", "messages": [{"role": "user", "content": %s}], "metadata": {"energy_router": %s}}' % (
        json.dumps(text),
        knob,
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body.encode(),
        headers={"Authorization": f"Bearer {KEYS[key]}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), r.headers.get("x-litellm-model-id")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), None


def _names_field(body, field):
    err = body.get("error") or {}
    return err.get("param") == f"metadata.energy_router.{field}" and field in str(err.get("message"))


def test_proxy_key_without_override_permission_gets_400_naming_lambda(proxy, backend):
    before = sum(backend.count(c) for c in CANDS)
    status, body, _ = _post(proxy, "free", '{"lambda": 100}')
    assert status == 400 and _names_field(body, "lambda"), body
    assert sum(backend.count(c) for c in CANDS) == before  # refused before any backend call
    status, _, dep = _post(proxy, "free", "{}")
    assert status == 200 and dep == "vllm-mistral-7b"  # its per-key default still applies


@pytest.mark.parametrize(
    "field, raw",
    [
        ("lambda", "NaN"),
        ("lambda", "-1"),
        ("lambda", "1e12"),
        ("target_accuracy", "Infinity"),
        ("target_accuracy", "1.5"),
        ("max_energy_j", "-5"),
        ("max_energy_j", '"lots"'),
        ("max_energy_j", "1e300"),
    ],
)
def test_proxy_invalid_values_get_400_naming_the_field(proxy, field, raw):
    status, body, _ = _post(proxy, "open", '{"%s": %s}' % (field, raw))
    assert status == 400 and _names_field(body, field), body


def test_proxy_out_of_the_keys_bounds_gets_400_and_values_within_bounds_route(proxy):
    status, body, _ = _post(proxy, "eco", '{"lambda": 100}')
    assert status == 400 and _names_field(body, "lambda"), body
    assert _post(proxy, "eco", '{"lambda": 10}')[::2] == (200, "vllm-mistral-7b")
    assert _post(proxy, "open", '{"lambda": 100}')[::2] == (200, "vllm-mistral-7b")
    assert _post(proxy, "open", '{"target_accuracy": 0.8}')[::2] == (200, "vllm-llama-70b")


def test_proxy_logs_a_refusal_as_one_warning_line_of_ours_not_litellms_error(proxy):
    """LiteLLM logs every exception a request raised (an ERROR line, a traceback in some releases); for a knob the
    pre-call hook refused, that record is dropped and the hook's own WARNING line (once a minute per field) says it."""
    status, body, _ = _post(proxy, "open", '{"lamda": 0.3}')
    assert status == 400 and _names_field(body, "lamda"), body
    assert _post(proxy, "open", '{"lamda": 0.4}')[0] == 400
    time.sleep(0.5)
    lines = PROXY_LOG["path"].read_text(errors="replace").splitlines()
    about = [ln for ln in lines if "metadata.energy_router" in ln]
    ours = [
        ln for ln in about if "refused a request knob with HTTP 400: metadata.energy_router.lamda" in ln
    ]  # a WARNING
    assert len(ours) == 1, about  # two refusals of this field within a minute: one line
    assert not [ln for ln in about if "ERROR" in ln or "_handle_llm_api_exception" in ln], about
    assert not any("KnobError" in ln for ln in lines)  # no traceback


def test_a_caller_cannot_hide_the_proxys_error_lines_behind_a_refusal_text():
    """The proxy's record of a request is dropped only for a refusal a hook of ours raised (its exception, one raised
    around it, or, where the release logs the message pre-formatted, that refusal's exact text, once), never
    because the caller's call id (formatted into the line) reads like one."""
    from litellm_energy_router.errors import REFUSAL_LINES
    from litellm_energy_router.litellm_glue.litellm_compat import _DropRefusals

    drop = _DropRefusals()
    fmt = "_handle_llm_api_exception(): Exception occured - litellm_call_id=%s - %s"

    def rec(*args, exc=None, msg=fmt):
        return logging.LogRecord("LiteLLM Proxy", logging.ERROR, __file__, 1, msg, args or None, exc)

    crafted = "energy-router: call id x"  # a caller's x-litellm-call-id
    assert drop.filter(rec(crafted, RuntimeError("backend 500")))
    knob = KnobError("lamda", "is not a knob field")
    assert drop.filter(rec(msg=f"... litellm_call_id={crafted} - {knob}"))  # pre-formatted, not raised by a hook
    assert not drop.filter(rec("id-1", knob))  # the exception itself
    try:  # a wrapper the proxy raised while handling ours
        try:
            raise knob
        except KnobError:
            raise RuntimeError("wrapped")
    except RuntimeError as w:
        assert not drop.filter(rec("id-2", "x", exc=(type(w), w, w.__traceback__)))
    REFUSAL_LINES.note(knob)  # the hook raised it: the proxy's pre-formatted line about it goes, once
    assert not drop.filter(rec(msg=f"... litellm_call_id=id-3 - {knob}"))
    assert drop.filter(rec(msg=f"... litellm_call_id=id-3 - {knob}"))


def test_a_max_tokens_no_float_holds_bounds_nothing_and_the_request_routes(planted_ckpt, backend):
    """``max_tokens: 10**400`` (valid JSON) made Ê's bound raise OverflowError: the request failed open unrouted. It
    bounds nothing: routed as without it."""
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
    from litellm_energy_router.router.output_tokens import request_max_tokens

    assert request_max_tokens({"max_tokens": 10**400}) is None and request_max_tokens({"max_tokens": 64}) == 64
    core = EnergyRouterCore(_settings(planted_ckpt, {"lambda": 0.05}))
    deps, msgs = _pool(backend).model_list, [{"role": "user", "content": PROOF}]
    _, plain = core.choose_sync(deps, msgs, request_kwargs={"metadata": {}})
    _, huge = core.choose_sync(deps, msgs, request_kwargs={"metadata": {}, "max_tokens": 10**400})
    assert huge.fallback is None and huge.candidate == plain.candidate and huge.energy_j == plain.energy_j
