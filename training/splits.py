"""Splits of the tournament table's queries **by query**: a query (and its near duplicates) is never in both train
and test. :func:`kfold` (stratified by a group such as the task), :func:`holdout_split` (a stable hash, so a query
keeps its side as the table grows), :func:`near_duplicate_groups` (templated prompts grouped). numpy (scipy's
sparse matrices for the near-duplicate pass) only."""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

import numpy as np


def kfold(
    ids: Sequence[str], k: int = 5, *, seed: int = 0, groups: Sequence[str] | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` (train_idx, test_idx) pairs over positions of ``ids`` (query ids), split by query.

    Every query is in exactly one test fold. Duplicate ids stay together (rows of the same query never
    straddle train and test). ``groups`` (e.g. tasks) stratifies: each group is spread evenly over the
    folds. Deterministic in ``seed``.
    """
    ids = np.asarray(list(ids), dtype=object)
    uniq, inv = np.unique(ids.astype(str), return_inverse=True)
    if k < 2 or k > len(uniq):
        raise ValueError(f"folds={k}: need 2 <= folds <= number of queries ({len(uniq)})")
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(uniq), dtype=np.int64)
    if groups is None:
        strata = [np.arange(len(uniq))]
    else:
        g = np.asarray(list(groups), dtype=object).astype(str)
        first = np.zeros(len(uniq), dtype=np.int64)
        first[inv[::-1]] = np.arange(len(ids))[::-1]  # first row of each unique query
        ug = g[first]
        strata = [np.flatnonzero(ug == name) for name in sorted(set(ug.tolist()))]
    offset = 0
    for members in strata:
        perm = rng.permutation(members)
        fold_of[perm] = (np.arange(len(perm)) + offset) % k
        offset += len(perm)  # continue round-robin so small strata do not all land in fold 0
    row_fold = fold_of[inv]
    return [(np.flatnonzero(row_fold != f), np.flatnonzero(row_fold == f)) for f in range(k)]


_WORD = re.compile(r"[a-z0-9]+")


def near_duplicate_groups(
    texts: Sequence[str | None],
    ids: Sequence[str],
    tasks: Sequence[str] | None = None,
    *,
    threshold: float = 0.8,
    max_size: int = 20,
) -> np.ndarray:
    """One group key per row: rows whose queries are near-duplicates share a key (the smallest query id of
    the group), so a split on these keys never puts two near-duplicates on opposite sides.

    Two queries (the block after the prompt's last blank line, lower-cased words) are near-duplicates
    when the Jaccard similarity of their word sets is >= ``threshold``; groups are the connected
    components. Only rows of the same task (when ``tasks`` is given) are compared. WinoGrande is built
    from such twins (one word changed, the answer flipped), which a split by query alone spreads over
    train and test. A component larger than ``max_size`` rows (templated traffic chaining through shared
    words) is not a twin set: its rows keep their own ids, so no split degenerates, except that identical queries
    (the same words in the same order, one task) always share a key: a popular prompt asked hundreds of times
    (each production request its own query id) never straddles the split.
    """
    from scipy.sparse import coo_matrix, csr_matrix
    from scipy.sparse.csgraph import connected_components

    from .embed import query_block

    ids = [str(i) for i in ids]
    n = len(ids)
    if n == 0:
        return np.array([], dtype=object)
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    words = [set(_WORD.findall(query_block(t).lower())) for t in texts]
    task_arr = np.asarray(list(tasks) if tasks is not None else [""] * n, dtype=object).astype(str)
    for task in sorted(set(task_arr.tolist())):
        rows = np.flatnonzero(task_arr == task)
        vocab: dict[str, int] = {}
        indptr, indices = [0], []
        for i in rows:
            indices.extend(vocab.setdefault(w, len(vocab)) for w in words[i])
            indptr.append(len(indices))
        B = csr_matrix(
            (np.ones(len(indices), dtype=np.float32), indices, indptr), shape=(len(rows), max(len(vocab), 1))
        )
        inter = (B @ B.T).tocoo()
        size = np.asarray(B.sum(axis=1)).ravel()
        keep = inter.row < inter.col
        r, c, v = inter.row[keep], inter.col[keep], inter.data[keep]
        union = size[r] + size[c] - v
        hit = (union > 0) & (v >= threshold * np.maximum(union, 1))
        pairs.append((rows[r[hit]], rows[c[hit]]))
    a = np.concatenate([p[0] for p in pairs]).astype(np.int64)
    b = np.concatenate([p[1] for p in pairs]).astype(np.int64)
    _, label = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    key: dict[int, str] = {}
    for i, comp in enumerate(label.tolist()):
        key[comp] = min(key.get(comp, ids[i]), ids[i])
    count = np.bincount(label)
    same: dict[tuple[str, str], str] = {}  # (task, the query block as words): the smallest id of identical queries
    blocks = [(task_arr[i], " ".join(query_block(t).lower().split())) for i, t in enumerate(texts)]
    for i, b in enumerate(blocks):
        same[b] = min(same.get(b, ids[i]), ids[i])
    return np.array(
        [key[comp] if count[comp] <= max_size else same[blocks[i]] for i, comp in enumerate(label.tolist())],
        dtype=object,
    )


def holdout_split(
    ids: Sequence[str], test_fraction: float = 0.2, *, salt: str = "holdout", groups: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, test_idx) by a stable hash of each query id: a held-out query stays held out as the
    table grows, so a held-out set used to compare checkpoints never leaks into later training.

    ``groups`` (e.g. :func:`near_duplicate_groups`, whose key is the group's smallest query id): rows
    take the side of their group key's hash, so near-duplicates never straddle the split and the
    held-out share stays ``test_fraction`` of the groups. A group moves only when a later query with a
    smaller id joins it; a gate comparing checkpoints on the new held-out set then at worst judges the
    serving checkpoint on queries it trained on, which favours keeping it (never a false promotion).
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction}: must be in (0, 1)")
    keys = [str(i) for i in ids] if groups is None else [str(g) for g in groups]
    if len(keys) != len(ids):
        raise ValueError(f"groups has {len(keys)} entries for {len(ids)} ids")
    u = np.array([int.from_bytes(hashlib.sha256(f"{salt}:{k}".encode()).digest()[:8], "big") / 2**64 for k in keys])
    test = u < test_fraction
    return np.flatnonzero(~test), np.flatnonzero(test)
