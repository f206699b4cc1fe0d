"""Locality-sensitive hashing over MinHash signatures: bands, candidate pairs, parameter choice.

Two documents of Jaccard similarity s share at least one of b bands of r rows with probability
P(s) = 1 - (1 - s^r)^b. `choose_bands` picks (b, r), b·r ≤ num_perm, minimizing the
weighted area of false positives (P below the threshold) plus false negatives (1 - P above
it). Candidate pairs are then verified by true Jaccard, so false positives only cost time,
and the default weighs misses 9:1: recall matters, and verification removes the rest.

Candidates come from sorting each band's hashes, never from a dict of buckets: documents with
equal band hash form a run, and each run yields its chain (consecutive members) and its star
(every member with the run's first). That is at most 2(m-1) pairs for a run of m, not m², and
keeps every member connected, so clustering still sees the whole bucket.
"""

from __future__ import annotations

import functools

import numpy as np

FNV_PRIME = np.uint64(0x100000001B3)


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int):
    return 1.0 - (1.0 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


@functools.lru_cache(maxsize=64)
def choose_bands(threshold: float, num_perm: int, fn_weight: float = 0.9) -> tuple[int, int]:
    """(bands, rows) minimizing (1-w)·false-positive area + w·false-negative area.

    The areas of all ~700 layouts (128 permutations) come from one array each, a row per layout:
    ~7 ms, where a trapezoid per layout took ~17 ms, paid by every worker that hashes."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be between 0 and 1, not {threshold}")
    layouts = [(bands, rows) for bands in range(1, num_perm + 1) for rows in range(1, num_perm // bands + 1)]
    bands, rows = (np.array(column, dtype=np.float64)[:, None] for column in zip(*layouts))
    below = np.linspace(0.0, threshold, 512)
    above = np.linspace(threshold, 1.0, 512)
    fp = np.trapezoid(candidate_probability(below, bands, rows), below, axis=1)
    fn = np.trapezoid(1.0 - candidate_probability(above, bands, rows), above, axis=1)
    best, best_cost = (1, 1), float("inf")
    for layout, cost in zip(layouts, ((1.0 - fn_weight) * fp + fn_weight * fn).tolist()):
        if cost < best_cost - 1e-12:  # the first layout that is clearly cheaper, in (bands, rows) order
            best, best_cost = layout, cost
    return best


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64 [n, bands]: each band's `rows` signature values folded into one hash (FNV-1a style).

    All bands fold at once, one row per step: `rows` passes over [n, bands], ~4x faster than a
    pass per signature column."""
    n = signatures.shape[0]
    by_band = signatures[:, :bands * rows].reshape(n, bands, rows)
    out = np.full((n, bands), 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for row in range(rows):
            out ^= by_band[:, :, row]
            out *= FNV_PRIME
    return out


def bucket_pairs(hashes: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Candidate pairs [m, 2] (smaller index first) among `docs` that share a hash value.

    `docs` must be increasing; a stable sort keeps each run in document order.
    """
    order = np.argsort(hashes, kind="stable")
    sorted_hashes, sorted_docs = hashes[order], docs[order]
    same = sorted_hashes[1:] == sorted_hashes[:-1]
    if not same.any():
        return np.empty((0, 2), dtype=np.int64)
    run_start = np.maximum.accumulate(np.where(np.concatenate(([False], same)), 0, np.arange(len(order))))
    second = np.flatnonzero(same) + 1
    chain = np.stack([sorted_docs[second - 1], sorted_docs[second]], axis=1)
    star = np.stack([sorted_docs[run_start[second]], sorted_docs[second]], axis=1)
    return np.concatenate([chain, star[run_start[second] != second - 1]])


def unique_pairs(pairs: np.ndarray, num_docs: int) -> np.ndarray:
    """Distinct pairs, sorted, as [m, 2] int64."""
    if len(pairs) == 0:
        return pairs.reshape(0, 2).astype(np.int64)
    keys = np.unique(pairs[:, 0].astype(np.int64) * num_docs + pairs[:, 1])
    return np.stack([keys // num_docs, keys % num_docs], axis=1)
