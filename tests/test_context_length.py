"""A deployment's context length bounds the energy estimate, through a real ``litellm.Router`` with the routing
strategy and a real OpenAI-compatible backend on 127.0.0.1: prompt and output tokens never exceed it (Ê is not
extrapolated past it), and a prompt longer than it is marked in the decision's ``energy_note``."""

from __future__ import annotations

import asyncio

import pytest
from litellm import Router
from router_fixtures import CANDS

from litellm_energy_router.demo.backend import LocalBackend as Backend
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.settings import Settings

pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]
SHORT, LONG = "Tell me about rivers", "Give a proof about chess and rivers and stones " * 40


def _decisions(
    planted_ckpt, context: dict, settings_context: dict, requests: list[tuple[str, int | None]]
) -> list[dict]:
    backend = Backend().start()
    try:
        s = Settings.model_validate(
            {
                "router": {"checkpoint": str(planted_ckpt), "timeout_ms": 5000, "cache_size": 0},
                "knob": {"lambda": 0.05},
                "candidates": [{"name": c, "context_tokens": settings_context.get(c)} for c in CANDS],
            }
        )
        model_list = [
            {
                "model_name": "pool",
                "litellm_params": {"model": f"openai/{c}", "api_base": backend.base(c), "api_key": "k"},
                "model_info": {"id": f"dep-{c}", **({"max_input_tokens": context[c]} if c in context else {})},
            }
            for c in CANDS
        ]
        router = Router(model_list=model_list)
        register_strategy(router, EnergyRoutingStrategy(router, s))
        out = []

        async def go():
            for text, max_tokens in requests:
                md: dict = {}
                extra = {"max_tokens": max_tokens} if max_tokens else {}
                msgs = text if isinstance(text, list) else [{"role": "user", "content": text}]
                await router.acompletion(model="pool", messages=msgs, metadata=md, **extra)
                out.append(md["energy_router_decision"])

        asyncio.run(go())
        return out
    finally:
        backend.stop()


def test_context_length_bounds_the_estimate_and_marks_an_over_long_prompt(planted_ckpt):
    est = read_manifest(resolve(planted_ckpt)).energy
    jp, jo = est.j_per_prompt_token, est.j_per_output_token
    reqs = [(LONG, None), (SHORT, None), (SHORT, 5)]
    free = _decisions(planted_ckpt, {}, {}, reqs)
    # large: model_info.max_input_tokens 60; medium: the settings' context_tokens 5000; small: no context length
    bound = _decisions(planted_ckpt, {"large": 60}, {"medium": 5000}, reqs)
    n_long, n_short = bound[0]["energy_note"]["prompt_tokens"], bound[1]["energy_note"]["prompt_tokens"]
    assert n_long > 60 > n_short

    long_free, long_bound = free[0], bound[0]
    assert long_bound["energy_note"]["over_context"] == ["large"]  # marked, not extrapolated
    assert long_bound["energy_note"]["context_tokens"] == {"medium": 5000, "large": 60}
    assert long_bound["energy_j"]["large"] == pytest.approx(
        60 * jp["large"], abs=1e-3
    )  # the context, no room to answer
    assert long_bound["energy_note"]["output_tokens"]["large"] == [0.0, 0.0, 0.0]
    assert long_free["energy_j"]["large"] > long_bound["energy_j"]["large"]
    assert "over_context" not in long_free["energy_note"]
    for c in ("small", "medium"):  # within their context (or none): as without a bound
        assert long_bound["energy_j"][c] == long_free["energy_j"][c]

    short = bound[1]  # fits: the output fills at most what the prompt leaves of the context
    room = 60 - n_short
    expected_out = min(free[1]["energy_note"]["output_tokens"]["large"][1], room)
    assert short["energy_note"]["over_context"] == []
    assert short["energy_note"]["output_tokens"]["large"][1] == pytest.approx(expected_out, abs=0.1)
    assert short["energy_j"]["large"] == pytest.approx(n_short * jp["large"] + expected_out * jo["large"], abs=2e-3)
    capped = bound[2]  # max_tokens 5 inside the room: max_tokens is the bound
    assert capped["energy_j"]["large"] == pytest.approx(n_short * jp["large"] + 5 * jo["large"], abs=2e-3)
    assert capped["energy_note"]["output_tokens"]["large"] == [5, 5, 5] and capped["energy_note"]["max_tokens"] == 5


def test_the_whole_prompt_counts_not_only_the_routed_slice(planted_ckpt):
    """The router reads a bounded slice of the request (the last user turn, a little around it); the prompt the
    model reads also holds the system prompt and the earlier turns. Ê's prompt part and the context-length check
    count all of it: a 20,000-character system prompt before a short question exceeds a 2,000-token context."""
    est = read_manifest(resolve(planted_ckpt)).energy
    jp = est.j_per_prompt_token
    system = "Follow the house rules on rivers and stones. " * 450  # ~20 kB the routed text leaves out
    chat = [{"role": "system", "content": system}, {"role": "user", "content": SHORT}]
    short, whole = _decisions(planted_ckpt, {"large": 2000}, {}, [(SHORT, None), (chat, None)])
    from litellm_energy_router.litellm_glue.request_text import query_text
    from litellm_energy_router.tokens import estimate_prompt_tokens

    text = query_text(chat)  # the system prompt's last 1 KiB and the question
    n_text, n_whole = estimate_prompt_tokens(text), whole["energy_note"]["prompt_tokens"]
    assert n_whole == pytest.approx(n_text * (len(system) + len(SHORT)) / len(text), abs=1) and n_whole > 2000
    assert short["energy_note"]["over_context"] == [] and whole["energy_note"]["over_context"] == ["large"]
    free = _decisions(planted_ckpt, {}, {}, [(text, None)])[0]  # the routed slice alone, as before
    for c in ("small", "medium"):
        assert whole["energy_j"][c] - free["energy_j"][c] == pytest.approx((n_whole - n_text) * jp[c], rel=0.01)
