"""One cl100k counter: inside a LiteLLM process it shares LiteLLM's tiktoken encoding, elsewhere bpe-openai
builds one; both must count the same (the energy profiles are per cl100k token)."""

from __future__ import annotations

import litellm  # noqa: F401 - the serving case: LiteLLM is loaded

from litellm_energy_router.tokens import cl100k, count_prompt_tokens, estimate_prompt_tokens

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


def test_the_routing_estimate_stays_near_the_count_on_the_bundled_prompts():
    """Routing prices a prompt with :func:`estimate_prompt_tokens` (byte classes, no 39 MiB table): on the package's
    bundled RouterBench prompts its error against the cl100k count stays small, and it is bounded on any text."""
    from itertools import islice

    import numpy as np
    from litellm_energy_router.profiling.routerbench import bundled_files, iter_records

    texts = [r.prompt for f in bundled_files() for r in islice(iter_records([f]), 200)]
    assert len(texts) >= 300
    err = np.array([abs(estimate_prompt_tokens(t) - count_prompt_tokens(t)) / count_prompt_tokens(t) for t in texts])
    assert np.median(err) < 0.02 and np.percentile(err, 90) < 0.10, np.percentile(err, [50, 90, 99])
    assert estimate_prompt_tokens("") == 0
    for t in TEXTS[1:]:
        n = estimate_prompt_tokens(t)
        assert 1 <= n <= 2 * len(t.encode("utf-8", "replace")) and isinstance(n, int)
    assert estimate_prompt_tokens("word " * 20_000) > 10 * estimate_prompt_tokens("word " * 1_000) > 0


def test_the_estimate_is_its_documented_linear_model_of_the_byte_class_features():
    """The served estimate (one bincount of byte class and run start, dotted with the fused weights in units of 1e-4)
    is ``token_features(text) · _EST_W`` computed exactly, rounded half to even, at least 1, on any non-empty text:
    every byte class, run class and first byte, and sums that land on a half token (a float sum put ``Z99\\n9_9_`` at
    7.4999… and rounded it down)."""
    from fractions import Fraction
    from itertools import islice

    from litellm_energy_router.profiling.routerbench import bundled_files, iter_records

    from litellm_energy_router.tokens import _EST_W, token_features

    w = [Fraction(str(x)) for x in _EST_W.tolist()]
    texts = [r.prompt for f in bundled_files() for r in islice(iter_records([f]), 100)]
    texts += [*TEXTS, "a", "A", "7", " ", "\n", ",", "é", "日本語", "\ud800", "aB3 \n\t,.é日" * 7, "x" * 9000]
    texts += ["Z99\n9_9_", "a \ud800,Z12€  _-!"]
    for t in filter(None, texts):  # "" is 0 tokens
        exact = sum(int(c) * x for c, x in zip(token_features(t).tolist(), w))
        assert estimate_prompt_tokens(t) == max(round(exact), 1), t[:40]
