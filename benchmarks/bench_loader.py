"""Random-window loading speed on the packed real corpus: fuelline's loader against nanoGPT-style
memmap batches, Megatron-core's GPTDataset and litData, in one process and with DataLoader workers.

Data (setup, not timed): the real poetry corpus cleaned (`CleanStage`, 2 workers), a 4,096-token
tokenizer trained on it, packed with the poetry template (`PackConfig()`) into `train/` (~28.6 M
uint16 tokens with a loss mask); `--packed DIR` reuses a pack output. Every tool reads those
tokens: Megatron through `export_megatron` (byte for byte the same .bin, the mask dropped), litData
through `litdata.optimize` with its `TokensLoader` (one item per document, chunks of 2,048 blocks).

Every measurement: windows of 1,024 tokens, batches of 32, the best of 3 runs of `--batches`
(2,000) batches. A run is what a training loop sees: each epoch (~873 batches here, every tool
holds ~27,900 windows) starts a new iterator, and with workers a new set of worker processes,
so a run of 2,000 batches crosses 2 epoch boundaries; `restart_s` is the time between one epoch's
last batch and the next one's first (the first epoch: from the start), worker shutdown and
start-up included, and `steady` the rate without it. What each returns:

- memmap gather (the floor): `tokens[starts[:, None] + arange(1024)]` on an `np.memmap` at random
  window-aligned starts, widened to an int64 tensor. Ids only.
- nanoGPT-style `get_batch`: random offsets, x = tokens[i:i+T], y = tokens[i+1:i+T+1], each row
  widened with `torch.from_numpy(...astype(int64))` and stacked. Ids, with y pre-shifted; no mask.
- fuelline: `make_loader(TokenDataset(train, 1024), 32, seed=0)`: `input_ids` and `labels` (-100
  where the mask bit is 0), int64, not shifted; `document_aware=True` adds `position_ids` and
  `cu_seqlens`; also with 1 and 2 workers; and, as a diagnostic, with its page release off (it
  drops the pages it read every ~8 M tokens, so that a long run's memory stays flat).
- Megatron-core: `GPTDataset` built by `BlendedMegatronDatasetBuilder` (split "100,0,0", seed 0,
  `reset_position_ids`, `reset_attention_mask` and `eod_mask_loss` False, Megatron-LM's defaults)
  read through `DataLoader(batch_size=32, shuffle=True)`: `tokens`, pre-shifted `labels`,
  `loss_mask` (float, all ones: the export has no mask), `position_ids` and, by default
  (`create_attention_mask=True`), a (1, 1024, 1024) bool causal mask per sample: 32 MiB per batch.
  No mask bits: labels cannot carry the template's mask. Its index building (document, sample
  and shuffle index .npy files) is timed apart, cold (files built) and warm (files loaded).
- litData: `StreamingDataset(item_loader=TokensLoader(block_size=1025), shuffle=True)` +
  `StreamingDataLoader(batch_size=32)`: a uint16 (32, 1025) tensor (1,024 inputs + 1 target
  token, as litGPT uses it), made training-ready in the loop as litGPT does, x = [:, :-1].long(),
  y = [:, 1:].long(). Ids only. Its shuffle permutes chunks, then the items of the chunks in play.
- worker hand-over floor: a DataLoader whose dataset returns a ready batch (two uninitialized
  int64 (32, 1024) tensors, 512 KiB) at no cost, with 1 and 2 workers: what moving a batch from
  a worker to the main process costs by itself, the ceiling of any loader that uses workers.

Before each timed run (and the setup) the machine must be otherwise idle: over 2 s while this
one sleeps, the CPU in use under 15 % of the machine (/proc/stat), and no other process (`ps`,
/proc/PID/stat) using a tenth of a core, nor a pytest or benchmark using 2 % (one that is itself
waiting for an idle machine does not count); otherwise it waits (polls every 30 s, up to 20 min),
then measures anyway and says so in the result. The 1-minute load average is recorded but not
used to decide: it counts this benchmark's own previous run.

    benchmarks/.venv/bin/python benchmarks/bench_loader.py [--packed DIR] [--batches 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np

from common import SHARED_DATA, corpus_head, parse_args, peer_available, write_result

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"
SEQ_LEN, BATCH, REPEATS, BATCHES = 1024, 32, 3, 2000
LITDATA_BLOCK = SEQ_LEN + 1
LITDATA_CHUNK_TOKENS = LITDATA_BLOCK * 2048  # ~4 MiB of uint16 per chunk, 14 chunks
IDLE_SHARE, IDLE_POLL_S, IDLE_WAIT_S, IDLE_WINDOW_S = 0.15, 30, 20 * 60, 2.0
HEAVY = re.compile(r"pytest|bench_\w+\.py|gpu_prefetch\.py|fuelline\s+(run|clean|dedup|pack|tokenizer)")
TARGETS = {"samples_per_s": 300_000, "vs_megatron": 30.0, "vs_litdata": 3.0}


# ---- setup (not timed) ------------------------------------------------------------------------

def build_pack(work: Path, corpus: Path = CORPUS) -> tuple[Path, dict]:
    """Clean, tokenizer, pack: the real corpus as fuelline's training data. Returns train/ and seconds."""
    from fuelline.clean.stage import CleanStage
    from fuelline.pack.packer import PackConfig, pack
    from fuelline.pipeline.executor import RunOptions, run_stage
    from fuelline.tokenizer.train import train_tokenizer

    seconds = {}
    start = time.perf_counter()
    run_stage(CleanStage(), corpus, work / "clean", RunOptions(workers=2, progress=False))
    seconds["clean"] = time.perf_counter() - start
    start = time.perf_counter()
    train_tokenizer(work / "clean", work / "tokenizer", vocab_size=4096)
    seconds["tokenizer"] = time.perf_counter() - start
    start = time.perf_counter()
    pack(work / "clean", work / "tokenizer", work / "packed", PackConfig(), workers=2, progress=False)
    seconds["pack"] = time.perf_counter() - start
    return work / "packed" / "train", seconds


class MegatronTokenizer:
    """What GPTDataset reads of a tokenizer: vocab size, end-of-document and pad ids, and an
    identity for its cache hash. It never tokenizes (the data is already ids)."""

    def __init__(self, manifest: dict):
        self.vocab_size, self.eod = manifest["vocab_size"], manifest["eos_id"]
        self.pad = manifest["tokenizer"].get("special_tokens", {}).get("<pad>", -1)
        self.unique_identifiers = {"class": "fuelline-manifest", "vocab_size": self.vocab_size,
                                   "eod": self.eod, "pad": self.pad}


def build_megatron(train: Path, work: Path, manifest: dict) -> tuple[dict, dict]:
    """Export, then GPTDataset twice (default attention mask, and without): the first build
    writes the index files (cold), the second loads them (the cache key ignores the mask option)."""
    from fuelline.formats.megatron import export_megatron

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed", at import
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefix = work / "megatron" / "train"
    prefix.parent.mkdir()
    start = time.perf_counter()
    export_megatron(train, prefix)
    seconds = {"export": time.perf_counter() - start}
    datasets = {}
    for label, create_mask in (("cold", True), ("warm", False)):
        config = GPTDatasetConfig(random_seed=0, sequence_length=SEQ_LEN, blend=([str(prefix)], None), split="100,0,0",
                                  tokenizer=MegatronTokenizer(manifest), reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=create_mask,
                                  path_to_cache=str(work / "megatron" / "cache"))
        start = time.perf_counter()
        datasets[create_mask] = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True,
                                                              config).build()[0]
        seconds[f"index_build_{label}"] = time.perf_counter() - start
    return datasets, seconds


def litdata_documents(item: tuple[str, int, int]):
    """litData's optimize function: the documents first..last-1 of a token dataset, one item each."""
    from fuelline.formats.tokens import TokenFiles

    path, first, last = item
    files = TokenFiles(path)
    offsets = files.offsets
    for k in range(first, last):
        yield np.array(files.tokens[int(offsets[k]):int(offsets[k + 1])])


def build_litdata(train: Path, work: Path, num_documents: int) -> tuple[Path, dict]:
    import multiprocessing

    from litdata import TokensLoader, optimize

    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(work / "litdata-cache" / "chunks")  # not the system temp dir
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(work / "litdata-cache" / "data")
    step = 20_000
    inputs = [(str(train), first, min(first + step, num_documents)) for first in range(0, num_documents, step)]
    output = work / "litdata"
    start = time.perf_counter()
    optimize(fn=litdata_documents, inputs=inputs, output_dir=str(output), chunk_size=LITDATA_CHUNK_TOKENS,
             item_loader=TokensLoader(), num_workers=2, verbose=False)
    seconds = time.perf_counter() - start
    # optimize() sets the process-wide start method to spawn (force=True); every DataLoader after it
    # would then start its workers by spawn (seconds each, re-importing torch). Back to the default.
    multiprocessing.set_start_method(None, force=True)
    return output, {"optimize": seconds}


def attention_mask_stack_ms(repeats: int = 7) -> dict:
    """What Megatron's default attention mask costs the collate: stacking 32 (1, T, T) bool masks,
    32 MiB, into fresh memory (what default_collate does in the main process) and into a reused
    buffer. Fastest of `repeats`; the gap is the cost of first-touching 32 MiB of new pages."""
    import torch

    mask = torch.tril(torch.ones(SEQ_LEN, SEQ_LEN)).unsqueeze(0) < 0.5
    fresh, reused = [], []
    out = torch.empty((BATCH, 1, SEQ_LEN, SEQ_LEN), dtype=torch.bool)
    for _ in range(repeats):
        start = time.perf_counter()
        stacked = torch.stack([mask] * BATCH)
        fresh.append(time.perf_counter() - start)
        del stacked
        start = time.perf_counter()
        torch.stack([mask] * BATCH, out=out)
        reused.append(time.perf_counter() - start)
    return {"bytes_per_batch": int(out.numel()), "stack_fresh_ms": round(min(fresh) * 1e3, 2),
            "stack_fresh_median_ms": round(sorted(fresh)[repeats // 2] * 1e3, 2),
            "stack_reused_ms": round(min(reused) * 1e3, 2)}


# ---- sanity: the same tokens everywhere --------------------------------------------------------

def check_same_tokens(tokens: np.ndarray, files, megatron: dict, litdata_dir: Path | None) -> dict:
    from fuelline.loader import TokenDataset, check_alignment

    batch = TokenDataset(files.directory, SEQ_LEN).__getitems__([0, 7, len(tokens) // SEQ_LEN - 1])
    check_alignment(batch)
    first_doc = megatron[False].dataset.get(0)
    if not np.array_equal(first_doc, tokens[:int(files.offsets[1])]):
        raise AssertionError("Megatron's first document differs from the token dataset's")
    if litdata_dir is None:  # a smoke run without litData
        return {"windows": {"fuelline": len(tokens) // SEQ_LEN, "megatron": len(megatron[False])},
                "megatron_doc0_equal": True}
    from litdata import StreamingDataset, TokensLoader

    stream = StreamingDataset(str(litdata_dir), item_loader=TokensLoader(block_size=LITDATA_BLOCK))
    item = np.asarray(stream[0])
    candidates = np.flatnonzero(tokens[:-LITDATA_BLOCK] == item[0])
    found = [int(c) for c in candidates if np.array_equal(tokens[c:c + LITDATA_BLOCK], item)]
    if not found:
        raise AssertionError("litData's first block is not a window of the token stream")
    return {"windows": {"fuelline": len(tokens) // SEQ_LEN, "megatron": len(megatron[False]),
                        "litdata": len(stream)},
            "litdata_item0_at_token": found[0], "megatron_doc0_equal": True}


# ---- the loaders under test: each returns (one epoch's iterable, rows of a batch) ---------------

def memmap_floor(tokens_path: Path, dtype):
    tokens = np.memmap(tokens_path, dtype=dtype, mode="r")
    windows, span = len(tokens) // SEQ_LEN, np.arange(SEQ_LEN)
    rng = np.random.default_rng(0)

    def batches():
        import torch

        while True:
            starts = rng.integers(0, windows, BATCH) * SEQ_LEN
            yield torch.from_numpy(tokens[starts[:, None] + span].astype(np.int64))

    return batches, len


def nanogpt_style(tokens_path: Path, dtype):
    import torch

    tokens = np.memmap(tokens_path, dtype=dtype, mode="r")
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            offsets = torch.randint(len(tokens) - SEQ_LEN - 1, (BATCH,), generator=generator).tolist()
            x = torch.stack([torch.from_numpy(tokens[i:i + SEQ_LEN].astype(np.int64)) for i in offsets])
            y = torch.stack([torch.from_numpy(tokens[i + 1:i + 1 + SEQ_LEN].astype(np.int64)) for i in offsets])
            yield x, y

    return batches, lambda batch: len(batch[0])


def fuelline_loader(train: Path, *, document_aware: bool = False, workers: int = 0, release: bool = True):
    """`release=False` (a diagnostic): the dataset keeps the pages it read mapped, instead of
    dropping them every ~8 M tokens, which makes the next windows fault them in again."""
    from fuelline.loader import TokenDataset, make_loader

    dataset = TokenDataset(train, SEQ_LEN, document_aware=document_aware)
    if not release:
        dataset.files.release = lambda: None
    loader = make_loader(dataset, BATCH, seed=0, num_workers=workers)
    return (lambda: loader), lambda batch: len(batch["input_ids"])


class ReadyBatches:
    """A dataset whose batches cost nothing to make (two uninitialized int64 (32, 1024) tensors):
    through DataLoader workers it measures the workers' hand-over alone (shared memory, pickling,
    the queue), a floor for any loader that runs in workers."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices) -> dict:
        import torch

        shape = (len(indices), SEQ_LEN)
        return {"input_ids": torch.empty(shape, dtype=torch.int64), "labels": torch.empty(shape, dtype=torch.int64)}


def as_is(batch):
    return batch


def worker_handover(length: int, workers: int):
    from torch.utils.data import DataLoader

    loader = DataLoader(ReadyBatches(length), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers,
                        collate_fn=as_is)
    return (lambda: loader), lambda batch: len(batch["input_ids"])


def megatron_loader(dataset, *, workers: int = 0):
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers)
    return (lambda: loader), lambda batch: len(batch["tokens"])


def litdata_loader(directory: Path, *, workers: int = 0):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    dataset = StreamingDataset(str(directory), item_loader=TokensLoader(block_size=LITDATA_BLOCK), shuffle=True,
                               drop_last=True, seed=0)
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers, drop_last=True)

    def rows(batch):
        x, y = batch[:, :-1].long(), batch[:, 1:].long()  # training-ready, as litGPT does in its loop
        return len(x) if len(y) == len(x) else 0

    return (lambda: loader), rows


# ---- timing --------------------------------------------------------------------------------------

def others() -> dict[int, str]:
    """pid -> command line of every process (`ps`) but this benchmark, its children and the shells
    that started it."""
    listing = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    rows = []
    for line in listing.splitlines():
        pid, ppid, *args = line.split(None, 2)
        rows.append((int(pid), int(ppid), args[0] if args else ""))
    ours = {os.getpid()}
    for _ in range(3):  # children, grandchildren
        ours |= {pid for pid, ppid, _ in rows if ppid in ours}
    parent, pid = {pid: ppid for pid, ppid, _ in rows}, os.getpid()
    while pid in parent and parent[pid] not in ours:
        pid = parent[pid]
        ours.add(pid)
    return {pid: args for pid, _, args in rows if pid not in ours}


def cpu_ticks(pids) -> dict[int, int]:
    ticks = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone
            continue
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def machine_ticks() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # total, idle + iowait


def load_of_others(seconds: float = 2.0) -> tuple[float, list[str]]:
    """While this process sleeps: the share of the machine's CPU in use (everyone else's), and the
    processes that used over a tenth of a core, heavy ones by name (pytest, benchmarks) over 2 %.
    A benchmark that is itself waiting for an idle machine is not counted against this one."""
    candidates = others()
    before, (total0, idle0) = cpu_ticks(candidates), machine_ticks()
    time.sleep(seconds)
    after, (total1, idle1) = cpu_ticks(candidates), machine_ticks()
    share = 1.0 - (idle1 - idle0) / max(1, total1 - total0)
    cores = {pid: (after[pid] - before[pid]) / os.sysconf("SC_CLK_TCK") / seconds for pid in after if pid in before}
    busy = [f"{pid} {used:.0%} of a core: {candidates[pid][:80]}" for pid, used in cores.items()
            if used > 0.1 or (used > 0.02 and HEAVY.search(candidates[pid]))]
    return share, busy


def wait_until_idle(what: str, wait: bool = True) -> dict:
    waited, start = 0.0, time.perf_counter()
    while True:
        share, busy = load_of_others(IDLE_WINDOW_S)
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
        if share < IDLE_SHARE and not busy:
            return {"others_cpu_share": round(share, 3), "load1": load1, "waited_s": round(waited), "idle": True}
        if waited >= IDLE_WAIT_S or not wait:
            print(f"  still busy after {waited:.0f} s, measuring {what} anyway: {share:.0%} CPU {busy}", flush=True)
            return {"others_cpu_share": round(share, 3), "load1": load1, "waited_s": round(waited), "idle": False,
                    "busy_with": busy}
        print(f"  busy before {what} (others {share:.0%} CPU, load {load1}, {busy[:3]}): waiting", flush=True)
        time.sleep(IDLE_POLL_S)
        waited = time.perf_counter() - start


def timed_run(epoch, rows, batches: int) -> dict:
    """`batches` batches from successive epochs, each a fresh iterator, as a training loop draws
    them. `restart_s`: the gaps between an epoch's last batch (or the start) and the next epoch's
    first, which hold the workers' shutdown and start-up."""
    done = samples = epochs = 0
    restart = 0.0
    start = last = time.perf_counter()
    while done < batches:
        first = True
        iterator = iter(epoch())
        for batch in iterator:
            if first:
                restart += time.perf_counter() - last
                first = False
            samples += rows(batch)
            done += 1
            last = time.perf_counter()
            if done == batches:
                break
        if first:
            raise RuntimeError("an epoch yielded no batch")
        epochs += 1
    seconds = time.perf_counter() - start
    del iterator  # worker shutdown after the clock
    steady = (samples - epochs * BATCH) / max(1e-9, seconds - restart)
    return {"seconds": seconds, "samples": samples, "epochs": epochs, "restart_s": restart,
            "samples_per_s": samples / seconds, "steady_samples_per_s": steady}


def measure(name: str, make, batches: int, wait: bool = True) -> dict:
    """Best of REPEATS runs, each on a freshly built loader, each after an idle check."""
    runs, load = [], []
    for _ in range(REPEATS):
        load.append(wait_until_idle(name, wait))
        epoch, rows = make()
        runs.append(timed_run(epoch, rows, batches))
        del epoch, rows
    best = max(runs, key=lambda r: r["samples_per_s"])
    row = {"samples_per_s": round(best["samples_per_s"]), "steady_samples_per_s": round(best["steady_samples_per_s"]),
           "seconds": round(best["seconds"], 3), "restart_s": round(best["restart_s"], 3),
           "epochs": best["epochs"], "batches": batches, "samples": best["samples"],
           "all_runs_samples_per_s": [round(r["samples_per_s"]) for r in runs],
           "idle_checks": load}
    print(f"  {name:<44} {row['samples_per_s']:>10,}/s  steady {row['steady_samples_per_s']:>10,}/s  "
          f"runs {row['all_runs_samples_per_s']}", flush=True)
    return row


# ---- the run -------------------------------------------------------------------------------------

def cases(train: Path, dtype, megatron: dict, litdata_dir: Path | None) -> dict:
    """name -> (tool, workers, what a batch holds, labels from the mask bits?, loader factory)."""
    tokens = train / "tokens.bin"
    windows = len(megatron[False])
    ids_only, megatron_returns = "int64 ids only", "tokens, pre-shifted labels, loss_mask (all ones), position_ids"
    return {
        "memmap gather (floor)": ("floor", 0, ids_only, False, lambda: memmap_floor(tokens, dtype)),
        "nanoGPT-style get_batch": ("nanogpt", 0, "int64 x and pre-shifted y, no mask", False,
                                    lambda: nanogpt_style(tokens, dtype)),
        "fuelline": ("fuelline", 0, "input_ids, labels (-100 from mask bits)", True, lambda: fuelline_loader(train)),
        "fuelline, pages kept (diagnostic)": ("fuelline", 0, "input_ids, labels", True,
                                              lambda: fuelline_loader(train, release=False)),
        "fuelline document_aware": ("fuelline", 0, "input_ids, labels, position_ids, cu_seqlens", True,
                                    lambda: fuelline_loader(train, document_aware=True)),
        "fuelline, 1 worker": ("fuelline", 1, "input_ids, labels", True, lambda: fuelline_loader(train, workers=1)),
        "fuelline, 2 workers": ("fuelline", 2, "input_ids, labels", True, lambda: fuelline_loader(train, workers=2)),
        "worker hand-over floor, 1 worker": ("torch", 1, "uninitialized int64 ids and labels", False,
                                             lambda: worker_handover(windows, 1)),
        "worker hand-over floor, 2 workers": ("torch", 2, "uninitialized int64 ids and labels", False,
                                              lambda: worker_handover(windows, 2)),
        "megatron, attention mask (default)": ("megatron", 0, megatron_returns + ", attention_mask (1,T,T bool)",
                                               False, lambda: megatron_loader(megatron[True])),
        "megatron, create_attention_mask=False": ("megatron", 0, megatron_returns, False,
                                                  lambda: megatron_loader(megatron[False])),
        "megatron, attention mask (default), 2 workers": ("megatron", 2, megatron_returns + ", attention_mask", False,
                                                          lambda: megatron_loader(megatron[True], workers=2)),
        "megatron, create_attention_mask=False, 2 workers": ("megatron", 2, megatron_returns, False,
                                                             lambda: megatron_loader(megatron[False], workers=2)),
        "litdata": ("litdata", 0, "uint16 (32, 1025) block -> int64 x, y in the loop", False,
                    lambda: litdata_loader(litdata_dir)),
        "litdata, 2 workers": ("litdata", 2, "uint16 block -> int64 x, y", False,
                               lambda: litdata_loader(litdata_dir, workers=2)),
    }


def targets(rows: dict) -> dict:
    ours = rows["fuelline"]["samples_per_s"]
    out = {"fuelline_samples_per_s": {"target": TARGETS["samples_per_s"], "value": ours,
                                      "met": ours >= TARGETS["samples_per_s"]}}
    for peer, key, target in (("megatron, create_attention_mask=False", "vs_megatron", TARGETS["vs_megatron"]),
                              ("megatron, attention mask (default)", "vs_megatron_default", TARGETS["vs_megatron"]),
                              ("litdata", "vs_litdata", TARGETS["vs_litdata"])):
        if peer not in rows:  # litData not installed (a smoke run)
            continue
        ratio = ours / rows[peer]["samples_per_s"]
        out[key] = {"target": target, "value": round(ratio, 1), "met": ratio >= target, "peer": peer}
    for workers in (1, 2):
        row = rows[f"fuelline, {workers} worker{'s' if workers > 1 else ''}"]
        ratio, steady = row["samples_per_s"] / ours, row["steady_samples_per_s"] / rows["fuelline"]["steady_samples_per_s"]
        out[f"no_slowdown_{workers}_workers"] = {"target": ">= 0.95 of 0 workers", "value": round(ratio, 3),
                                                 "steady_value": round(steady, 3), "met": ratio >= 0.95}
    return out


def report(rows: dict, setup: dict, sanity: dict, mask_cost: dict, args) -> None:
    ours = rows["fuelline"]["samples_per_s"]
    print(f"\n{'loader':<50} {'samples/s':>11} {'steady/s':>11} {'restart s':>9} {'fuelline ÷':>10}  labels")
    for name, row in rows.items():
        row["fuelline_ratio"] = round(ours / row["samples_per_s"], 2)
        print(f"{name:<50} {row['samples_per_s']:>11,} {row['steady_samples_per_s']:>11,} {row['restart_s']:>9.3f} "
              f"{row['fuelline_ratio']:>9.2f}x  {'mask bits' if row['labels_from_mask'] else 'ids only'}")
    print("\nsetup (s): " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in setup.items()))
    met = targets(rows)
    for key, value in met.items():
        print(f"target {key}: {value['value']} (target {value['target']}) {'met' if value['met'] else 'NOT met'}")
    result = {"corpus": CORPUS.name, "seq_len": SEQ_LEN, "batch_size": BATCH, "repeats": REPEATS,
              "batches_per_run": args.batches, "litdata_block_size": LITDATA_BLOCK,
              "litdata_chunk_tokens": LITDATA_CHUNK_TOKENS, "reused_pack": args.packed is not None,
              "setup_seconds": {k: round(v, 3) if isinstance(v, float) else v for k, v in setup.items()},
              "same_tokens": sanity, "megatron_attention_mask_collate": mask_cost, "loaders": rows, "targets": met,
              "versions": {n: version(n) for n in ("fuelline", "torch", "numpy", "numba", "megatron-core", "litdata")
                           if n != "litdata" or "litdata" in rows}}
    if args.batches < BATCHES and not args.smoke:
        print("fewer batches than the benchmark's 2,000: no result file written")
        return
    print(f"wrote {write_result('loader', result)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packed", default=None, help="a pack output directory (holding train/) to reuse")
    parser.add_argument("--batches", type=int, default=BATCHES, help="batches per timed run")
    parser.add_argument("--only", default=None, help="only the loaders whose name contains this (no result file)")
    parser.add_argument("--no-wait", action="store_true", help="measure even on a busy machine (no result file)")
    args = parse_args(parser)
    if args.smoke:  # a few batches, crossing two epochs, once each, without waiting for an idle machine
        global REPEATS, IDLE_WINDOW_S
        args.batches, args.no_wait, REPEATS, IDLE_WINDOW_S = 10, True, 1, 0.1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temp dir is removed
    if args.packed is None and not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus (or --packed DIR)")
    from fuelline.formats.tokens import TokenFiles

    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        work = Path(tmp)
        if args.packed is not None:
            train, setup = Path(args.packed) / "train", {}
        else:
            wait_until_idle("the setup", not args.no_wait)  # 2 busy workers would disturb another benchmark
            print("setup: clean, tokenizer, pack (2 workers)", flush=True)
            train, setup = build_pack(work, corpus_head() if args.smoke else CORPUS)
        files = TokenFiles(train)
        megatron, seconds = build_megatron(train, work, files.manifest)
        setup.update({f"megatron_{k}": v for k, v in seconds.items()})
        litdata_dir = None
        if peer_available("litdata"):
            litdata_dir, seconds = build_litdata(train, work, files.num_documents)
            setup.update({f"litdata_{k}": v for k, v in seconds.items()})
        sanity = check_same_tokens(np.asarray(files.tokens), files, megatron, litdata_dir)
        print(f"{files.num_tokens:,} tokens, {files.num_documents:,} documents; windows {sanity['windows']}", flush=True)
        wait_until_idle("the attention-mask stack", not args.no_wait)
        mask_cost = attention_mask_stack_ms()
        print(f"Megatron attention mask per batch: {mask_cost}", flush=True)
        rows = {}
        for name, (tool, workers, returns, with_mask, make) in cases(train, files.dtype, megatron, litdata_dir).items():
            if (args.only and args.only not in name) or (tool == "litdata" and litdata_dir is None):
                continue
            rows[name] = {"tool": tool, "workers": workers, "returns": returns, "labels_from_mask": with_mask,
                          **measure(name, make, args.batches, not args.no_wait)}
    if (args.only or args.no_wait) and not args.smoke:
        for name, row in rows.items():
            print(name, {k: v for k, v in row.items() if k != "idle_checks"})
        return
    report(rows, setup, sanity, mask_cost, args)


if __name__ == "__main__":
    main()
