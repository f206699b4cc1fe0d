"""64-bit SimHash of the shingle sets MinHash uses, and the exact Hamming search by block tables.

SimHash (Charikar 2002): bit i of a document's hash is the majority vote of bit i of its distinct
shingle hashes (the splitmix64-finalized hashes `MinHasher` makes). A tie (an even number of
shingles, split evenly: 13% of the bits of a 36-shingle poem) takes the bit of the smallest
shingle hash; voting 0 instead left 44% ones and 27% more pairs in the tables below than random
hashes would (now 8%). Two documents differ in a bit with probability θ/π, θ the angle between
their shingle sets as 0/1 vectors, so the Hamming distance estimates cosine similarity, not
Jaccard. For sets of equal size cos θ = 2J/(1+J): at J = 0.85, θ/π = 0.13, so 8.3 of 64 bits differ on average
(standard deviation 2.7) whatever the length of the documents; unrelated documents differ in 32.

Why it is here, and where it loses to MinHash (measured side by side): docs/dedup.md. 64 bits are
a noisy estimate, so a Jaccard threshold needs a large distance: `choose_hamming` takes the
smallest k that finds 80% of the pairs right at the threshold (binomial model,
`find_probability`): k = 10 at 0.85 (MinHash's 11 × 11 bands: 87%), 6 at 0.95.

Candidates within distance k, exactly (Manku, Jain & Das Sarma 2007): split the 64 bits into
B > k blocks. Two hashes at distance ≤ k differ in at most k blocks, so they agree on some
B - k of them; one table per choice of B - k blocks, keyed by those bits, holds every such pair
in one bucket. A table is a counting sort by a hash of the key; in a bucket every pair with
equal key is checked by popcount and kept only in the first table where the keys agree, so no
pair comes out twice. Cost: C(B, k) tables (12 ms each at 376k documents) plus the pairs that
share a bucket, C(B, k) · n² / 2^(bits + 1) for random hashes, bits = 64 (B - k) / B;
`choose_blocks` takes the cheapest B, which never changes the pairs found. At 376k documents,
k = 10: B = 11 (11 tables) 15.2 s, 12 (66) 3.6 s, 13 (286, chosen) 2.6 s, 14 (1001) 6.6 s.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
from numba import njit

from fuelline.dedup.clusters import _distinct_sorted

BITS = 64
FIBONACCI = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: multiplicative hashing of table keys
MAX_BUCKET_BITS = 24
FIND_AT_THRESHOLD = 0.8  # the default distance finds 80% of the pairs right at the threshold
TABLE_COST = 25.0  # building one table, per document, in pair checks (12 ms vs 1.3 ns a pair, 376k docs)


@njit(cache=True)
def _simhash_kernel(shingles, offsets, out):
    """Bit i of out[d]: the majority of bit i over document d's distinct shingles (tie: the smallest's)."""
    votes = np.zeros(BITS, dtype=np.int64)
    for d in range(offsets.shape[0] - 1):
        distinct = _distinct_sorted(shingles[offsets[d]:offsets[d + 1]])
        out[d] = 0
        if distinct.shape[0] == 0:
            continue
        votes[:] = 0
        for h in distinct:
            for bit in range(BITS):
                votes[bit] += (h >> np.uint64(bit)) & np.uint64(1)
        value = np.uint64(0)
        for bit in range(BITS):
            one = np.uint64(1) << np.uint64(bit)
            twice = 2 * votes[bit]
            if twice > distinct.shape[0] or (twice == distinct.shape[0] and distinct[0] & one):
                value |= one
        out[d] = value


def simhashes(shingles: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """uint64 [n]: the SimHash of each document's distinct shingle hashes (`offsets`: n + 1)."""
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    _simhash_kernel(shingles, offsets, out)
    return out


def find_probability(similarity: float | np.ndarray, hamming: int) -> np.ndarray:
    """Chance that two equal-size sets of Jaccard similarity J end within `hamming` bits."""
    j = np.asarray(similarity, dtype=np.float64)
    p = np.arccos(np.clip(2 * j / (1 + j), -1.0, 1.0)) / np.pi
    return sum(math.comb(BITS, d) * p ** d * (1 - p) ** (BITS - d) for d in range(hamming + 1))


@functools.lru_cache(maxsize=64)
def choose_hamming(threshold: float, chance: float = FIND_AT_THRESHOLD) -> int:
    """The smallest distance at which a pair right at the threshold is found with this chance."""
    return next(k for k in range(BITS) if find_probability(threshold, k) >= chance)


def table_masks(blocks: int, hamming: int) -> np.ndarray:
    """uint64 [C(blocks, hamming)]: the bits of each choice of blocks - hamming blocks."""
    if not 0 <= hamming < blocks <= BITS:
        raise ValueError(f"need 0 <= hamming < blocks <= {BITS}, not hamming={hamming}, blocks={blocks}")
    edges = [BITS * b // blocks for b in range(blocks + 1)]
    block_bits = [((1 << (edges[b + 1] - edges[b])) - 1) << edges[b] for b in range(blocks)]
    return np.array([sum(block_bits[b] for b in chosen)
                     for chosen in itertools.combinations(range(blocks), blocks - hamming)], dtype=np.uint64)


@functools.lru_cache(maxsize=64)
def choose_blocks(hamming: int, num_docs: int, max_tables: int = 5_000) -> int:
    """The number of blocks B > hamming with the least expected work (see the module docstring)."""
    best, best_cost = hamming + 1, float("inf")
    for blocks in range(hamming + 1, BITS + 1):
        tables = math.comb(blocks, hamming)
        if tables > max_tables:
            break
        bits = BITS * (blocks - hamming) / blocks
        cost = tables * (TABLE_COST * num_docs + num_docs * (num_docs - 1) / 2 ** (bits + 1))
        if cost < best_cost:
            best, best_cost = blocks, cost
    return best


@njit(cache=True)
def _bucketed(values, docs, mask, bucket_bits):
    """`values` and `docs` grouped by a multiplicative hash of the key `values & mask` (a counting
    sort: one pass, no comparisons), and where each bucket starts. Different keys may share a
    bucket; the caller compares keys."""
    shift = np.uint64(BITS - bucket_bits)
    starts = np.zeros((1 << bucket_bits) + 1, dtype=np.int64)
    for i in range(values.shape[0]):
        starts[((values[i] & mask) * np.uint64(FIBONACCI)) >> shift] += 1
    total = 0
    for b in range(starts.shape[0]):  # counts to starts, shifted: bucket b's next free slot
        starts[b], total = total, total + starts[b]
    grouped_values, grouped_docs = np.empty_like(values), np.empty_like(docs)
    for i in range(values.shape[0]):
        b = ((values[i] & mask) * np.uint64(FIBONACCI)) >> shift
        grouped_values[starts[b]], grouped_docs[starts[b]] = values[i], docs[i]
        starts[b] += 1
    return grouped_values, grouped_docs, starts  # now starts[b] is where bucket b + 1 starts


@njit(cache=True)
def _table_pairs(values, docs, masks, table, hamming, bucket_bits, out, count):
    """Append to `out` the pairs with equal key in table `table`, within `hamming` bits, that
    no earlier table had (so each pair comes out once)."""
    grouped, grouped_docs, ends = _bucketed(values, docs, masks[table], bucket_bits)
    start = 0
    for end in ends:
        for x in range(start, end):
            for y in range(x + 1, end):
                diff = grouped[x] ^ grouped[y]
                if diff & masks[table] or _popcount(diff) > hamming or _seen_before(diff, masks, table):
                    continue
                if count == out.shape[0]:
                    grown = np.empty((2 * count, 2), dtype=np.int64)
                    grown[:count] = out
                    out = grown
                a, b = grouped_docs[x], grouped_docs[y]
                out[count, 0], out[count, 1] = min(a, b), max(a, b)
                count += 1
        start = end
    return out, count


@njit(cache=True, inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@njit(cache=True, inline="always")
def _seen_before(diff, masks, table):
    for t in range(table):
        if diff & masks[t] == 0:
            return True
    return False


def hamming_pairs(values: np.ndarray, docs: np.ndarray, hamming: int, blocks: int = 0,
                  tables: range | None = None) -> np.ndarray:
    """Every pair [m, 2] (smaller document first, sorted) of `docs` whose `values` are within `hamming` bits.

    `blocks`: 0 chooses it (`choose_blocks`); the pairs found never depend on it, only the time.
    `tables`: only the pairs first found by these of the C(blocks, hamming) tables; the pairs of
    disjoint table ranges are disjoint, and all ranges together give every pair once.
    """
    masks = table_masks(blocks or choose_blocks(hamming, len(values)), hamming)
    bucket_bits = max(1, min(MAX_BUCKET_BITS, len(values).bit_length() - 2))  # 2 to 4 documents a bucket
    docs, out, count = np.asarray(docs, dtype=np.int64), np.empty((1024, 2), dtype=np.int64), 0
    for table in tables if tables is not None else range(len(masks)):
        out, count = _table_pairs(values, docs, masks, table, hamming, bucket_bits, out, count)
    pairs = out[:count]
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
