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

What is cheap to check is checked before data reaches a model: window indices are bounds-checked
before the gather (an index past the end is an IndexError, never a read beyond the map), the
files when opened (`TokenFiles`: manifest schema, sizes, docs.idx in order), and the gather
returns the largest id it copied, so an id at or above vocab_size (a corrupted tokens.bin) is a
TokenFormatError naming the file and the window. The id check is a vectorized max over each
window's stored ids inside the gather, the index check a tiny numba loop; together they cost
~1 µs of a ~50 µs `__getitems__` of 32 × 1024 tokens (+2% int64, nothing measurable compact).
What the loader cannot see is a changed id that stays below vocab_size, an offset moved between
its neighbours, or a flipped mask bit: only the checksums of `fuelline verify` catch those.
"""

from __future__ import annotations

import operator
import os
from pathlib import Path

import numpy as np
from numba import njit

from fuelline.formats.tokens import MANIFEST, TOKENS, TokenFiles, TokenFormatError
from fuelline.pipeline.options import check_number

IGNORE_INDEX = -100
RELEASE_EVERY_TOKENS = 8 << 20  # read pages dropped from the resident set every ~8 M tokens


@njit(cache=True, nogil=True)
def window_starts(windows, num_windows, length, starts):
    """starts[b] = window b's first token, negative windows counting from the end (as in a list);
    returns the b of the first window out of range, or -1 when all are in range. Runs before any
    gather, so no index reads outside the maps."""
    for b in range(windows.shape[0]):
        window = windows[b]
        if window < 0:
            window += num_windows
        if window < 0 or window >= num_windows:
            return b
        starts[b] = window * length
    return -1


@njit(cache=True, nogil=True)
def gather_windows(tokens, mask_bits, has_mask, starts, ids, labels):
    """ids[b] = tokens of window b, widened to int64; labels[b] = the same where the mask bit is
    set, -100 where not. One pass over the batch, ~4x faster than numpy's stack + unpackbits +
    where, which each make a full temporary. Returns the largest id copied (-1 for no tokens),
    for the caller's vocabulary check."""
    length = ids.shape[1]
    top = np.int64(-1)
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
        top = max(top, np.int64(tokens[start:start + length].max()))  # vectorized: ~2% of the gather
    return top


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
def gather_compact(tokens, mask_bits, has_mask, starts, ids, label_bits):
    """ids[b] = tokens of window b in their stored dtype; label_bits[b] = its mask packed 8 tokens a
    byte, little bit order (1 = trained on; all ones without a mask). Returns the largest id copied
    (-1 for no tokens)."""
    length = ids.shape[1]
    top = np.int64(-1)
    for b in range(starts.shape[0]):
        start = starts[b]
        label_bits[b, :] = 0
        for t in range(length):
            position = start + t
            ids[b, t] = tokens[position]
            bit = (mask_bits[position >> 3] >> (position & 7)) & 1 if has_mask else 1
            label_bits[b, t >> 3] |= bit << (t & 7)
        top = max(top, np.int64(tokens[start:start + length].max()))
    return top


@njit(cache=True, nogil=True)
def widen_on_host(ids, label_bits, wide, labels):
    """wide = ids as int64; labels = the same where the bit is 1, IGNORE_INDEX elsewhere: one pass
    (~15 us for 32 x 1024, where torch's cast, unpacking and masked_fill take ~100 us)."""
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            value = np.int64(ids[b, t])
            wide[b, t] = value
            labels[b, t] = value if (label_bits[b, t >> 3] >> (t & 7)) & 1 else IGNORE_INDEX


def as_tensors(batch: dict) -> dict:
    """A compact batch's numpy arrays as tensors, without a copy."""
    import torch

    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def widen(batch: dict) -> dict:
    """A compact batch (`compact=True`) in the item contract: int64 `input_ids` and `labels` (-100
    where the mask is 0), int64 `position_ids`; other keys unchanged. Runs wherever the batch is:
    numpy arrays in the main process after the workers' hand-over, or tensors on the GPU after
    the copy."""
    if "label_bits" not in batch:
        return batch
    ids, bits = batch["input_ids"], batch["label_bits"]
    out = {k: v for k, v in batch.items() if k != "label_bits"}
    if isinstance(ids, np.ndarray):
        wide, labels = np.empty(ids.shape, np.int64), np.empty(ids.shape, np.int64)
        widen_on_host(ids, bits, wide, labels)
        out.update(input_ids=wide, labels=labels)
        if "position_ids" in out:
            out["position_ids"] = out["position_ids"].astype(np.int64)
        return as_tensors(out)
    import torch

    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    trained = ((bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :ids.shape[1]]
    wide = ids.long()
    out.update(input_ids=wide, labels=wide.masked_fill(trained == 0, IGNORE_INDEX))
    if "position_ids" in out:
        out["position_ids"] = out["position_ids"].long()
    return out


class TokenDataset:
    """`compact=True`: batches leave `__getitems__` as numpy arrays in stored widths (ids
    uint16/int32, the mask as bits, int32 positions: ~2 bytes a token instead of 16) for `widen` to
    expand later. What makes DataLoader workers cheap: a tensor crosses from a worker through a new
    shared-memory segment (~0.5 ms each, whatever its size: ~27k samples/s of 32 x 1024 at best on
    2 cores), while numpy arrays are pickled through the worker's pipe (68 KiB a batch here)."""

    def __init__(self, path: str | os.PathLike, seq_len: int, *, document_aware: bool = False,
                 compact: bool = False):
        check_number("seq_len", seq_len, min=2)
        self.path, self.seq_len, self.document_aware, self.compact = Path(path), seq_len, document_aware, compact
        self._files: TokenFiles | None = None
        self._touched = 0
        self.num_windows = -1  # the first open sets it; a reopen (in a worker) must find the same
        files = self.files
        self.vocab_size = files.manifest["vocab_size"]
        if compact and self.vocab_size > 2**31:
            raise ValueError(f"{path}: vocab_size {self.vocab_size:,} is above 2**31; compact batches carry ids as "
                             "int32, so use compact=False")
        if self.num_windows == 0:
            raise ValueError(f"{path} (split {Path(path).name}): {files.num_tokens:,} tokens in "
                             f"{files.num_documents:,} documents make no window of seq_len {seq_len}; pack more "
                             "documents into this split, or use a shorter seq_len")

    @property
    def files(self) -> TokenFiles:
        if self._files is None:
            files = TokenFiles(self.path)
            if self.num_windows < 0:
                self.num_windows = files.num_tokens // self.seq_len
            elif files.num_tokens // self.seq_len != self.num_windows:
                raise TokenFormatError(self.path, f"changed since this dataset was opened ({self.num_windows:,} "
                                                  f"windows then, {files.num_tokens // self.seq_len:,} now): "
                                                  "open it again")
            self._files = files
        return self._files

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": None}  # memory maps are reopened in each worker

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> dict:
        index = operator.index(index)
        if not -self.num_windows <= index < self.num_windows:
            raise IndexError(f"window {index} out of range ({self.num_windows:,} windows)")
        return {k: v[0] if k != "cu_seqlens" else v for k, v in self.__getitems__([index % self.num_windows]).items()}

    def _starts(self, indices) -> np.ndarray:
        """The first token of each window; an IndexError names the first index out of range (and
        a TypeError anything but a flat sequence of integers), before any token is read."""
        windows = np.asarray(indices)
        if windows.dtype != np.int64 or windows.ndim != 1:  # the fast path is a list of ints
            if windows.ndim != 1 or (len(windows) and windows.dtype.kind not in "iuO"):
                raise TypeError(f"window indices must be a flat sequence of integers, not {windows.dtype} "
                                f"of shape {windows.shape}")
            n = self.num_windows
            if len(windows) and windows.dtype.kind == "O":  # Python ints beyond int64
                values = [operator.index(i) for i in windows.tolist()]
                if (bad := next((i for i in values if not -n <= i < n), None)) is not None:
                    raise IndexError(f"window {bad} out of range ({n:,} windows)")
            elif len(windows) and windows.max() >= n:  # uint64 beyond int64 would wrap in the cast
                raise IndexError(f"window {int(windows.max())} out of range ({n:,} windows)")
            windows = windows.astype(np.int64)
        starts = np.empty(len(windows), dtype=np.int64)
        bad = window_starts(windows, self.num_windows, self.seq_len, starts)
        if bad >= 0:
            raise IndexError(f"window {int(windows[bad])} out of range ({self.num_windows:,} windows)")
        return starts

    def _out_of_vocabulary(self, ids: np.ndarray, starts: np.ndarray) -> TokenFormatError:
        values = ids.view(np.uint32) if ids.dtype == np.int32 else ids  # compact uint32 ids travel as int32
        b, t = (int(i) for i in np.unravel_index(int(np.argmax(values >= self.vocab_size)), ids.shape))
        window = int(starts[b]) // self.seq_len
        return TokenFormatError(self.path / TOKENS, f"token id {int(values[b, t]):,} at token {int(starts[b]) + t:,} "
                                                   f"(window {window:,}, position {t}) is not below vocab_size "
                                                   f"{self.vocab_size:,} ({MANIFEST}): the file is corrupted; run `fuelline "
                                                   f"verify {self.path}`")

    def __getitems__(self, indices) -> dict:
        import torch

        files, length = self.files, self.seq_len
        starts = self._starts(indices)
        mask_bits = files.mask_bits if files.mask_bits is not None else np.zeros(0, dtype=np.uint8)
        if self.compact:
            # int32, not uint32: ids stay below 2**31 and torch moves int32 everywhere
            ids = np.empty((len(starts), length), dtype=files.tokens.dtype if files.tokens.itemsize == 2 else np.int32)
            label_bits = np.empty((len(starts), (length + 7) // 8), dtype=np.uint8)
            top = gather_compact(files.tokens, mask_bits, files.mask_bits is not None, starts, ids, label_bits)
            batch = {"input_ids": ids, "label_bits": label_bits}
        else:
            ids = np.empty((len(starts), length), dtype=np.int64)
            labels = np.empty_like(ids)
            top = gather_windows(files.tokens, mask_bits, files.mask_bits is not None, starts, ids, labels)
            batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if top >= self.vocab_size:
            raise self._out_of_vocabulary(ids, starts)
        self._touched += ids.size
        if self._touched >= RELEASE_EVERY_TOKENS:
            files.release()
            self._touched = 0
        if self.document_aware:
            positions, cu_seqlens = self._document_positions(starts)
            if self.compact:
                batch.update(position_ids=positions.astype(np.int32), cu_seqlens=cu_seqlens)
            else:
                batch.update(position_ids=torch.from_numpy(positions), cu_seqlens=torch.from_numpy(cu_seqlens))
        return batch

    def _document_positions(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Position ids restarting at every document start (and at each window's start), and
        cu_seqlens: the boundaries of those segments in the flattened batch, for varlen attention."""
        offsets = np.asarray(self.files.offsets, dtype=np.int64)
        positions = np.empty((len(starts), self.seq_len), dtype=np.int64)
        boundaries = np.empty(positions.size + 1, dtype=np.int32)
        count = document_positions(offsets, starts, positions, boundaries)
        return positions, boundaries[:count].copy()
