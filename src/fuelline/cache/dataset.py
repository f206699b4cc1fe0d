"""Reading a target cache for draft training: dataset, collator, length-grouped batches, fp8 widening.

`CacheDataset` reads either format (`fuelline.formats.target_cache`) and returns the keys the
reference DeepSpec dataset returns (`input_ids` int32, `loss_mask` uint8, the two hidden-state
tensors), plus the fp8 scales and the source `record_id` where the format has them. Two ways to
read a sample:

* `io="mmap"` (local disks): tensors are views of a private copy-on-write mapping of the shard,
  so nothing is copied unless a field's offset is not aligned to its dtype (version 2 packs
  fields with no padding). Writing to a returned tensor changes only this process's private
  pages, never the file; the collator copies anyway.
* `io="pread"` (network file systems, where every page fault is a round trip): one read per
  sample of the contiguous span holding all its fields, into a fresh buffer the tensors view.

Open shards are kept in a small LRU; the dataset pickles without them (DataLoader workers
reopen what they read). Opening a cache makes every check that reads no record
(`fuelline.formats.target_cache_checks`), so a manifest or index that lies is a
`CacheFormatError` before the first sample; a shard that changes after that is one when a sample
in it is read, naming the file and the sample.

fp8 hidden states travel as e4m3 bytes (half of bf16 through the loader and over PCIe) and are
widened on the GPU: `CUDAPrefetcher(loader, transform=widen_hidden)`.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from fuelline.cache.fp8 import dequantize
from fuelline.formats.target_cache import FUELLINE, SCALES, CacheFormatError, layout_of, read_index, read_manifest
from fuelline.formats.target_cache_checks import opened, verify_record_checksum
from fuelline.pipeline.options import check_number

HIDDEN = ("target_hidden_states", "target_last_hidden_states")
SCALE_OF = dict(zip(HIDDEN, SCALES))  # each hidden state's fp8 scales
RETURNED = ("input_ids", "loss_mask") + HIDDEN + SCALES  # attention_mask is all ones: never returned
# the hidden dtype a manifest names (`fuelline.formats.target_cache.HIDDEN_DTYPES`'s values) as a torch dtype
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
FIELD_DTYPES = {"input_ids": torch.int32, "loss_mask": torch.uint8, "target_hidden_scales": torch.float32,
                "target_last_hidden_scales": torch.float32}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class CacheDataset(Dataset):
    """Sample i of a target cache (either format) as a dict of tensors; see the module docstring.

    `max_open_shards`: shard files (mappings or descriptors) kept open, least recently used
    closed first. `verify_checksums`: check each fuelline record's xxh3 on every read, so a damaged
    payload is an error too. One pass over the record at ~12 GB/s: no cost measurable against
    collated reads of a hidden-2048 cache (benchmarks/results/cache_checksums.json), hence on by
    default. Version 2 has no checksums; there it does nothing."""

    def __init__(self, path: str | os.PathLike, *, io: str = "mmap", max_open_shards: int = 8,
                 verify_checksums: bool = True):
        self._shards: OrderedDict[int, tuple] = OrderedDict()
        if io not in ("mmap", "pread"):
            raise ValueError(f"io must be 'mmap' or 'pread', not {io!r}")
        check_number("max_open_shards", max_open_shards, min=1)
        self.path, self.io, self.max_open_shards = Path(path), io, max_open_shards
        self.manifest = read_manifest(self.path)
        self.layout = layout_of(self.manifest)
        self.fuelline = self.layout.format == FUELLINE
        self.verify_checksums = verify_checksums and self.fuelline  # version 2 has no checksums
        hidden = TORCH_DTYPES[self.manifest["hidden_dtype"]]
        self._dtypes = {name: hidden if name in HIDDEN else FIELD_DTYPES[name]
                        for name in RETURNED if name in self.layout.fields}
        index, self._sizes = opened(self.path, self.manifest, self.layout)  # the index checked as a whole
        self._index = index
        self._lengths = np.asarray(index["seq_len"], dtype=np.int64)

    @property
    def index(self) -> np.ndarray:
        if self._index is None:  # unpickled in a worker: the parent checked this index when it opened it
            self._index = read_index(self.path, self.manifest)
        return self._index

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_index": None, "_shards": OrderedDict()}  # reopened lazily where unpickled

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> np.ndarray:
        """seq_len of every sample (int64), for length-aware samplers."""
        return self._lengths

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.manifest["target_layer_ids"])

    @property
    def hidden_size(self) -> int:
        return self.manifest["hidden_size"]

    def __getitem__(self, i: int) -> dict:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range ({n} samples)")
        i = int(i) % n
        record = self.index[i]
        seq_len, shard_id = int(record["seq_len"]), int(record["shard_id"])
        start, end, fields = self._locate(i, record, seq_len)
        handle, size, path = self._shard(shard_id, i)
        if end > size:
            raise CacheFormatError(path, f"sample {i}: its fields end at byte {end:,}, past the shard's end "
                                         f"({size:,} bytes): truncated shard or corrupt index")
        # A writable buffer the tensors view: the shard's mapping, or the span just read.
        if self.io == "mmap":
            data, base = handle, 0
        else:
            data, base = self._pread(handle, start, end - start, path, i), start
        if self.verify_checksums:
            with memoryview(data) as view, view[start - base:end - base] as block:
                verify_record_checksum(block, int(record["checksum"]), path, i)
        sample = {name: self._tensor(data, fields[name] - base, name, seq_len) for name in self._dtypes}
        if self.fuelline:
            try:
                sample["record_id"] = bytes(data[start - base: start - base + int(record["id_len"])]).decode("utf-8")
            except UnicodeDecodeError:
                raise CacheFormatError(path, f"sample {i}: its record id is not UTF-8") from None
        return sample

    def _locate(self, i: int, record, seq_len: int) -> tuple[int, int, dict[str, int]]:
        """(first byte, end, absolute offset of each field) of sample i, from its index record."""
        if self.fuelline:  # the record's length was checked against seq_len and id_len when the cache opened
            start = int(record["offset"])
            relative = self.layout.relative_offsets(seq_len, int(record["id_len"]))
            return start, start + relative["end"], {name: start + relative[name] for name in self.layout.fields}
        fields = {name: int(record[name]) for name in self.layout.fields}
        start = min(fields.values())
        end = max(offset + self.layout.field_nbytes(name, seq_len) for name, offset in fields.items())
        return start, end, fields

    def _shard(self, shard_id: int, sample: int) -> tuple:
        """(mmap or file descriptor, size, path) of an open shard, least recently used closed first."""
        if shard_id in self._shards:
            self._shards.move_to_end(shard_id)
            return self._shards[shard_id]
        entry = self.manifest["shards"][shard_id]
        path = self.path / entry["file_name"]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CacheFormatError(path, f"missing (shard {shard_id}, which holds sample {sample})") from None
        info = os.fstat(fd)
        size, opened_size = info.st_size, self._sizes[shard_id]
        problem = ("not a regular file" if not stat.S_ISREG(info.st_mode) else
                   f"{size:,} bytes, {opened_size:,} when the cache was opened" if size != opened_size else None)
        if problem:
            os.close(fd)
            raise CacheFormatError(path, f"{problem} (reading sample {sample}): truncated or replaced shard")
        if self.io == "mmap":
            # Private copy-on-write pages: writable for torch, never written back to the file.
            handle = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else b""
            os.close(fd)
        else:
            handle = fd
        self._shards[shard_id] = (handle, size, path)
        while len(self._shards) > self.max_open_shards:
            self._release(self._shards.popitem(last=False)[1][0])
        return self._shards[shard_id]

    def _release(self, handle) -> None:
        # An evicted mapping stays alive while tensors still view it and is unmapped with the last one.
        if isinstance(handle, int):
            os.close(handle)

    def close(self) -> None:
        while self._shards:
            self._release(self._shards.popitem()[1][0])

    def __del__(self):
        self.close()

    @staticmethod
    def _pread(fd: int, offset: int, nbytes: int, path: Path, sample: int) -> np.ndarray:
        buffer, done = np.empty(nbytes, dtype=np.uint8), 0
        while done < nbytes:  # one call unless the kernel returns a short read
            got = os.preadv(fd, [buffer[done:]], offset + done)
            if got == 0:
                raise CacheFormatError(path, f"sample {sample}: the shard ended {nbytes - done:,} bytes before "
                                             "the sample did (truncated while being read?)")
            done += got
        return buffer

    def _tensor(self, data, offset: int, name: str, seq_len: int) -> torch.Tensor:
        """One field as a tensor viewing `data` where its offset is aligned to the dtype, else copied."""
        storage, shape = self.layout.field_spec(name, seq_len)
        dtype, nbytes = self._dtypes[name], storage.itemsize * math.prod(shape)
        raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
        if offset % storage.itemsize:
            raw = raw.clone()
        return raw.view(dtype).view(shape)


class CacheCollator:
    """Right-pads a list of samples to the longest (zeros; fp8 as zero bytes), adds `attention_mask`
    (int64, 1 on real tokens), gathers `record_id`s into `record_ids` and a streaming cache's
    `stream_position`s into `stream_positions`. One output tensor per key
    and one copy per sample: the collator is on the loader's critical path."""

    def __init__(self, pad_to_multiple_of: int | None = None):
        check_number("pad_to_multiple_of", pad_to_multiple_of, min=1, optional=True)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, samples: list[dict]) -> dict:
        lengths = torch.tensor([s["input_ids"].shape[0] for s in samples], dtype=torch.int64)
        width = int(lengths.max())
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {}
        for key, first in samples[0].items():
            if not isinstance(first, torch.Tensor):
                continue
            # fp8 is padded as bytes: zero bytes are +0.0 in both float8 formats.
            raw = torch.uint8 if first.dtype in FP8_DTYPES else first.dtype
            out = torch.empty((len(samples), width, *first.shape[1:]), dtype=raw)
            for row, (sample, n) in enumerate(zip(samples, lengths.tolist())):
                out[row, :n].copy_(sample[key].view(raw))
                if n < width:
                    out[row, n:].zero_()
            batch[key] = out.view(first.dtype)
        batch["attention_mask"] = (torch.arange(width) < lengths[:, None]).long()
        if "record_id" in samples[0]:
            batch["record_ids"] = [s["record_id"] for s in samples]
        if "stream_position" in samples[0]:  # a StreamingCacheDataset's: what its state_dict(after=batch) reads
            batch["stream_positions"] = torch.tensor([s["stream_position"] for s in samples], dtype=torch.int64)
        return batch


class LengthGroupedBatchSampler(Sampler):
    """Batches of indices of similar length, so little of a batch is padding.

    Each epoch the indices are shuffled, cut into groups of `group_size`, sorted by length
    (longest first) within each group, cut into batches, and the batches shuffled: batches are
    homogeneous in length but their order is random. A batch holds at most `batch_size`
    samples and at most `max_tokens` padded tokens (samples × its longest); a sample longer than
    `max_tokens` is a batch of its own. Every index appears exactly once per epoch, except for the
    final batch when `drop_last` and it could have taken another sample. Deterministic for
    (seed, epoch); `set_epoch` before each epoch, as with DistributedSampler."""

    def __init__(self, lengths, *, max_tokens: int | None = None, batch_size: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, group_size: int = 8192):
        if max_tokens is None and batch_size is None:
            raise ValueError("give batch_size, max_tokens or both")
        for name, value in (("max_tokens", max_tokens), ("batch_size", batch_size), ("group_size", group_size)):
            check_number(name, value, min=1, optional=name != "group_size")
        check_number("seed", seed)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_tokens, self.batch_size, self.group_size = max_tokens, batch_size, group_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._batches())

    def __iter__(self):
        return iter(self._batches())

    def _batches(self) -> list[list[int]]:
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._make_batches())
        return self._cached[1]

    def _make_batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        groups = [order[k: k + self.group_size] for k in range(0, n, self.group_size)]
        order = np.concatenate([g[np.argsort(-self.lengths[g], kind="stable")] for g in groups]) if groups else order
        batches, current, longest = [], [], 0
        full = True
        for index, length in zip(order.tolist(), self.lengths[order].tolist()):
            if current and not self._fits(len(current) + 1, max(longest, length)):
                batches.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, length)
        if current:
            batches.append(current)
            full = not self._fits(len(current) + 1, longest)
        if self.drop_last and batches and not full:
            batches.pop()
        if self.shuffle:
            batches = [batches[k] for k in rng.permutation(len(batches))]
        return batches

    def _fits(self, count: int, longest: int) -> bool:
        return ((self.batch_size is None or count <= self.batch_size)
                and (self.max_tokens is None or count * longest <= self.max_tokens))


def widened(sample: dict, name: str, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """One hidden-state field of a sample or a batch in `dtype`: fp8 dequantized with its scales
    (version 2's plain casts just cast); any other dtype as it is."""
    value, scales = sample[name], sample.get(SCALE_OF[name])
    if scales is not None:
        return dequantize(value, scales.reshape(*value.shape[:-1], -1), dtype)
    return value.to(dtype) if value.dtype in FP8_DTYPES else value


def widen_hidden(batch: dict, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The batch with fp8 hidden states widened to `dtype` (`widened`), scales dropped; a batch
    without fp8 comes back unchanged. Runs wherever the tensors are: on the GPU it is a few
    elementwise kernels."""
    if "target_hidden_scales" not in batch and batch["target_hidden_states"].dtype not in FP8_DTYPES:
        return batch
    return {**{key: value for key, value in batch.items() if key not in SCALES},
            **{name: widened(batch, name, dtype) for name in HIDDEN}}
