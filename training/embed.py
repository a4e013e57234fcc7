"""Query embeddings for training and the learned baselines: the encoder of
:mod:`litellm_energy_router.router.encoder` (offline all-MiniLM-L6-v2, query block only) behind a disk
cache keyed by the SHA-256 of the embedded text.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np

from litellm_energy_router.router.encoder import Embedder, MiniLMEmbedder, query_block

__all__ = [
    "CachedEmbedder",
    "Embedder",
    "MiniLMEmbedder",
    "default_cache_dir",
    "default_embedder",
    "embed_queries",
    "query_block",
    "use_cache_dir",
]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/litellm-energy-router/embeddings`` (default ``~/.cache/...``)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "litellm-energy-router"
    return root / "embeddings"


class CachedEmbedder:
    """Wraps an :class:`Embedder` with a disk cache: one ``.npz`` shard per call that computed something
    (keys = SHA-256 of the text, written atomically; numpy arrays only, never pickled), all shards read
    on first use. Past ``max_shards`` shards they are merged into one, so a cache filled by many
    retrains stays a few files."""

    max_shards = 32

    def __init__(self, inner: Embedder, cache_dir: str | Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.dir = self.dir / re.sub(r"[^A-Za-z0-9_.-]", "_", inner.name)
        self._mem: dict[str, np.ndarray] | None = None
        self._files: set[Path] = set()  # shards whose keys are all in ``_mem`` (the only ones a merge removes)

    def _load(self) -> dict[str, np.ndarray]:
        if self._mem is None:
            self._mem = {}
            for f in sorted(self.dir.glob("*.npz")) if self.dir.exists() else []:
                try:
                    with np.load(f, allow_pickle=False) as z:
                        for k, v in zip(z["keys"], z["vecs"]):
                            self._mem[str(k)] = v
                    self._files.add(f)
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
                shard = self.dir / f"{uuid.uuid4().hex}.npz"
                tmp.replace(shard)
                self._files.add(shard)
                self._compact()
            except OSError:
                pass  # read-only cache: still correct, just slower next time
        if not keys:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([mem[k] for k in keys])

    def _compact(self) -> None:
        if len(list(self.dir.glob("*.npz"))) <= self.max_shards or self._mem is None:
            return
        keys = sorted(self._mem)
        tmp = self.dir / f".{uuid.uuid4().hex}.tmp.npz"
        np.savez(tmp, keys=np.array(keys), vecs=np.stack([self._mem[k] for k in keys]))
        merged = self.dir / f"{uuid.uuid4().hex}.npz"
        tmp.replace(merged)
        for f in self._files:  # every key of these is in the merged shard; shards another process
            f.unlink(missing_ok=True)  # wrote since are left alone
        self._files = {merged}


_DEFAULT: CachedEmbedder | None = None


def default_embedder() -> CachedEmbedder:
    """The process-wide cached MiniLM embedder."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CachedEmbedder(MiniLMEmbedder())
    return _DEFAULT


def use_cache_dir(cache_dir: str | Path) -> CachedEmbedder:
    """Make the process-wide embedder cache its vectors under ``cache_dir`` (``retrain`` points it at
    ``<versions_dir>/embed-cache`` unless configured), so a query is embedded once across retrains."""
    global _DEFAULT
    inner = _DEFAULT.inner if _DEFAULT is not None else MiniLMEmbedder()
    _DEFAULT = CachedEmbedder(inner, cache_dir)
    return _DEFAULT


def embed_queries(texts: Sequence[str | None], embedder: Embedder | None = None) -> np.ndarray:
    """Embeddings ``float32[n, dim]`` of the query blocks of ``texts``."""
    emb = embedder if embedder is not None else default_embedder()
    return emb.embed([query_block(t) for t in texts])
