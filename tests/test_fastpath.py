"""The lean slot-logit forward equals the Hugging Face forward it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litellm_energy_router.router.fastpath import SlotScorer, build_slot_scorer
from litellm_energy_router.router.model import RouterModel, compute_slot_logits

TEXTS = ["Give a proof about rivers number 3", "Tell me about bread", "hi", "x " * 3000, "proof " * 40 + "?"]


def test_fast_scorer_matches_hf_forward_on_a_checkpoint(planted_ckpt):
    m = RouterModel(planted_ckpt)
    assert m.scorer is not None
    tasks = [None, "synthetic", None, "other", None]
    ref = compute_slot_logits(m.model, m.layout, TEXTS, tasks)  # HF forward
    np.testing.assert_allclose(m.slot_logits(TEXTS, tasks), ref, atol=1e-4)  # one left-padded batch
    one = np.stack([m.slot_logits([t], [k])[0] for t, k in zip(TEXTS, tasks)])
    np.testing.assert_allclose(one, ref, atol=1e-4)
    assert RouterModel(planted_ckpt, fast=False).scorer is None


@pytest.mark.parametrize("layers,heads,kv", [(2, 4, 2), (3, 4, 4)])
def test_fast_scorer_matches_hf_on_deeper_qwen2(layers, heads, kv):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=64,
        tie_word_embeddings=layers == 2,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    k, B, T = 3, 3, 20
    ids = torch.randint(1, 97, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :7] = 0  # left padding
    mask[2, :15] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    ref = (logits[:, -(k + 1) : -1, 5] - logits[:, -(k + 1) : -1, 6]).double().numpy()
    scorer = build_slot_scorer(model, 5, 6)
    assert isinstance(scorer, SlotScorer)
    np.testing.assert_allclose(scorer.slot_logits(ids, mask, k), ref, atol=1e-4)


def test_uncovered_architectures_keep_the_hf_forward():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=4,
    )
    assert build_slot_scorer(Qwen2ForCausalLM(cfg), 1, 2) is None
    assert build_slot_scorer(torch.nn.Linear(2, 2), 1, 2) is None
