"""SpecForge's offline reader, restated from its described behaviour for the tests (not our code's
rule, and no code of SpecForge's): which files it finds under a directory, how it opens one, and
what its datasets make of the loaded dict for a given max_len."""

from __future__ import annotations

import gzip
import io
import os

import torch

SUFFIXES = (".ckpt", ".ckpt.gz")


def find_files(root) -> list[str]:
    """Every file under `root` (os.walk) whose name ends in .ckpt or .ckpt.gz, full paths sorted as
    plain strings (so .../data_10.ckpt comes before .../data_2.ckpt)."""
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.join(folder, name) for name in names if name.endswith(SUFFIXES)]
    return sorted(found)


def open_file(path: str) -> dict:
    """A gzipped file: decompressed whole into memory, then loaded; a plain one: loaded memory-mapped."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)


def eagle3_item(data: dict, max_len: int) -> dict:
    """EAGLE-3: the batch dim dropped from the stored states, every field cut to max_len tokens, a
    batch dim put back; the cut mask copied and its final entry set to 0; an attention mask of ones;
    the stored aux states are returned as `hidden_state`, the stored final state as `target`."""
    mask = data["loss_mask"][:max_len].clone().reshape(1, -1)
    if mask.numel() > 0:
        mask[0, mask.shape[1] - 1] = 0
    return {"input_ids": data["input_ids"][:max_len].reshape(1, -1), "loss_mask": mask,
            "attention_mask": torch.ones(mask.shape, dtype=torch.long),
            "hidden_state": data["aux_hidden_state"].squeeze(0)[:max_len].unsqueeze(0),
            "target": data["hidden_state"].squeeze(0)[:max_len].unsqueeze(0)}


def dflash_item(data: dict, max_len: int) -> dict:
    """DFlash: ids, mask and `hidden_states` cut to max_len with a batch dim; no mask edit, no
    attention mask; all three must be equally long."""
    item = {"input_ids": data["input_ids"][:max_len].reshape(1, -1),
            "loss_mask": data["loss_mask"][:max_len].reshape(1, -1),
            "hidden_states": _states(data["hidden_states"], max_len)}
    assert item["input_ids"].shape[1] == item["loss_mask"].shape[1] == item["hidden_states"].shape[1]
    return item


def dspark_item(data: dict, max_len: int) -> dict:
    """DSpark: DFlash's item plus `target_last_hidden_states`, cut alike."""
    item = dflash_item(data, max_len)
    item["target_last_hidden_states"] = _states(data["target_last_hidden_states"], max_len)
    assert item["target_last_hidden_states"].shape[1] == item["input_ids"].shape[1]
    return item


def _states(states: torch.Tensor, max_len: int) -> torch.Tensor:
    """[1, L, D] or [L, D] -> [1, min(L, max_len), D]."""
    if states.dim() == 3:
        assert states.shape[0] == 1
        states = states[0]
    assert states.dim() == 2
    return states[:max_len].unsqueeze(0)


ITEMS = {"eagle3": eagle3_item, "dflash": dflash_item, "dspark": dspark_item}


def read_all(root, method: str, max_len: int = 2048) -> dict[str, dict]:
    """Every file SpecForge's reader finds under `root`, in its order: path -> its item."""
    return {path: ITEMS[method](open_file(path), max_len) for path in find_files(root)}
