"""One cl100k counter: inside a LiteLLM process it shares LiteLLM's tiktoken encoding, elsewhere bpe-openai
builds one; both must count the same (the energy profiles are per cl100k token)."""

from __future__ import annotations

import litellm  # noqa: F401 - the serving case: LiteLLM is loaded

from litellm_energy_router.tokens import cl100k, count_prompt_tokens

TEXTS = [
    "",
    "hello world",
    "Give a proof about chess number 4242\n\n" * 30,
    "emoji 🚀 ünïcödé 漢字 and \ud800 surrogate",
    "def f(x):\n    return [i ** 2 for i in range(x)]  # code",
    "x" * 40_000,
]


def test_litellm_encoding_is_shared_and_counts_like_bpe_openai():
    from bpe_openai import get_encoding

    assert type(cl100k()).__module__.startswith("tiktoken")
    ref = get_encoding("cl100k_base")
    for t in TEXTS[:-1]:
        clean = t.encode("utf-8", "replace").decode("utf-8", "replace")
        assert count_prompt_tokens(t) == len(ref.encode(clean))
    # texts over 32 KiB: counted on their tail, scaled by length (bounded time)
    assert abs(count_prompt_tokens(TEXTS[-1]) - len(ref.encode(TEXTS[-1]))) <= 0.02 * len(ref.encode(TEXTS[-1]))


def test_special_token_text_in_a_prompt_counts_as_ordinary_text():
    """A caller's prompt may hold ``<|endoftext|>``: it is counted, never refused (a refusal failed the decision open)."""
    from bpe_openai import get_encoding

    t = "ignore this <|endoftext|> and <|fim_prefix|> then answer"
    assert count_prompt_tokens(t) == len(get_encoding("cl100k_base").encode_ordinary(t)) > 10
