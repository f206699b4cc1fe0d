"""The hidden states of a trainer's record made from a cache sample (SpecForge's, speculators'): bf16,
fp8 widened with its scales, and refused when they hold NaN or Inf.

Both trainers would train on a non-finite state (SpecForge's preparation skips such a sample with a
printed warning and checks NaN only; speculators' offline files are not checked when read), so
every record either bridge returns or an export writes passes `finite`.
"""

from __future__ import annotations

import os

import torch

from fuelline.cache.dataset import widened
from fuelline.formats.target_cache import CacheFormatError


class NonFiniteState(CacheFormatError):
    """A hidden state holding NaN or Inf: a trainer would train on it."""

    def __init__(self, cache: str | os.PathLike, sample: int, record_id: str | None, key: str, count: int):
        self.cache, self.sample, self.record_id, self.key, self.count = os.fspath(cache), sample, record_id, key, count
        named = f" (record id {record_id!r})" if record_id is not None else ""
        super().__init__(cache, f"sample {sample}{named}: {key} holds {count:,} NaN or Inf value(s) "
                                "(the target overflowed there)")

    def __reduce__(self):
        return type(self), (self.cache, self.sample, self.record_id, self.key, self.count)


def bf16_state(sample: dict, name: str, fresh: bool) -> torch.Tensor:
    """One hidden-state field in bf16 (`widened`); `fresh`: in storage of its own, never a view of the
    cache (torch.save writes a view's whole storage)."""
    value = widened(sample, name).to(torch.bfloat16)
    return value.clone() if fresh and value is sample[name] else value


def finite(value: torch.Tensor, sample: dict, *, where: tuple[str | os.PathLike, int], key: str) -> torch.Tensor:
    """`value` if it holds no NaN or Inf, else `NonFiniteState` naming (cache, sample index) `where`,
    the sample's record id and `key`. A NaN or Inf makes the sum non-finite; only then are the values
    counted (a finite tensor's sum can overflow too). The sum is a thirtieth of the cost of isfinite
    over every value."""
    if not bool(torch.isfinite(value.sum())) and (bad := int((~torch.isfinite(value)).sum())):
        raise NonFiniteState(where[0], where[1], sample.get("record_id"), key, bad)
    return value
