"""A small valid target cache of either format and hidden dtype, written straight from random
arrays with the format module's own pieces (no builder, no model), for the reader's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fuelline.cache.fp8 import quantize
from fuelline.formats.target_cache import (BF16, DEEPSPEC_V2, FUELLINE, FUELLINE_FORMAT_NAME, INDEX, Layout,
                                           checksum, index_entry, seal_index, shard_name, write_manifest)

TARGET_MODEL = "org/target-model"


def random_sample(rng: np.random.Generator, layout: Layout, seq_len: int, record_id: str) -> dict:
    """One sample's fields in storage dtype (see `Layout.field_spec`); fp8 samples also keep the
    float32 hidden states they were quantized from (`source_hidden`, `source_last`)."""
    layers, hidden = layout.num_layers, layout.hidden_size
    loss = (rng.random(seq_len) < 0.6).astype(np.uint8)
    loss[: seq_len // 3] = 0  # a prompt that is not trained on
    sample = {"record_id": record_id,
              "input_ids": rng.integers(0, 150_000, seq_len, dtype=np.int32),
              "attention_mask": np.ones(seq_len, dtype=np.uint8),
              "loss_mask": loss}
    # Per-row magnitudes spanning several orders, so fp8 scales differ from token to token.
    magnitude = np.exp(rng.normal(0, 2, (seq_len, layers + 1, 1))).astype(np.float32)
    values = rng.standard_normal((seq_len, layers + 1, hidden)).astype(np.float32) * magnitude
    full, last = torch.from_numpy(values[:, :layers].reshape(seq_len, -1)), torch.from_numpy(values[:, layers])
    if layout.hidden_dtype == BF16:
        sample["target_hidden_states"] = full.bfloat16().view(torch.uint16).numpy()
        sample["target_last_hidden_states"] = last.bfloat16().view(torch.uint16).numpy()
    else:
        q, scales = quantize(full, layers)
        q_last, scales_last = quantize(last, 1)
        sample.update(target_hidden_states=q.view(torch.uint8).numpy(), target_hidden_scales=scales.numpy(),
                      target_last_hidden_states=q_last.view(torch.uint8).numpy(),
                      target_last_hidden_scales=scales_last[:, 0].numpy(),
                      source_hidden=full.numpy(), source_last=last.numpy())
    return sample


def manifest_for(layout: Layout, layer_ids, num_samples: int, shard_sizes: list[int]) -> dict:
    manifest = {"version": 2, "num_samples": num_samples, "num_shards": len(shard_sizes),
                "target_layer_ids": list(layer_ids), "hidden_dtype": layout.hidden_dtype, "token_dtype": "int32",
                "mask_dtype": "uint8", "index_record_size": layout.index_dtype().itemsize,
                "hidden_size": layout.hidden_size, "target_model_name_or_path": TARGET_MODEL,
                "shards": [{"shard_id": k, "file_name": shard_name(k)} for k in range(len(shard_sizes))]}
    if layout.format == FUELLINE:
        manifest.update(format=FUELLINE_FORMAT_NAME, version=2, max_length=64, chat_template="chatml")
        for entry, size in zip(manifest["shards"], shard_sizes):
            entry["num_bytes"] = size
    return manifest


def write_cache(directory: Path, *, fmt: str = FUELLINE, hidden_dtype: str = BF16, num_samples: int = 12,
                num_shards: int = 3, layer_ids=(2, 5, 9), hidden_size: int = 8, max_len: int = 19,
                seed: int = 0) -> list[dict]:
    """Write the cache into `directory` and return its samples (see `random_sample`), in order.
    Samples go to shards in contiguous runs; lengths vary from 1 to `max_len` (both included)."""
    assert fmt in (DEEPSPEC_V2, FUELLINE)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    layout = Layout(fmt, len(layer_ids), hidden_size, hidden_dtype)
    lengths = rng.integers(1, max_len + 1, num_samples)
    lengths[:2] = (1, max_len)
    samples = [random_sample(rng, layout, int(n), f"source/{i}·é") for i, n in enumerate(lengths)]
    shards = [bytearray() for _ in range(num_shards)]
    index = []
    for i, sample in enumerate(samples):
        shard_id = i * num_shards // num_samples
        shard = shards[shard_id]
        data, offsets = layout.serialize(sample["record_id"], sample)
        index.append(index_entry(layout, i, shard_id, len(sample["input_ids"]), len(shard), offsets, checksum(data),
                                 len(sample["record_id"].encode()), int(sample["loss_mask"].sum())))
        shard += data
    for k, shard in enumerate(shards):
        (directory / shard_name(k)).write_bytes(shard)
    manifest = manifest_for(layout, layer_ids, num_samples, [len(s) for s in shards])
    index = np.array(index, dtype=layout.index_dtype())
    if fmt == FUELLINE:
        seal_index(index, manifest)
    (directory / INDEX).write_bytes(index.tobytes())
    write_manifest(directory, manifest)
    return samples
