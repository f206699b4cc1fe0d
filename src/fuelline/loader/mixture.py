"""Mixtures of token datasets whose weights hold exactly over every prefix of the stream.

Weights become small integers w_d (their exact ratio, as fractions over at most 2^16), W = Σ w_d.
One period of W positions is laid out by smooth weighted round-robin: at each position every
dataset's credit grows by w_d, the one with the most credit is chosen and pays W. A dataset's
credit stays within (-W, W), so after any k positions it has been chosen within one sample of
k·w_d/W times, and after W positions every credit is back at 0: the schedule repeats. So the
dataset at global position k is `schedule[k mod W]` and the number of its samples before k is
`(k div W)·w_d + before[k mod W]`, in closed form: the stream is random-access, the state is
one integer, and each dataset walks through its own Feistel-permuted epochs.
"""

from __future__ import annotations

from fractions import Fraction
from math import lcm

import numpy as np

from fuelline.loader.permutation import FeistelPermutation
from fuelline.loader.sampler import WindowSampler

MAX_DENOMINATOR = 1 << 16


def integer_weights(weights: list[float]) -> np.ndarray:
    """The weights' exact ratio as small integers (0.7, 0.3 → 7, 3). Ratios that need a period
    over 2^16 positions are rounded to parts of 2^16 (largest remainders), an error below 2e-5."""
    if not weights or any(w <= 0 for w in weights):
        raise ValueError(f"mixture weights must be positive, got {weights}")
    total = sum(weights)
    fractions = [Fraction(w / total).limit_denominator(MAX_DENOMINATOR) for w in weights]
    scale = lcm(*(f.denominator for f in fractions))
    if scale <= MAX_DENOMINATOR:
        integers = np.array([int(f * scale) for f in fractions], dtype=np.int64)
    else:
        exact = np.array(weights, dtype=np.float64) / total * MAX_DENOMINATOR
        integers = np.floor(exact).astype(np.int64)
        short = MAX_DENOMINATOR - int(integers.sum())
        integers[np.argsort(integers - exact, kind="stable")[:short]] += 1
    if (integers == 0).any():
        raise ValueError(f"weights {weights} give a dataset less than one sample in {MAX_DENOMINATOR}")
    return integers // np.gcd.reduce(integers)


def smooth_schedule(weights: np.ndarray) -> np.ndarray:
    """One period of the smooth weighted round-robin: the dataset chosen at each position."""
    period = int(weights.sum())
    credit = np.zeros(len(weights), dtype=np.int64)
    schedule = np.empty(period, dtype=np.int64)
    for k in range(period):
        credit += weights
        chosen = int(np.argmax(credit))  # ties: the lowest index
        credit[chosen] -= period
        schedule[k] = chosen
    return schedule


class MixtureDataset:
    """Several datasets as one index space: index = offset of its dataset + its window."""

    def __init__(self, datasets: list):
        self.datasets = datasets
        self.offsets = np.concatenate(([0], np.cumsum([len(d) for d in datasets]))).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitems__(self, indices) -> dict:
        import torch

        indices = np.asarray(indices, dtype=np.int64)
        which = np.searchsorted(self.offsets, indices, side="right") - 1
        parts, order = [], []
        for d in np.unique(which).tolist():
            chosen = np.flatnonzero(which == d)
            parts.append(self.datasets[d].__getitems__((indices[chosen] - self.offsets[d]).tolist()))
            order.append(chosen)
        inverse = torch.from_numpy(np.argsort(np.concatenate(order), kind="stable"))
        return {key: torch.cat([p[key] for p in parts])[inverse] for key in parts[0] if key != "cu_seqlens"}

    def __getitem__(self, index: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}


class MixtureSampler(WindowSampler):
    """A WindowSampler whose positions are spread over datasets by exact weights."""

    def __init__(self, lengths: list[int], weights: list[float], batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        if len(lengths) != len(weights):
            raise ValueError(f"{len(lengths)} datasets but {len(weights)} weights")
        super().__init__(int(sum(lengths)), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.lengths)))
        self.weights = integer_weights(weights)
        self.schedule = smooth_schedule(self.weights)
        # before[d][p]: how often dataset d is chosen in positions 0..p-1 of a period
        self.before = np.stack([np.concatenate(([0], np.cumsum(self.schedule == d)))[:-1]
                                for d in range(len(lengths))])

    def indices(self, start: int, count: int) -> np.ndarray:
        k = np.arange(start, start + count, dtype=np.int64) * self.world_size + self.rank
        periods, phase = np.divmod(k, len(self.schedule))
        datasets = self.schedule[phase]
        counts = periods * self.weights[datasets] + self.before[datasets, phase]
        out = np.empty(count, dtype=np.int64)
        for d in np.unique(datasets).tolist():
            chosen = datasets == d
            epochs, within = np.divmod(counts[chosen], self.lengths[d])
            windows = within.copy()
            if self.shuffle:
                for epoch in np.unique(epochs).tolist():
                    here = epochs == epoch
                    permutation = FeistelPermutation(int(self.lengths[d]), (self.seed * 1_000_003 + epoch) * 31 + d)
                    windows[here] = permutation(within[here])
            out[chosen] = self.offsets[d] + windows
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "weights": self.weights.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("weights") != self.weights.tolist():
            raise ValueError(f"cannot resume: the saved mixture weights {state.get('weights')} differ from "
                             f"{self.weights.tolist()}")
        super().load_state_dict(state)
