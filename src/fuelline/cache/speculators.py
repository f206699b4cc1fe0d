"""A target cache as vLLM speculators' offline training data: what its sample files and its Arrow
layout's per-sample files hold for one cache sample.

speculators (vllm-project/speculators) trains EAGLE-3 drafts offline from hidden states its own
scripts generate through vLLM, in one of two layouts (`fuelline.cache.export_speculators` writes
both). For a sample of T tokens, k captured layers of hidden size H:

    sample files (data_{i}.pt, torch.save, beside sample_lengths.json)
        input_ids int64 [T], loss_mask int64 [T],
        hidden_states: a list of k + 1 bf16 [T, H] tensors, the captured layers in layer order,
                       then the last hidden state (its "verifier" state)
    Arrow layout (a datasets directory with input_ids, loss_mask, seq_len columns, and
        hidden_states/hs_{i}.safetensors for row i)
        token_ids int64 [T] (its reader drops the row when they differ from the row's input_ids),
        hidden_states bf16 [T, k + 1, H] (the captured layers, then the last)

Those are the dtypes its generators write (ids and masks as torch.long, the states in the target
model's dtype). Our `target_hidden_states` [T, k·H] is the k layers side by side, split here;
`target_last_hidden_states` the final normed state, which speculators needs for every record (its
reader takes the list's last element as the verifier state): a cache built without it is refused.
fp8 caches are widened to bf16 with their per-token scales (`widened`); a NaN or Inf in a state is
`NonFiniteState`. `SpeculatorsDataset` is the zero-copy bridge: speculators' dataset items straight
from the cache, no files written (docs/cache.md, "Training with speculators").
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.trainer_states import bf16_state, finite

Where = tuple[str | os.PathLike, int]  # (cache, sample index): what an error names


def _states(sample: dict, where: Where) -> tuple[torch.Tensor, torch.Tensor]:
    """(captured layers [T, k·H], last [T, H]) in bf16, both finite; views of the cache where it is bf16."""
    if "target_last_hidden_states" not in sample:
        raise ValueError(f"{where[0]}: sample {where[1]} has no target_last_hidden_states, the last hidden "
                         "state speculators trains against (the final element of its hidden_states); "
                         "rebuild the cache with the last hidden state kept")
    layers = finite(bf16_state(sample, "target_hidden_states", fresh=False), sample, where=where,
                    key="hidden_states (captured layers)")
    last = finite(bf16_state(sample, "target_last_hidden_states", fresh=False), sample, where=where,
                  key="hidden_states (last hidden state)")
    if layers.shape[0] != last.shape[0] or layers.shape[-1] % last.shape[-1]:
        raise ValueError(f"{where[0]}: sample {where[1]}: captured layers {tuple(layers.shape)} do not split into "
                         f"states of the last hidden state's shape {tuple(last.shape)}")
    return layers, last


def speculators_record(sample: dict, *, where: Where, fresh: bool = True) -> dict:
    """The dict in speculators' sample file for `sample` (a `CacheDataset` item). `where`: (cache,
    sample index), what errors name; `fresh`: every tensor contiguous in storage of its own, as its
    generator saves them (torch.save writes a view's whole storage); without it the layers are views
    of the widened states (or of the cache itself for bf16)."""
    layers, last = _states(sample, where)
    hidden = [*layers.split(last.shape[-1], dim=-1), last]
    if fresh:
        hidden = [state.clone(memory_format=torch.contiguous_format) for state in hidden]
    return {"input_ids": sample["input_ids"].to(torch.int64), "loss_mask": sample["loss_mask"].to(torch.int64),
            "hidden_states": hidden}


def speculators_arrow_tensors(sample: dict, *, where: Where) -> dict:
    """The tensors of speculators' hs_{i}.safetensors for `sample`: `token_ids` int64 [T] and
    `hidden_states` bf16 [T, k + 1, H], each contiguous in storage of its own (safetensors needs both)."""
    layers, last = _states(sample, where)
    stacked = torch.cat([layers.unflatten(-1, (-1, last.shape[-1])), last.unsqueeze(1)], dim=1)
    return {"token_ids": sample["input_ids"].to(torch.int64, copy=True), "hidden_states": stacked}


def speculators_arrow_row(sample: dict) -> dict:
    """The Arrow table's row for `sample`: its `input_ids` and `loss_mask` as int64 lists and `seq_len`,
    the columns speculators' preparation writes."""
    return {"input_ids": sample["input_ids"].to(torch.int64).tolist(),
            "loss_mask": sample["loss_mask"].to(torch.int64).tolist(), "seq_len": int(sample["input_ids"].shape[0])}


class SpeculatorsDataset(Dataset):
    """speculators' offline training dataset read from a target cache in place: item i is what its
    `SampleFileDataset`/`ArrowDataset` give for the exported sample i (`hidden_states` [T, k·H] and
    `verifier_last_hidden_states` [T, H] in `hidden_states_dtype`, `input_ids` and `loss_mask` int64
    [T], `lengths` [T], `position_ids` 0..T-1, then `transform`), with `approx_lengths` (the exact
    lengths) and `hidden_states_dtype` as its sampler and collator read them. bf16 states are views
    of the cache (its reader concatenates the layers it loaded: a copy); fp8 is widened.

    Where it plugs in: speculators' `scripts/train.py` builds its datasets in `main` (`ArrowDataset`,
    or `SampleFileDataset` with --legacy-data) and hands each to `setup_dataloader(dataset, ...)`,
    which reads only `approx_lengths` and `hidden_states_dtype`, then the loaders to
    `Trainer(model, config, train_loader, val_loader)`; its CLI takes no dataset object, so the two
    constructions are replaced by this class in a copy of that script (docs/cache.md, "Training with
    speculators"). Samples are not cut here: its collator cuts the packed batch to --total-seq-len
    after EAGLE-3's shift (`max_len` is kept as its datasets keep it). `split_ratio` is
    `ArrowDataset`'s: 0.9 the first 90% of the samples, -0.1 the last 10%, 1.0 all. Pickles for
    DataLoader workers (its loader spawns them; each reopens the shards it reads)."""

    def __init__(self, cache: str | os.PathLike, max_len: int, *, split_ratio: float = 1.0, transform=None,
                 hidden_states_dtype: torch.dtype = torch.bfloat16, **options):
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive integer, not {max_len!r}")
        self.cache = CacheDataset(cache, **options)
        self.max_len, self.transform, self.hidden_states_dtype = max_len, transform, hidden_states_dtype
        self.start, self.stop = _split(len(self.cache), split_ratio)
        self.approx_lengths = self.cache.lengths[self.start:self.stop].tolist()

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range ({len(self)} samples)")
        index = self.start + int(i)
        sample = self.cache[index]
        layers, last = _states(sample, (self.cache.path, index))
        n = int(sample["input_ids"].shape[0])
        item = {"hidden_states": layers.to(self.hidden_states_dtype), "input_ids": sample["input_ids"].to(torch.int64),
                "verifier_last_hidden_states": last.to(self.hidden_states_dtype),
                "loss_mask": sample["loss_mask"].to(torch.int64), "lengths": torch.tensor([n], dtype=torch.long),
                "position_ids": torch.arange(n, dtype=torch.long)}
        return self.transform(item) if self.transform else item


def _split(samples: int, ratio: float) -> tuple[int, int]:
    """(start, stop) of `ArrowDataset`'s split_ratio: r in (0, 1] the first int(samples·r), r in
    (-1, 0) the last samples - int(samples·(1 + r))."""
    if ratio == 1.0:
        return 0, samples
    if 0 < ratio < 1:
        return 0, int(samples * ratio)
    if -1 < ratio < 0:
        return int(samples * (1 + ratio)), samples
    raise ValueError(f"split_ratio must be in (-1, 1] and not 0, not {ratio!r}")
