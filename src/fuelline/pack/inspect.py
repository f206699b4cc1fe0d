"""What `fuelline inspect` shows: a decoded document with its mask, or a window's position table.

The window table is the alignment contract made visible (docs/design.md): `label[t]` is the token
at t itself where it is trained on and -100 where masked, never shifted; the model's single
shift scores the logits at t against `label[t+1]`, shown in the last column.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fuelline.fingerprints import tokenizer_fingerprint
from fuelline.formats.tokens import MANIFEST, TokenFiles, TokenFormatError

IGNORE = -100


def open_for_inspection(directory: str | os.PathLike, split: str = "train"):
    """(TokenFiles, tokenizer) for a token dataset or a pack output; the tokenizer must match."""
    from tokenizers import Tokenizer

    root = Path(directory)
    data = root if (root / MANIFEST).exists() else root / split
    files = TokenFiles(data)
    candidates = [data.parent / "tokenizer", data / "tokenizer"]
    tokenizer_dir = next((c for c in candidates if (c / "tokenizer.json").exists()), None)
    if tokenizer_dir is None:
        raise TokenFormatError(data, "no tokenizer/ next to it to decode with")
    expected = files.manifest["tokenizer"].get("fingerprint")
    if expected is None:
        raise TokenFormatError(data, "its manifest records no tokenizer fingerprint, so no tokenizer can be "
                                     "checked to decode it; pack it again with fuelline")
    if tokenizer_fingerprint(tokenizer_dir) != expected:
        raise TokenFormatError(tokenizer_dir, "this tokenizer is not the one the dataset was packed with")
    return files, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def _runs(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """(start, stop, value) of each run of equal mask values."""
    if len(mask) == 0:
        return []
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    starts, stops = np.concatenate(([0], edges)), np.concatenate((edges, [len(mask)]))
    return [(int(a), int(b), bool(mask[a])) for a, b in zip(starts, stops)]


def show_document(files: TokenFiles, tokenizer, k: int) -> str:
    ids, mask = files.document(k)
    if mask is None:
        mask = np.ones(len(ids), dtype=bool)
    lines = [f"document {k}: {len(ids)} tokens, {int(mask.sum())} trained on, {int((~mask).sum())} masked"]
    for start, stop, trained in _runs(mask):
        text = tokenizer.decode(ids[start:stop].tolist(), skip_special_tokens=False)
        lines.append(f"  [{'trained' if trained else 'masked '}] {text!r}")
    return "\n".join(lines)


def show_window(files: TokenFiles, tokenizer, window: int, seq_len: int) -> str:
    start = window * seq_len
    if seq_len < 1 or start + seq_len > files.num_tokens:
        raise IndexError(f"window {window} of {seq_len} tokens is beyond the {files.num_tokens:,} tokens")
    ids = np.asarray(files.tokens[start:start + seq_len]).astype(np.int64)
    mask = files.mask(start, start + seq_len)
    labels = np.where(mask, ids, IGNORE) if mask is not None else ids
    rows = [f"window {window}: tokens {start:,}..{start + seq_len - 1:,}",
            f"{'t':>5} {'input_id':>8}  {'token':<12} {'label':>6}  {'loss at t: logits[t] vs label[t+1]':>34}"]
    for t in range(seq_len):
        piece = repr(tokenizer.decode([int(ids[t])], skip_special_tokens=False))
        target = int(labels[t + 1]) if t + 1 < seq_len else None
        scored = "(last position: no target)" if target is None else ("ignored (-100)" if target == IGNORE else
                                                                      f"predict {target}")
        rows.append(f"{t:>5} {ids[t]:>8}  {piece:<12} {labels[t]:>6}  {scored:>34}")
    return "\n".join(rows)
