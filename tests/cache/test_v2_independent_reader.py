"""Version 2 byte for byte, checked against a second implementation written here from the
layout description alone (struct, json and numpy; nothing from fuelline.formats):

    manifest.json   version 2, num_samples, num_shards, target_layer_ids, hidden_dtype,
                    token_dtype "int32", mask_dtype "uint8", index_record_size 56, hidden_size,
                    shards [{shard_id, file_name}], target_model_name_or_path
    samples.idx     one record `<QIIQQQQQ` per sample: sample_id, shard_id, seq_len, then the byte
                    offsets of input_ids, attention_mask, loss_mask, target_hidden_states,
                    target_last_hidden_states in the sample's shard
    shards          each sample's five tensors back to back, in that order, no padding:
                    int32 [T], uint8 [T], uint8 [T], hidden [T, L*H], hidden [T, H]

A cache fuelline writes reads back here to the same arrays, and a cache written here reads back
through CacheDataset to the same arrays: so both sides agree with the description, not just with
each other.
"""

import json
import struct

import numpy as np
import pytest
import torch

from fuelline.cache.dataset import CacheCollator, CacheDataset, widen_hidden
from fuelline.cache.inspect import cache_info, verify_cache

from .synthetic import write_cache

RECORD = struct.Struct("<QIIQQQQQ")
FIELDS = ("input_ids", "attention_mask", "loss_mask", "target_hidden_states", "target_last_hidden_states")
HIDDEN_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def read_v2(path) -> list[dict]:
    """Every sample of a version-2 cache as numpy arrays (hidden states as raw uint16 / uint8 bits)."""
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["version"] == 2 and manifest["index_record_size"] == RECORD.size == 56
    assert manifest["token_dtype"] == "int32" and manifest["mask_dtype"] == "uint8"
    layers, hidden = len(manifest["target_layer_ids"]), manifest["hidden_size"]
    bits = np.dtype("<u2") if HIDDEN_BYTES[manifest["hidden_dtype"]] == 2 else np.dtype("u1")
    files = {shard["shard_id"]: (path / shard["file_name"]).read_bytes() for shard in manifest["shards"]}
    assert len(files) == manifest["num_shards"]
    index = (path / "samples.idx").read_bytes()
    assert len(index) == RECORD.size * manifest["num_samples"]
    samples = []
    for position, record in enumerate(RECORD.iter_unpack(index)):
        sample_id, shard_id, seq_len, *offsets = record
        assert sample_id == position
        data = files[shard_id]
        specs = [("<i4", (seq_len,)), ("u1", (seq_len,)), ("u1", (seq_len,)), (bits, (seq_len, layers * hidden)),
                 (bits, (seq_len, hidden))]
        sample, end = {}, offsets[0]
        for name, offset, (dtype, shape) in zip(FIELDS, offsets, specs):
            assert offset == end, f"sample {sample_id}: {name} is not right after the field before it"
            count = int(np.prod(shape))
            sample[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
            end = offset + count * np.dtype(dtype).itemsize
        assert end <= len(data)
        samples.append(sample)
    return samples


def write_v2(path, samples: list[dict], *, layer_ids, hidden_size, hidden_dtype, num_shards, target_model):
    """The same layout, written by hand: samples dealt to shards in turn, packed back to back."""
    path.mkdir(parents=True)
    shards, index = [bytearray() for _ in range(num_shards)], bytearray()
    for sample_id, sample in enumerate(samples):
        shard_id = sample_id % num_shards
        shard, seq_len = shards[shard_id], len(sample["input_ids"])
        offsets = []
        for name in FIELDS:
            offsets.append(len(shard))
            shard += np.ascontiguousarray(sample[name]).tobytes()
        index += RECORD.pack(sample_id, shard_id, seq_len, *offsets)
    names = [f"part-{k}.bin" for k in range(num_shards)]  # any plain name: the manifest says which
    for name, shard in zip(names, shards):
        (path / name).write_bytes(shard)
    (path / "samples.idx").write_bytes(index)
    manifest = {"version": 2, "num_samples": len(samples), "num_shards": num_shards,
                "target_layer_ids": list(layer_ids), "hidden_dtype": hidden_dtype, "token_dtype": "int32",
                "mask_dtype": "uint8", "index_record_size": 56, "hidden_size": hidden_size,
                "shards": [{"shard_id": k, "file_name": name} for k, name in enumerate(names)],
                "target_model_name_or_path": target_model}
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def random_samples(seed: int, count: int, layers: int, hidden: int, hidden_bytes: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        n = int(rng.integers(1, 30))
        if hidden_bytes == 2:  # bf16 bits: the top half of float32s (truncation is a valid bf16)
            def hidden_bits(cols):
                return (rng.standard_normal((n, cols)).astype("<f4").view("<u4") >> 16).astype("<u2")
        else:  # fp8 bits, finite in both e4m3 and e5m2 (below 0x7C in magnitude), either sign
            def hidden_bits(cols):
                return rng.integers(0, 0x7C, (n, cols), dtype=np.uint8) | (rng.integers(0, 2, (n, cols), dtype=np.uint8)
                                                                            << 7)
        samples.append({"input_ids": rng.integers(0, 2**31 - 1, n).astype("<i4"),
                        "attention_mask": np.ones(n, dtype="u1"),
                        "loss_mask": rng.integers(0, 2, n).astype("u1"),
                        "target_hidden_states": hidden_bits(layers * hidden),
                        "target_last_hidden_states": hidden_bits(hidden)})
    return samples


def test_the_independent_reader_reads_what_fuelline_writes(tmp_path):
    written = write_cache(tmp_path, fmt="deepspec-v2", num_samples=17, num_shards=4, hidden_size=6)
    read = read_v2(tmp_path)
    assert len(read) == len(written)
    for got, expected in zip(read, written):
        for name in FIELDS:
            assert got[name].dtype == expected[name].dtype and np.array_equal(got[name], expected[name])


@pytest.mark.parametrize("hidden_dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_fuelline_reads_what_the_independent_writer_writes(tmp_path, hidden_dtype, io):
    samples = random_samples(7, 13, 2, 5, HIDDEN_BYTES[hidden_dtype])
    path = tmp_path / "v2"
    write_v2(path, samples, layer_ids=[3, 11], hidden_size=5, hidden_dtype=hidden_dtype, num_shards=3,
             target_model="someone/else")
    assert verify_cache(path) == []
    info = cache_info(path)
    assert info["tokens"] == sum(len(s["input_ids"]) for s in samples)
    assert info["supervised_tokens"] == sum(int(s["loss_mask"].sum()) for s in samples)
    dataset = CacheDataset(path, io=io)
    dtype = getattr(torch, hidden_dtype)
    bits, np_bits = (torch.int16, "<i2") if HIDDEN_BYTES[hidden_dtype] == 2 else (torch.uint8, "u1")
    assert len(dataset) == 13 and dataset.target_layer_ids == [3, 11] and dataset.hidden_size == 5
    for i, expected in enumerate(samples):
        got = dataset[i]
        assert set(got) == {"input_ids", "loss_mask", "target_hidden_states", "target_last_hidden_states"}
        assert torch.equal(got["input_ids"], torch.from_numpy(expected["input_ids"]))
        assert torch.equal(got["loss_mask"], torch.from_numpy(expected["loss_mask"]))
        for name in ("target_hidden_states", "target_last_hidden_states"):
            assert got[name].dtype == dtype
            assert torch.equal(got[name].view(bits), torch.from_numpy(expected[name].view(np_bits)))
    batch = CacheCollator()([dataset[i] for i in range(4)])
    wide = widen_hidden(batch)
    assert wide["target_hidden_states"].dtype == torch.bfloat16
    assert torch.equal(wide["target_hidden_states"], batch["target_hidden_states"].to(torch.bfloat16))
