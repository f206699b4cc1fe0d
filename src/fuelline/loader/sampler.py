"""Deterministic, shardable, exactly resumable order of training windows.

Epoch e of one rank is its stream positions j in [e·E, (e+1)·E), E = batches per epoch × batch
size; position j is window `perm_e((j - e·E)·world_size + rank)`, where `perm_e` is a Feistel
permutation of the n windows keyed by (seed, epoch): ranks interleave, never overlap. Nothing is precomputed per epoch:
a block of 65,536 permuted positions is computed when first needed (~1 ms) and reused.

The state is a handful of integers (`position` is all that changes). The sampler runs in the
DataLoader's main process, which hands batches to workers and reassembles them in order, so
`ResumableLoader` counts the batches actually delivered: resuming skips exactly those, whatever
the number of workers and however far they had prefetched.
"""

from __future__ import annotations

import numpy as np

from fuelline.loader.permutation import FeistelPermutation
from fuelline.pipeline.options import check_number

STATE_VERSION = 1
BLOCK = 1 << 16


class WindowSampler:
    """A batch sampler: yields lists of window indices, one epoch's worth per iteration."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        for name, value, low in (("batch_size", batch_size, 1), ("world_size", world_size, 1), ("rank", rank, 0),
                                 ("seed", seed, None)):
            check_number(name, value, min=low)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        if num_samples < world_size * batch_size:
            raise ValueError(f"{num_samples} samples cannot fill a batch of {batch_size} on {world_size} ranks")
        self.num_samples, self.batch_size, self.shuffle, self.seed = num_samples, batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.position = 0
        self.tracked_by_loader = False
        self._block: tuple[int, int, np.ndarray] | None = None  # (epoch, first index, permuted block)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.num_samples // (self.world_size * self.batch_size)

    @property
    def epoch_length(self) -> int:
        """Stream positions per epoch on this rank (the remainder that fills no batch is dropped)."""
        return len(self) * self.batch_size

    def indices(self, start: int, count: int) -> np.ndarray:
        """Window indices at this rank's stream positions start..start+count-1."""
        epochs, within = np.divmod(np.arange(start, start + count, dtype=np.int64), self.epoch_length)
        offsets = within * self.world_size + self.rank
        if not self.shuffle:
            return offsets
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            chosen = epochs == epoch
            out[chosen] = self._permuted(epoch, offsets[chosen])
        return out

    def _permutation(self, epoch: int) -> FeistelPermutation:
        return FeistelPermutation(self.num_samples, self.seed * 1_000_003 + epoch)

    def _permuted(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        first = int(offsets.min()) // BLOCK * BLOCK
        if int(offsets.max()) >= first + BLOCK:  # a request wider than a block: compute it directly
            return self._permutation(epoch)(offsets)
        if self._block is None or self._block[:2] != (epoch, first):
            span = np.arange(first, min(first + BLOCK, self.num_samples))
            self._block = (epoch, first, self._permutation(epoch)(span))
        return self._block[2][offsets - first]

    def __iter__(self):
        """The batches from `position` to the end of its epoch. The DataLoader draws batches ahead of
        what it delivers, so `position` is not moved here while a ResumableLoader tracks it;
        used bare, the sampler moves it on by a whole epoch when the epoch is exhausted."""
        start = self.position
        end = (start // self.epoch_length + 1) * self.epoch_length  # a resumed epoch is finished, not redone
        for first in range(start, end, self.batch_size):
            yield self.indices(first, self.batch_size).tolist()
        if not self.tracked_by_loader:
            self.position = end

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_samples": self.num_samples, "batch_size": self.batch_size,
                "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')} is not {STATE_VERSION}")
        for key in ("seed", "shuffle", "num_samples", "batch_size", "rank", "world_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"cannot resume: the saved state has {key}={state[key]!r}, this sampler "
                                 f"{getattr(self, key)!r}")
        self.position = state["position"]
