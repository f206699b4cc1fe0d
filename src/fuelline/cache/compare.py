"""`fuelline cache compare A B`: what two builds of the same plan share, and how far apart their
hidden states are.

Two builds from the same conversations, options and model have the same plan whatever their
number of ranks (`plan.py`), so their samples, token ids, loss masks, record ids and index layout
are identical; their hidden states are identical bit for bit only where every forward ran the
same way (docs/cache.md, "What is identical across rank counts", says when and why not). This
module checks the first promise exactly and measures the second.

The distance is measured per token against the token's largest magnitude: bf16 keeps 8
significant bits, so one unit in the last place of a token's largest value is 2^-8 = 0.0039 of it.
"""

from __future__ import annotations

import os

import numpy as np

LIMIT = 20  # structural differences listed before the rest are only counted


def compare_caches(first: str | os.PathLike, second: str | os.PathLike) -> dict:
    """{"samples", "differences" (structural, listed), "hidden_values", "hidden_differing",
    "max_relative_difference"}; no differences means the same plan, ids, masks and layout."""
    import torch

    from fuelline.cache.dataset import CacheDataset, widen_hidden

    a, b = CacheDataset(first), CacheDataset(second)
    differences: list[str] = []
    for key in ("target_layer_ids", "hidden_size", "hidden_dtype", "num_samples"):
        if a.manifest.get(key) != b.manifest.get(key):
            differences.append(f"manifest {key}: {a.manifest.get(key)!r} and {b.manifest.get(key)!r}")
    if a.index.dtype != b.index.dtype:
        differences.append("the caches are of different formats")
    result = {"samples": len(a), "differences": differences, "hidden_values": 0, "hidden_differing": 0,
              "max_relative_difference": 0.0}
    if differences:
        return result
    layout = [name for name in a.index.dtype.names if name not in ("checksum", "index_checksum")]  # both cover the hidden bytes
    for name in layout:
        for k in np.flatnonzero(a.index[name] != b.index[name])[:LIMIT].tolist():
            differences.append(f"samples.idx sample {k}: {name} {a.index[name][k]} and {b.index[name][k]}")
    for k in range(len(a)):
        x, y = a[k], b[k]
        for name in ("input_ids", "loss_mask", "record_id"):
            if name in x and not _equal(x[name], y[name]):
                differences.append(f"sample {k}: {name} differs")
        x, y = widen_hidden(x, torch.float32), widen_hidden(y, torch.float32)
        for name in ("target_hidden_states", "target_last_hidden_states"):
            p, q = x[name].float(), y[name].float()
            result["hidden_values"] += p.numel()
            result["hidden_differing"] += int((p != q).sum())
            scale = p.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
            worst = float(((p - q).abs() / scale).max()) if p.numel() else 0.0
            result["max_relative_difference"] = max(result["max_relative_difference"], worst)
        if len(differences) > LIMIT:
            break
    result["differences"] = differences[:LIMIT]
    return result


def _equal(x, y) -> bool:
    return x == y if isinstance(x, str) else bool((x == y).all()) and x.shape == y.shape


def format_comparison(result: dict) -> str:
    if result["differences"]:
        return "\n".join(["different plans: " + result["differences"][0], *result["differences"][1:]])
    lines = [f"same plan: {result['samples']:,} samples; token ids, loss masks, record ids and the index layout "
             "are identical"]
    if not result["hidden_differing"]:
        lines.append(f"hidden states: identical ({result['hidden_values']:,} values)")
    else:
        share = result["hidden_differing"] / result["hidden_values"]
        lines.append(f"hidden states: {result['hidden_differing']:,} of {result['hidden_values']:,} values differ "
                     f"({share:.2%}), by at most {result['max_relative_difference']:.4f} of their token's largest "
                     f"value (one bf16 unit in the last place is 0.0039)")
    return "\n".join(lines)
