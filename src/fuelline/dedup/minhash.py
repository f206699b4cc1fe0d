"""MinHash signatures: a numba kernel and a plain-Python reference that gives the same bits.

Shingles are n-grams of *symbols*: Unicode code points for character shingles (CJK text has no
spaces, so splitting on whitespace would make a whole line one token), or 64-bit word hashes
for word shingles. A document shorter than n symbols is one shingle of all its symbols.

The hash family is fixed here, not drawn from a library's random generator, so signatures are
stable across versions of numpy and of fuelline:

- shingle hash: FNV-style fold of the n symbols into 64 bits, then the splitmix64 finalizer;
- permutation p: x = top 32 bits of the shingle hash, h_p(x) = (a_p·x + b_p) mod 2^64 >> 32,
  a multiply-add-shift hash (Dietzfelbinger 1996) with odd a_p and b_p from splitmix64(seed).

Cost: one 64-bit multiply-add per shingle and permutation, which numba vectorizes: ~60
shingles × 128 permutations per poem.
"""

from __future__ import annotations

import numpy as np
import xxhash
from numba import njit

from fuelline.text import cjk_shares, words

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def mix64(h: int) -> int:
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK64
    return h ^ (h >> 31)


def splitmix64(state: int) -> tuple[int, int]:
    """(next state, output) of the splitmix64 generator, in Python integers."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    return state, mix64(state)


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) coefficients of the hash family: uint64 arrays, a odd."""
    state, a, b = seed, [], []
    for _ in range(num_perm):
        state, x = splitmix64(state)
        state, y = splitmix64(state)
        a.append(x | 1)
        b.append(y)
    return np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64)


def shingle_hash(symbols: list[int]) -> int:
    h = FNV_OFFSET
    for s in symbols:
        h = ((h ^ s) * FNV_PRIME) & MASK64
    return mix64(h)


def reference_shingles(symbols: list[int], ngram: int) -> set[int]:
    if not symbols:
        return set()
    if len(symbols) < ngram:
        return {shingle_hash(symbols)}
    return {shingle_hash(symbols[i:i + ngram]) for i in range(len(symbols) - ngram + 1)}


def reference_signature(symbols: list[int], ngram: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The signature of one document, computed the slow and obvious way (for tests)."""
    signature = np.full(len(a), 0xFFFFFFFF, dtype=np.uint32)
    for h in reference_shingles(symbols, ngram):
        x = h >> 32
        for p in range(len(a)):
            v = ((int(a[p]) * x + int(b[p])) & MASK64) >> 32
            signature[p] = min(int(signature[p]), v)
    return signature


@njit(cache=True, inline="always")
def finish(h):
    """splitmix64's finalizer (`mix64`), in numba."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(cache=True, inline="always")
def hash_symbols(symbols, start, length):
    """`shingle_hash` of `symbols[start:start + length]`, in numba (any unsigned integer array)."""
    h = np.uint64(FNV_OFFSET)
    for j in range(length):
        h = (h ^ symbols[start + j]) * np.uint64(FNV_PRIME)
    return finish(h)


@njit(cache=True)
def _minhash_kernel(symbols, offsets, ngram, a, b, shingle_offsets, shingles, signatures):
    """Hash every shingle into `shingles` (in document order) and take each permutation's min.

    Permutations are the outer loop so the inner loop is a branch-free min over one
    document's shingles, which LLVM vectorizes; ~650k poems/s on one core.
    """
    keys = np.empty(1024, dtype=np.uint64)  # top 32 bits of the current document's shingles
    for d in range(offsets.shape[0] - 1):
        start, length = offsets[d], offsets[d + 1] - offsets[d]
        first, count = shingle_offsets[d], shingle_offsets[d + 1] - shingle_offsets[d]
        width = min(ngram, length)
        if count > keys.shape[0]:
            keys = np.empty(count, dtype=np.uint64)
        for i in range(count):
            h = hash_symbols(symbols, start + i, width)
            shingles[first + i] = h
            keys[i] = h >> np.uint64(32)
        for p in range(a.shape[0]):
            ap, bp = a[p], b[p]
            low = np.uint64(0xFFFFFFFF)
            for i in range(count):
                low = min(low, (ap * keys[i] + bp) >> np.uint64(32))
            signatures[d, p] = low


def shingle_counts(lengths: np.ndarray, ngram: int) -> np.ndarray:
    """Shingles per document: length - n + 1, at least 1 for a non-empty document."""
    return np.where(lengths > 0, np.maximum(lengths - ngram + 1, 1), 0)


class MinHasher:
    """Shingles and MinHash signatures of texts (already normalized, see `Normalizer`).

    `shingle="auto"` picks per document: characters when at least half of it is CJK, words
    otherwise (a Chinese and an English document share no shingles either way).
    """

    def __init__(self, num_perm: int = 128, ngram: int = 5, shingle: str = "char", seed: int = 1):
        if shingle not in ("char", "word", "auto"):
            raise ValueError(f"shingle must be 'char', 'word' or 'auto', not {shingle!r}")
        if num_perm < 1 or ngram < 1:
            raise ValueError("num_perm and ngram must be at least 1")
        self.num_perm, self.ngram, self.shingle, self.seed = num_perm, ngram, shingle, seed
        self.a, self.b = permutations(num_perm, seed)

    def symbols(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All documents' symbols back to back (uint64), and the offsets where each starts.

        The batch's code points come from one encode, and "auto" decides on all of them at once
        (`cjk_shares`); only documents shingled by words are looked at one by one, and the runs of
        code points between them are copied whole: a slice per document of a 50,000-poem shard
        holding a few word-shingled ones (176 empty poems) took ~55 ms, the runs take ~5.
        """
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        code_points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        by_chars = (cjk_shares(code_points, offsets) >= 0.5 if self.shingle == "auto"
                    else np.full(len(texts), self.shingle == "char"))
        if by_chars.all():
            return code_points.astype(np.uint64), offsets
        pieces, run_start = [], 0  # the code points since the last document shingled by words
        for i in np.flatnonzero(~by_chars).tolist():
            pieces.append(code_points[offsets[run_start]:offsets[i]])
            pieces.append(np.array([xxhash.xxh3_64_intdigest(w.encode()) for w in words(texts[i])], dtype=np.uint64))
            lengths[i] = len(pieces[-1])
            run_start = i + 1
        pieces.append(code_points[offsets[run_start]:])
        np.cumsum(lengths, out=offsets[1:])
        return np.concatenate(pieces, dtype=np.uint64), offsets

    def signatures_and_shingles(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(signatures uint32 [n, num_perm], shingle hashes uint64, their per-document offsets).

        Shingle hashes are in document order, with repeats; `jaccard_pairs` sorts what it compares.
        """
        flat, offsets = self.symbols(texts)
        shingle_offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(shingle_counts(np.diff(offsets), self.ngram), out=shingle_offsets[1:])
        shingles = np.empty(shingle_offsets[-1], dtype=np.uint64)
        signatures = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        _minhash_kernel(flat, offsets, self.ngram, self.a, self.b, shingle_offsets, shingles, signatures)
        return signatures, shingles, shingle_offsets

    def signatures(self, texts: list[str]) -> np.ndarray:
        return self.signatures_and_shingles(texts)[0]

    def reference(self, text: str) -> np.ndarray:
        """`reference_signature` of one text, with this hasher's symbols and permutations."""
        flat, _ = self.symbols([text])
        return reference_signature([int(s) for s in flat], self.ngram, self.a, self.b)
