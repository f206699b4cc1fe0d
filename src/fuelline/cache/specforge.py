"""A target cache as SpecForge's offline training data: the records its preparation writes, its
reader's processing, and a dataset that gives SpecForge's samples straight from the cache.

SpecForge (sgl-project/SpecForge) trains EAGLE-3, DFlash and DSpark drafts offline from one
`torch.save` dict per sample (`fuelline.cache.export_specforge` writes those files). What a record holds,
for a sample of L tokens, k captured layers of hidden size H:

    method   keys (every one: int64 [L] ids and mask, bf16 [1, L, ·] states)
    eagle3   input_ids, loss_mask, aux_hidden_state [1, L, k·H], hidden_state [1, L, H]
    dspark   input_ids, loss_mask, hidden_states [1, L, k·H], target_last_hidden_states [1, L, H]
    dflash   input_ids, loss_mask, hidden_states [1, L, k·H]

`aux_hidden_state`/`hidden_states` are our `target_hidden_states` (the layers side by side, in
layer order), `hidden_state`/`target_last_hidden_states` our final normed state; fp8 caches are
widened to bf16 (`dequantize`, with the per-token scales). Its reader cuts every field to
`max_len` tokens and adds the batch dimension; for EAGLE-3 it also zeroes the loss mask's last
position, adds an all-ones `attention_mask` and renames: `hidden_state` is then the aux input
and `target` the final state (`specforge_sample`).

`SpecForgeDataset` is the zero-copy bridge (docs/cache.md, "Training with SpecForge"). It differs
from SpecForge's own reader in two ways, both on purpose: samples come in cache order (its reader
sorts file paths as strings, so data_10 before data_2), and an unreadable sample is an error naming
it (its reader prints a message and trains on sample 0 instead). A NaN or Inf in a state it returns
(the first `max_len` tokens) or exports is `NonFiniteState` (SpecForge's preparation skips such a
sample with a printed warning and checks NaN only).
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.trainer_states import NonFiniteState, bf16_state, finite
from fuelline.formats.specforge import METHODS, STATE_KEYS

DEFAULT_MAX_LEN = 2048  # SpecForge's default --max-length


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    return method


def specforge_record(sample: dict, method: str, *, where: tuple[str | os.PathLike, int], fresh: bool = True) -> dict:
    """The dict SpecForge's preparation writes for `sample` (a `CacheDataset` item). `where`: (cache,
    sample index), what `NonFiniteState` names; `fresh`: each tensor in storage of its own (torch.save
    writes a view's whole storage)."""
    aux_key, last_key = STATE_KEYS[check_method(method)]
    if last_key is not None and "target_last_hidden_states" not in sample:
        raise ValueError(f"{where[0]}: sample {where[1]} has no target_last_hidden_states, which {method} "
                         "trains on; export it for dflash, which needs only the captured layers")
    record = {"input_ids": sample["input_ids"].to(torch.int64), "loss_mask": sample["loss_mask"].to(torch.int64)}
    states = {aux_key: bf16_state(sample, "target_hidden_states", fresh)}
    if last_key is not None:
        states[last_key] = bf16_state(sample, "target_last_hidden_states", fresh)
    for key, value in states.items():
        record[key] = finite(value, sample, where=where, key=key).unsqueeze(0)
    return record


def specforge_sample(record: dict, method: str, max_len: int = DEFAULT_MAX_LEN) -> dict:
    """What SpecForge's reader makes of a loaded record (see the module docstring); the record's
    tensors are not changed."""
    aux_key, last_key = STATE_KEYS[check_method(method)]
    ids, mask = record["input_ids"][:max_len][None], record["loss_mask"][:max_len][None]
    aux = record[aux_key][0, :max_len][None]
    if method == "eagle3":
        mask = mask.clone()
        if mask.numel():
            mask[0, -1] = 0  # no next token to predict after the last one
        return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(mask),
                "hidden_state": aux, "target": record[last_key][0, :max_len][None]}
    sample = {"input_ids": ids, "loss_mask": mask, "hidden_states": aux}
    if last_key is not None:
        sample[last_key] = record[last_key][0, :max_len][None]
    return sample


class SpecForgeDataset(Dataset):
    """SpecForge's offline training samples read from a target cache in place: item i equals
    `specforge_sample(specforge_record(CacheDataset(cache)[i], method), method, max_len)`, but only
    the first `max_len` tokens are ever converted or widened. Swap it for SpecForge's offline
    dataset (`build_offline_eagle3_dataset(path, max_len)` for EAGLE-3); SpecForge's collators pad
    what it returns. `options`: CacheDataset's (`io="pread"` on network file systems, ...).
    Pickles for DataLoader workers (each reopens the shards it reads)."""

    def __init__(self, cache: str | os.PathLike, method: str = "eagle3", max_len: int = DEFAULT_MAX_LEN,
                 **options):
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive integer, not {max_len!r}")
        self.method, self.max_len = check_method(method), max_len
        self.cache = CacheDataset(cache, **options)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int) -> dict:
        sample = self.cache[i]
        index = int(i) % len(self.cache)
        cut = {key: value[: self.max_len] if isinstance(value, torch.Tensor) else value for key, value in sample.items()}
        return specforge_sample(specforge_record(cut, self.method, where=(self.cache.path, index), fresh=False),
                                self.method, self.max_len)
