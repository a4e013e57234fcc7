"""A lean forward pass for the slot logits of Qwen2-architecture routers (the ``tiny`` backbone).

The Hugging Face forward spends most of a one-prompt pass on wrappers (mask building, rotary tables,
output capturing, a full hidden-state pipeline). :class:`SlotScorer` computes the same numbers with a
few fused matrix products over the model's own weights:

* q/k/v and gate/up projections are fused into one matrix each; rotary cos/sin are precomputed;
* the last layer computes keys/values for every position but queries, the MLP and the final norm only
  for the K slot positions;
* the head is one vector per model, ``W[yes] − W[no]``, instead of the whole vocabulary.

Numerically it is the HF forward (float32, same order of operations up to fusion); the tests check it
against :func:`~litellm_energy_router.router.model.compute_slot_logits`. Other architectures, or a
Qwen2 config it does not cover (sliding window, scaled rotary), keep the HF forward
(:func:`build_slot_scorer` returns ``None``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _supported(cfg: Any) -> bool:
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (
        getattr(cfg, "model_type", None) == "qwen2"
        and not getattr(cfg, "use_sliding_window", False)
        and rope.get("rope_type", "default") == "default"
        and getattr(cfg, "hidden_act", "silu") == "silu"
    )


def build_slot_scorer(model: Any, yes_id: int, no_id: int) -> "SlotScorer | None":
    """A :class:`SlotScorer` for ``model`` when its architecture is covered, else ``None``."""
    try:
        if not _supported(model.config):
            return None
        return SlotScorer(model, yes_id, no_id)
    except (AttributeError, KeyError, TypeError):
        return None


class SlotScorer:
    """``logit(yes) − logit(no)`` at the last K+1 positions but one, from the weights of a Qwen2 LM."""

    def __init__(self, model: Any, yes_id: int, no_id: int) -> None:
        import torch

        cfg = model.config
        self.torch = torch
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = float(cfg.rms_norm_eps)
        base = model.model
        with torch.no_grad():
            self.embed = base.embed_tokens.weight.detach().clone()
            self.layers = []
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach().clone()
                qkv_b = torch.cat([_bias(a.q_proj), _bias(a.k_proj), _bias(a.v_proj)]).detach().clone()
                self.layers.append(
                    {
                        "ln1": layer.input_layernorm.weight.detach().clone(),
                        "ln2": layer.post_attention_layernorm.weight.detach().clone(),
                        "qkv_w": qkv_w,
                        "qkv_b": qkv_b,
                        "q_w": a.q_proj.weight.detach().clone(),
                        "q_b": _bias(a.q_proj).detach().clone(),
                        "kv_w": qkv_w[self.n_heads * self.head_dim :].clone(),
                        "kv_b": qkv_b[self.n_heads * self.head_dim :].clone(),
                        "o_w": a.o_proj.weight.detach().clone(),
                        "o_b": None if a.o_proj.bias is None else a.o_proj.bias.detach().clone(),
                        "gu_w": torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach().clone(),
                        "down_w": m.down_proj.weight.detach().clone(),
                    }
                )
            self.norm = base.norm.weight.detach().clone()
            head = model.get_output_embeddings()
            self.head = (head.weight[yes_id] - head.weight[no_id]).detach().clone()
            self.head_b = (
                float(head.bias[yes_id] - head.bias[no_id]) if getattr(head, "bias", None) is not None else 0.0
            )
            dim = self.head_dim
            theta = float(cfg.rope_parameters["rope_theta"])
            inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            pos = torch.arange(int(cfg.max_position_embeddings), dtype=torch.float)
            emb = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)
            self.cos, self.sin = emb.cos(), emb.sin()
        self.scaling = self.head_dim**-0.5

    def _rms(self, x: Any, w: Any) -> Any:
        return w * (x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @staticmethod
    def _rot(x: Any, cos: Any, sin: Any) -> Any:
        h = x.shape[-1] // 2
        import torch

        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def slot_logits(self, ids: Any, mask: Any, k: int) -> np.ndarray:
        """``ids``/``mask`` [B, T] left-padded (long); returns [B, k] float64."""
        torch = self.torch
        F = torch.nn.functional
        B, T = ids.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        rep = H // KV
        with torch.inference_mode():
            pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
            cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [B, 1, T, D]
            valid = mask.bool()
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            # padding keys are masked; a padding query sees itself only (no all-masked rows, no NaN)
            attn_mask = (causal[None] & valid[:, None, :]) | torch.eye(T, dtype=torch.bool)[None]
            attn_mask = attn_mask[:, None]  # [B, 1, T, T]
            x = self.embed[ids]
            last = len(self.layers) - 1
            for li, L in enumerate(self.layers):
                h = self._rms(x, L["ln1"])
                if li < last:
                    qkv = F.linear(h, L["qkv_w"], L["qkv_b"])
                    q, kk, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
                    q = self._rot(q.view(B, T, H, D).transpose(1, 2), cos, sin)
                    qmask, rows = attn_mask, slice(None)
                else:  # only the slot positions (and the token before <er:end>) are read out
                    kvp = F.linear(h, L["kv_w"], L["kv_b"])
                    kk, v = kvp.split([KV * D, KV * D], dim=-1)
                    rows = slice(T - (k + 1), T - 1)
                    q = F.linear(h[:, rows], L["q_w"], L["q_b"]).view(B, k, H, D).transpose(1, 2)
                    q = self._rot(q, cos[:, :, rows], sin[:, :, rows])
                    qmask = attn_mask[:, :, rows]
                kk = self._rot(kk.view(B, T, KV, D).transpose(1, 2), cos, sin)
                v = v.view(B, T, KV, D).transpose(1, 2)
                if rep > 1:
                    kk = kk.repeat_interleave(rep, dim=1)
                    v = v.repeat_interleave(rep, dim=1)
                o = F.scaled_dot_product_attention(q, kk, v, attn_mask=qmask, scale=self.scaling)
                o = F.linear(o.transpose(1, 2).reshape(B, -1, H * D), L["o_w"], L["o_b"])
                x = x[:, rows] + o
                h = self._rms(x, L["ln2"])
                g, u = F.linear(h, L["gu_w"]).chunk(2, dim=-1)
                x = x + F.linear(F.silu(g) * u, L["down_w"])
            z = self._rms(x, self.norm) @ self.head + self.head_b  # [B, k]
        return z.double().numpy()


def _bias(lin: Any) -> Any:
    import torch

    return lin.bias if lin.bias is not None else torch.zeros(lin.out_features)
