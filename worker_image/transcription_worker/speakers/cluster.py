"""Grouping window embeddings by speaker, with no speaker count given.

Agglomerative clustering with average linkage on cosine similarity: start with every window
alone, repeatedly join the two groups whose windows are most similar on average, and stop
when no two groups reach `threshold`; the speaker count is the number of groups left. It
runs as a nearest-neighbour chain (O(n^2) time and memory: an hour of speech is about 4,800
windows, 90 MB of similarities), which gives the same groups as the textbook loop because
average linkage never makes a later join more similar than an earlier one.

Groups of fewer than `min_size` windows (a cough, a window straddling two voices) are then
given to the group whose mean they are most similar to, unless every group is that small.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Labels = npt.NDArray[np.int64]

# Measured on the benchmark's conversations (`python -m bench diarization-sweep`): 0.40 to
# 0.50 finds every clean conversation's speaker count.
THRESHOLD = 0.45
MIN_SIZE = 3


def _check(embeddings: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be (windows, dimensions), not {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("embeddings must be finite")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x / np.maximum(norms, 1e-12))


def average_linkage(embeddings: npt.NDArray[Any], threshold: float = THRESHOLD) -> Labels:
    """A group number per window (0, 1, ... in order of first window), joining groups
    while their mean pairwise cosine similarity is at least `threshold`."""
    x = _check(embeddings)
    n = x.shape[0]
    parent = np.arange(n)
    for a, b, similarity in _joins(x):
        if similarity >= threshold:
            parent[parent == b] = a
    return _renumbered(parent)


def _joins(x: npt.NDArray[np.float64]) -> list[tuple[int, int, float]]:
    """Every join of the full average-linkage tree as (kept, absorbed, similarity), the
    groups named by one of their windows, in the nearest-neighbour chain's order. The joins
    at or above any threshold form that threshold's groups whatever their order, since a
    group joined below it can only join others below it too."""
    n = x.shape[0]
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)
    size = np.ones(n)
    active = np.ones(n, dtype=bool)
    chain: list[int] = []
    joins: list[tuple[int, int, float]] = []
    while len(joins) < n - 1:
        if not chain:
            chain.append(int(np.flatnonzero(active)[0]))
        a = chain[-1]
        row = np.where(active, sim[a], -np.inf)
        row[a] = -np.inf
        b = int(np.argmax(row))
        if len(chain) > 1 and row[chain[-2]] >= row[b]:
            b = chain[-2]
        if len(chain) < 2 or b != chain[-2]:
            chain.append(b)
            continue
        del chain[-2:]
        joins.append((a, b, float(row[b])))
        merged = (size[a] * sim[a] + size[b] * sim[b]) / (size[a] + size[b])
        sim[a], sim[:, a] = merged, merged
        sim[a, a] = -np.inf
        sim[b], sim[:, b] = -np.inf, -np.inf
        active[b] = False
        size[a] += size[b]
    return joins


def _renumbered(labels: npt.NDArray[Any]) -> Labels:
    """Labels renamed 0, 1, ... in order of first window."""
    order: dict[int, int] = {}
    for v in labels.tolist():
        order.setdefault(int(v), len(order))
    return np.array([order[int(v)] for v in labels.tolist()], dtype=np.int64)


def absorb_small(embeddings: npt.NDArray[Any], labels: Labels, min_size: int = MIN_SIZE) -> Labels:
    """`labels` with groups under `min_size` windows moved to the most similar larger group
    (by cosine to its mean), renumbered 0, 1, ... in order of first window."""
    x = _check(embeddings)
    if x.shape[0] != labels.shape[0]:
        raise ValueError(f"{x.shape[0]} embeddings but {labels.shape[0]} labels")
    groups, counts = np.unique(labels, return_counts=True)
    big = groups[counts >= min_size]
    out = labels.copy()
    if big.size and big.size < groups.size:
        means = np.stack([x[labels == g].mean(axis=0) for g in big])
        means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
        small = ~np.isin(labels, big)
        out[small] = big[np.argmax(x[small] @ means.T, axis=1)]
    return _renumbered(out)


def cluster(
    embeddings: npt.NDArray[Any], threshold: float = THRESHOLD, min_size: int = MIN_SIZE
) -> Labels:
    """Speaker groups of window embeddings: average linkage, then small groups absorbed."""
    return absorb_small(embeddings, average_linkage(embeddings, threshold), min_size)


def centroids(embeddings: npt.NDArray[Any], labels: Labels) -> npt.NDArray[np.float32]:
    """(groups, dimensions): each group's unit mean embedding, in group order."""
    x = _check(embeddings)
    count = int(labels.max()) + 1 if labels.size else 0
    means = np.stack([x[labels == g].mean(axis=0) for g in range(count)]) if count else x[:0]
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return np.asarray(means, dtype=np.float32)
