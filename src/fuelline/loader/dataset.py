"""TokenDataset: training windows read straight from a token dataset's memory maps.

Item i is the window of `seq_len` tokens starting at token i·seq_len, as
`{"input_ids", "labels"}` int64 tensors: `labels[t] == input_ids[t]` where the token is trained
on and -100 where it is masked. Never shifted: the model shifts once (`causal_lm_loss`).

Batches are gathered whole (`__getitems__`, which DataLoader calls with a batch of indices) by
one numba loop that reads the memory-mapped tokens and mask bits and writes ids and labels
directly. Nothing is read up front, so a file far larger than memory costs only the
pages a batch touches, and those are released again every few million tokens (`TokenFiles.release`),
so the resident memory of a long run stays flat; the maps are reopened lazily in each
DataLoader worker.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numba import njit

from fuelline.formats.tokens import TokenFiles

IGNORE_INDEX = -100
RELEASE_EVERY_TOKENS = 8 << 20  # read pages dropped from the resident set every ~8 M tokens


@njit(cache=True, nogil=True)
def gather_windows(tokens, mask_bits, has_mask, starts, ids, labels):
    """ids[b] = tokens of window b, widened to int64; labels[b] = the same where the mask bit is
    set, -100 where not. One pass over the batch, ~4x faster than numpy's stack + unpackbits +
    where, which each make a full temporary."""
    length = ids.shape[1]
    for b in range(starts.shape[0]):
        start = starts[b]
        for t in range(length):
            position = start + t
            token = np.int64(tokens[position])
            ids[b, t] = token
            if has_mask and not (mask_bits[position >> 3] >> (position & 7)) & 1:
                labels[b, t] = IGNORE_INDEX
            else:
                labels[b, t] = token


@njit(cache=True, nogil=True)
def document_positions(offsets, starts, positions, boundaries):
    """Fill positions (restarting at each document start and window start) and the segment
    boundaries of the flattened batch, ending with its size; return how many boundaries."""
    length = positions.shape[1]
    count = 0
    for b in range(starts.shape[0]):
        start = starts[b]
        doc = np.searchsorted(offsets, start, side="right") - 1
        position = 0
        for t in range(length):
            token = start + t
            restarted = t == 0
            while doc + 1 < offsets.shape[0] and token >= offsets[doc + 1]:  # skips empty documents
                doc += 1
                restarted = True
            if restarted:
                position = 0
                boundaries[count] = b * length + t
                count += 1
            positions[b, t] = position
            position += 1
    boundaries[count] = starts.shape[0] * length
    return count + 1


@njit(cache=True, nogil=True)
def gather_compact(tokens, mask_bits, has_mask, starts, ids, mask):
    """ids[b] = tokens of window b in their stored dtype; mask[b] = its mask, one byte per token
    (1 = trained on; all ones without a mask)."""
    length = ids.shape[1]
    for b in range(starts.shape[0]):
        start = starts[b]
        for t in range(length):
            position = start + t
            ids[b, t] = tokens[position]
            mask[b, t] = (mask_bits[position >> 3] >> (position & 7)) & 1 if has_mask else 1


def widen(batch: dict) -> dict:
    """A compact batch (`compact=True`) in the item contract: int64 `input_ids` and `labels` (-100
    where the mask is 0), int64 `position_ids`; other keys unchanged. Runs wherever the tensors are:
    in the main process after the workers' hand-over, or on the GPU after the copy."""
    if "label_mask" not in batch:
        return batch
    out = {k: v for k, v in batch.items() if k != "label_mask"}
    ids = batch["input_ids"].long()
    out["input_ids"] = ids
    out["labels"] = ids.masked_fill(batch["label_mask"] == 0, IGNORE_INDEX)
    if "position_ids" in batch:
        out["position_ids"] = batch["position_ids"].long()
    return out


class TokenDataset:
    """`compact=True`: batches leave `__getitems__` in stored widths (ids uint16/int32, a one-byte
    mask, int32 positions: 3 bytes a token instead of 16) for `widen` to expand later. What makes
    DataLoader workers cheap: a worker's batch crosses to the main process through shared memory,
    and that copy, not the gather, is what limits a loader with workers."""

    def __init__(self, path: str | os.PathLike, seq_len: int, *, document_aware: bool = False,
                 compact: bool = False):
        if seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, not {seq_len}")
        self.path, self.seq_len, self.document_aware, self.compact = Path(path), seq_len, document_aware, compact
        self._files: TokenFiles | None = None
        self._touched = 0
        files = self.files
        self.num_windows = files.num_tokens // seq_len
        if self.num_windows == 0:
            raise ValueError(f"{path} (split {Path(path).name}): {files.num_tokens:,} tokens in "
                             f"{files.num_documents:,} documents make no window of seq_len {seq_len}; pack more "
                             "documents into this split, or use a shorter seq_len")

    @property
    def files(self) -> TokenFiles:
        if self._files is None:
            self._files = TokenFiles(self.path)
        return self._files

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": None}  # memory maps are reopened in each worker

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> dict:
        if not -self.num_windows <= index < self.num_windows:
            raise IndexError(f"window {index} out of range ({self.num_windows} windows)")
        return {k: v[0] if k != "cu_seqlens" else v for k, v in self.__getitems__([index % self.num_windows]).items()}

    def __getitems__(self, indices) -> dict:
        import torch

        files, length = self.files, self.seq_len
        starts = np.asarray(indices, dtype=np.int64) * length
        mask_bits = files.mask_bits if files.mask_bits is not None else np.zeros(0, dtype=np.uint8)
        if self.compact:
            # int32, not uint32: ids stay below 2**31 and torch moves int32 everywhere
            ids = np.empty((len(starts), length), dtype=files.tokens.dtype if files.tokens.itemsize == 2 else np.int32)
            mask = np.empty((len(starts), length), dtype=np.uint8)
            gather_compact(files.tokens, mask_bits, files.mask_bits is not None, starts, ids, mask)
            batch = {"input_ids": torch.from_numpy(ids), "label_mask": torch.from_numpy(mask)}
        else:
            ids = np.empty((len(starts), length), dtype=np.int64)
            labels = np.empty_like(ids)
            gather_windows(files.tokens, mask_bits, files.mask_bits is not None, starts, ids, labels)
            batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        self._touched += ids.size
        if self._touched >= RELEASE_EVERY_TOKENS:
            files.release()
            self._touched = 0
        if self.document_aware:
            positions, cu_seqlens = self._document_positions(starts)
            batch["position_ids"] = torch.from_numpy(positions.astype(np.int32) if self.compact else positions)
            batch["cu_seqlens"] = torch.from_numpy(cu_seqlens)
        return batch

    def _document_positions(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Position ids restarting at every document start (and at each window's start), and
        cu_seqlens: the boundaries of those segments in the flattened batch, for varlen attention."""
        offsets = np.asarray(self.files.offsets, dtype=np.int64)
        positions = np.empty((len(starts), self.seq_len), dtype=np.int64)
        boundaries = np.empty(positions.size + 1, dtype=np.int32)
        count = document_positions(offsets, starts, positions, boundaries)
        return positions, boundaries[:count].copy()
