"""A bijective permutation of [0, n) computed on the fly: no index file, no epoch × n grid.

A 4-round Feistel network over the smallest even number of bits covering n permutes
[0, 2^bits); values that land outside [0, n) are mapped again until they land inside (cycle
walking), which keeps it a bijection of [0, n). Since 2^bits < 4n, fewer than 4 rounds of
walking are expected. Vectorized over numpy arrays: a batch of 32 positions costs a few µs.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 4
MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, on uint64 arrays."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError("a permutation needs at least one element")
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.low_mask = np.uint64((1 << self.half) - 1)
        with np.errstate(over="ignore"):
            self.keys = _mix(np.arange(1, ROUNDS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                             + np.uint64(seed & 0xFFFFFFFFFFFFFFFF))

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(self.half), x & self.low_mask
        with np.errstate(over="ignore"):
            for key in self.keys:
                left, right = right, left ^ (_mix(right ^ key) & self.low_mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, positions) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"position {int(x.max())} outside the permutation of {self.n}")
        y = self._rounds(x)
        outside = y >= self.n
        while outside.any():
            y[outside] = self._rounds(y[outside])
            outside = y >= self.n
        return y.astype(np.int64)
