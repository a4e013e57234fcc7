"""Every request shape LiteLLM accepts goes through the strategy without raising."""

from __future__ import annotations

import asyncio

import pytest
from litellm import Router
from router_fixtures import CANDS
from test_strategy import model_list, settings

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.request_text import query_text
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy

# Real LiteLLM (Router / proxy / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = pytest.mark.litellm_integration

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
SHAPES = {
    "multi_turn": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Give a proof about glass number 3"},
    ],
    "parts": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Give a proof about"}, IMG, {"type": "text", "text": "birds"}],
        }
    ],
    "tool_calls": [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
    ],
    "system_only": [{"role": "system", "content": "You are terse."}],
    "empty": [{"role": "user", "content": ""}],
    "whitespace": [{"role": "user", "content": "   \n\t "}],
    "huge": [{"role": "user", "content": "word " * 200_000 + "Give a proof about chess"}],
    "emoji": [{"role": "user", "content": "Give a proof 🚀🔥 about 👩‍👩‍👧 family number 8"}],
}
# Lone surrogates cannot be sent over HTTP at all (LiteLLM's client refuses to encode them), so the
# router is checked on its own: it must pick a deployment without raising.
SURROGATES = [{"role": "user", "content": "proof \ud800\udfff\ud83d lone"}]


@pytest.fixture(scope="module")
def env(planted_ckpt):
    b = LocalBackend().start()
    router = Router(model_list=model_list(b))
    strategy = EnergyRoutingStrategy(router, settings(planted_ckpt))
    register_strategy(router, strategy)
    yield router, strategy, b
    b.stop()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_chat_shapes(env, shape):
    router, strategy, b = env
    before = sum(b.count(c) for c in CANDS)
    resp = asyncio.run(router.acompletion(model="pool", messages=SHAPES[shape]))
    assert resp.choices[0].message.content.startswith("answer from ")
    assert sum(b.count(c) for c in CANDS) == before + 1
    resp = router.completion(model="pool", messages=SHAPES[shape])  # sync path too
    assert resp.choices[0].message.content.startswith("answer from ")


def test_lone_surrogates_never_raise(env):
    router, strategy, b = env
    dep = asyncio.run(strategy.async_get_available_deployment("pool", messages=SURROGATES, request_kwargs={}))
    assert dep["model_info"]["id"] in {f"dep-{c}" for c in CANDS}
    dep = strategy.get_available_deployment("pool", messages=SURROGATES, request_kwargs={})
    assert dep["model_info"]["id"] in {f"dep-{c}" for c in CANDS}


def test_text_completion_and_embedding_pass_through(env):
    router, strategy, b = env
    before = sum(b.count(c) for c in CANDS)
    r = asyncio.run(router.atext_completion(model="pool", prompt="Give a proof about x"))
    assert r.choices[0].text.startswith("answer from ")
    e = asyncio.run(router.aembedding(model="pool", input=["a", "b"]))
    assert len(e.data) == 2
    assert sum(b.count(c) for c in CANDS) == before + 2


def test_extraction_rules():
    assert query_text(SHAPES["multi_turn"]).endswith("Give a proof about glass number 3")
    assert "hello" in query_text(SHAPES["multi_turn"])  # bounded earlier context
    assert query_text(SHAPES["parts"]) == "Give a proof about\nbirds"
    assert "get_weather" in query_text(SHAPES["tool_calls"])  # tool call as context, last user turn kept
    assert query_text(SHAPES["system_only"]) == "You are terse."
    assert query_text(SHAPES["empty"]) == ""
    assert len(query_text(SHAPES["huge"])) <= 8192 and query_text(SHAPES["huge"]).endswith("chess")
    assert query_text(None, prompt="x") is None and query_text(None, input=["a"]) is None
    assert query_text(None, prompt="route me", route_prompts=True) == "route me"
    assert query_text([object(), 5, None]) == ""
