"""Tokenizer training, raw encoding, fuelline's pack and datatrove's tokenizer on the real poetry corpus.

Setup (not timed): the corpus is cleaned once (`CleanStage`, poetry profile, 2 workers) into a
temporary directory; every step below reads those document records ({"id", "text", "meta"}).

1. `train_tokenizer` (vocab 4096) for each pre-tokenization: its train seconds, its tokens per
   character on a 50k sample, and tokens per character over the whole corpus (encode_batch here).
2. Raw encoding of the poem texts with the han-chars tokenizer, in batches of 4096 texts (pack's
   batch size), with 1 and 2 threads, best of 2: HF `Tokenizer.encode_batch`, and fuelline's
   `FastEncoder.encode_batch` (tiktoken's BPE core on the same ranks, what pack uses).
3. `pack` end to end (poetry template, metadata dropout 0.25, val 0.05, han-chars tokenizer) in
   workers x threads 1x1, 1x2, 2x1 (fastest of 2 runs), and 2x1 with FUELLINE_ENCODER=tokenizers
   (pack before tiktoken): wall seconds, output tokens/s (both splits), the encoder stats.json
   names, the ratio to the best raw encoding, and peak memory of the parent and of the largest worker. Pack's tokens include the metadata and special tokens (about 21% more than
   the poems' own), so the ratio of documents/s to raw encoding's is given as well. When a
   configuration is below 0.9 of raw, one shard's `encode_shard` is profiled (one thread).
4. Peak memory against corpus size: pack of 1x, 2x and 4x the corpus (copies of the cleaned
   records as JSONL, ids suffixed so they are distinct documents), 2 workers.
5. datatrove 0.10's `DocumentTokenizer` (same tokenizer.json, eos "</s>", no shuffling) after a
   `JsonlReader` of {"id", "text"} (two files), `LocalPipelineExecutor` tasks=2 workers=2, with
   RAYON_NUM_THREADS unset (2 threads in each worker) and =1, fastest of 2 runs each. It
   tokenizes only the text: no metadata template, no mask, one "</s>" per document.

Every timed configuration runs in a fresh process of this script (the tokenizers library sizes
its thread pool from RAYON_NUM_THREADS once, when it first starts it), after waiting until the
processes outside this benchmark use little CPU; the CPU they used during each run is recorded,
and a run disturbed by them is repeated.

    benchmarks/.venv/bin/python benchmarks/bench_pack.py [--skip-bytelevel] [--limit N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path

import orjson

from common import (SHARED_DATA, SMOKE_RECORDS, MemoryPeaks, descendants, machine, parse_args, peer_available,
                    write_result)

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"
MODES = ("han-chars", "han-pairs", "bytelevel")
VOCAB = 4096
BATCH = 4096  # texts per encode_batch call: packer.BATCH_SIZE
PACK_CONFIGS = ((1, 1, None), (1, 2, None), (2, 1, None), (2, 1, "tokenizers"))  # workers x threads, FUELLINE_ENCODER
SIZES = (1, 2, 4)
SCALE_WORKERS = 2
IDLE_CORES = 0.25  # other processes using more than this many cores: wait (before) or repeat (after)
IDLE_POLL_S, IDLE_WAIT_S, IDLE_WINDOW_S = 30, 20 * 60, 2.0
ATTEMPTS = 3
REPEATS = 2  # pack configurations and datatrove: the fastest of 2 runs


# --- /proc: memory of a process tree, CPU used by everything else ---------------------------------

def cpu_ticks() -> dict[int, int]:
    ticks = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def other_cores() -> float:
    """Cores used over IDLE_WINDOW_S seconds by the processes outside this benchmark."""
    hz, window = os.sysconf("SC_CLK_TCK"), IDLE_WINDOW_S
    before = cpu_ticks()
    time.sleep(window)
    after = cpu_ticks()
    mine = {os.getpid(), *descendants(os.getpid())}
    used = sum(t - before.get(pid, 0) for pid, t in after.items() if pid not in mine)
    return used / hz / window


class Background:
    """Mean cores used by processes outside this benchmark while a run goes on (sampled every second)."""

    def __init__(self):
        self.ticks, self.seconds = 0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        previous, at = cpu_ticks(), time.perf_counter()
        while not self._done.wait(1.0):
            current, now = cpu_ticks(), time.perf_counter()
            mine = {os.getpid(), *descendants(os.getpid())}
            self.ticks += sum(t - previous[pid] for pid, t in current.items() if pid in previous and pid not in mine)
            self.seconds += now - at
            previous, at = current, now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    @property
    def cores(self) -> float:
        return self.ticks / os.sysconf("SC_CLK_TCK") / self.seconds if self.seconds else 0.0


def wait_until_idle() -> float:
    """Poll every 30 s (up to 20 minutes) until other processes use under IDLE_CORES; return their use."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        busy = other_cores()
        if busy < IDLE_CORES or time.monotonic() > deadline:
            if busy >= IDLE_CORES:
                print(f"  machine still busy ({busy:.2f} other cores) after {IDLE_WAIT_S // 60} min: measuring anyway",
                      flush=True)
            return busy
        print(f"  waiting: other processes use {busy:.2f} cores", flush=True)
        time.sleep(IDLE_POLL_S)


def measured(fn, what: str):
    """fn() on an idle machine; repeated (up to ATTEMPTS) if other processes used CPU meanwhile.
    Returns the least disturbed result, with `background_cores` (mean other use during it) added."""
    best = None
    for attempt in range(ATTEMPTS):
        idle = wait_until_idle()
        with Background() as background:
            result = fn()
        result = {**result, "background_cores": round(background.cores, 2), "background_before": round(idle, 2)}
        if best is None or result["background_cores"] < best["background_cores"]:
            best = result
        if background.cores < IDLE_CORES:
            break
        print(f"  {what}: other processes used {background.cores:.2f} cores during the run; repeating", flush=True)
    return best


def fastest(fn, what: str, repeats: int) -> dict:
    """The fastest of `repeats` measured runs (wall `seconds`), with every run's seconds."""
    runs = [measured(fn, what) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "seconds_all": [r["seconds"] for r in runs]}


def in_child(*args: str, threads: int | None, engine: str | None = None) -> dict:
    """Run this script with `args` in a fresh process; RAYON_NUM_THREADS=threads (None: unset),
    FUELLINE_ENCODER=engine (None: unset, so pack uses tiktoken where it converts)."""
    env = dict(os.environ)
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("FUELLINE_ENCODER", None)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    if engine is not None:
        env["FUELLINE_ENCODER"] = engine
    child = subprocess.run([sys.executable, __file__, *map(str, args)], env=env, capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"child {args} failed:\n{child.stderr[-4000:]}")
    return orjson.loads(child.stdout.splitlines()[-1])


# --- the child processes ---------------------------------------------------------------------------

def read_texts(texts_dir: Path) -> list[str]:
    texts = []
    for path in sorted(texts_dir.glob("*.jsonl")):
        with open(path, "rb") as f:
            texts.extend(orjson.loads(line)["text"] for line in f)
    return texts


def child_encode(texts_dir: Path, tokenizer_json: Path) -> dict:
    """encode_batch over every text, BATCH at a time: best of 2; then once more taking the ids out
    as Python lists (what a packer has to do with each Encoding); then FastEncoder (tiktoken), best of 2."""
    from tokenizers import Tokenizer

    from fuelline.tokenizer.fast import FastEncoder

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    fast = FastEncoder(tokenizer)
    texts = read_texts(texts_dir)
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    tokenizer.encode_batch(batches[0], add_special_tokens=False)  # starts the thread pool

    def encode_only() -> int:
        return sum(sum(map(len, tokenizer.encode_batch(b, add_special_tokens=False))) for b in batches)

    def with_ids() -> int:
        return sum(sum(len(e.ids) for e in tokenizer.encode_batch(b, add_special_tokens=False)) for b in batches)

    def fast_encode() -> int:
        return sum(len(fast.encode_batch(b).ids) for b in batches)

    result = {"documents": len(texts), "characters": sum(map(len, texts)),
              "threads_env": os.environ.get("RAYON_NUM_THREADS"), "fast_engine": fast.reason}
    for name, fn, repeats in (("encode_batch", encode_only, 2), ("encode_batch_ids", with_ids, 1),
                              ("fast_encode_batch", fast_encode, 2)):
        best, tokens = float("inf"), 0
        for _ in range(repeats):
            started = time.perf_counter()
            tokens = fn()
            best = min(best, time.perf_counter() - started)
        result[name] = {"seconds": round(best, 3), "tokens": tokens, "tokens_per_s": round(tokens / best)}
    return result


def child_pack(inputs: list[Path], tokenizer_dir: Path, out: Path, workers: int, threads: int) -> dict:
    from fuelline.pack.packer import PackConfig, pack

    config = PackConfig(template="poetry", metadata_dropout=0.25, val_fraction=0.05, threads=threads)
    with MemoryPeaks() as watch:
        started = time.perf_counter()
        stats = pack(inputs, tokenizer_dir, out, config, workers=workers, restart=True, progress=False)
        seconds = time.perf_counter() - started
    splits = stats["splits"]
    tokens = sum(s["tokens"] for s in splits.values())
    documents = sum(s["documents"] for s in splits.values())
    return {
        "workers": workers, "threads": threads, "encoder": stats["encoder"], "seconds": round(seconds, 2),
        "stage_seconds": stats["seconds"],
        "documents": documents, "tokens": tokens, "tokens_per_s": round(tokens / seconds),
        "docs_per_s": round(documents / seconds),
        # poem tokens: the supervised ones less one "</s>" per document
        "text_tokens": sum(s["supervised_tokens"] for s in splits.values()) - documents,
        "splits": {k: {f: s[f] for f in ("documents", "tokens", "supervised_share", "metadata_dropout_share")}
                   for k, s in splits.items()},
        **watch.result(),
    }


def child_datatrove(texts_dir: Path, tokenizer_json: Path, out: Path) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    shutil.rmtree(out, ignore_errors=True)  # datatrove skips the tasks its logging folder says are done
    tokenize = DocumentTokenizer(str(out / "tokens"), tokenizer_name_or_path=str(tokenizer_json), eos_token="</s>",
                                 shuffle_documents=False)
    executor = LocalPipelineExecutor(pipeline=[JsonlReader(str(texts_dir)), tokenize], tasks=2, workers=2,
                                     logging_dir=str(out / "logs"))
    with MemoryPeaks() as watch:
        started = time.perf_counter()
        executor.run()
        seconds = time.perf_counter() - started
    files = sorted((out / "tokens").glob("*.ds"))
    tokens = sum(f.stat().st_size for f in files) // tokenize.token_size
    documents = sum((f.parent / f"{f.name}.index").stat().st_size // 8 for f in files)
    return {"seconds": round(seconds, 2), "tokens": tokens, "documents": documents,
            "tokens_per_s": round(tokens / seconds), "docs_per_s": round(documents / seconds),
            "token_bytes": tokenize.token_size, "files": [f.name for f in files],
            "threads_env": os.environ.get("RAYON_NUM_THREADS"), **watch.result()}


def child_profile(source: Path, tokenizer_dir: Path, work: Path) -> dict:
    """cProfile of `encode_shard` on the first shard of `source`, in this process, one thread."""
    from fuelline.pack.packer import PackConfig, encode_shard
    from fuelline.pipeline.executor import RunOptions
    from fuelline.pipeline.shards import plan_shards
    from fuelline.pipeline.workers import RunOptions

    config = PackConfig(template="poetry", metadata_dropout=0.25, val_fraction=0.05)
    shard = plan_shards([source], RunOptions().shard_size)[0]
    run = lambda d: encode_shard(shard, tokenizer_path=str(tokenizer_dir / "tokenizer.json"), config=config,  # noqa: E731
                                 workdir=d, threads=1, dtype="uint16")
    (work / "warm").mkdir(parents=True)
    run(work / "warm")  # loads the tokenizer, starts its pool
    (work / "plain").mkdir()
    started = time.perf_counter()
    marker = run(work / "plain")
    plain = time.perf_counter() - started
    (work / "profiled").mkdir()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(run, work / "profiled")
    profiled = time.perf_counter() - started
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        rows.append({"function": where, "calls": calls, "tottime": round(tottime, 3), "cumtime": round(cumtime, 3)})
    rows.sort(key=lambda r: -r["tottime"])
    return {"shard_documents": marker["documents"], "shard_tokens": marker["tokens"], "seconds": round(plain, 3),
            "tokens_per_s": round(marker["tokens"] / plain), "profiled_seconds": round(profiled, 3),
            "top_tottime": rows[:15], "encode_calls": encode_breakdown(shard, tokenizer_dir / "tokenizer.json")}


def encode_breakdown(shard, tokenizer_json: Path) -> dict:
    """The four encode_batch calls of the poetry template (poem, title, author, dynasty) on the
    shard's records, timed one field at a time, BATCH records a call, as the template makes them."""
    from tokenizers import Tokenizer

    from fuelline.io.readers import iter_file_records
    from fuelline.pack.templates import DYNASTY_NAMES

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    records = [r for _, r in iter_file_records(shard.source, start=shard.start, stop=shard.stop)]
    metas = [r.get("meta") or {} for r in records]
    fields = {
        "poem": [r["text"] for r in records],
        "title": [str(m.get("title") or "") for m in metas],
        "author": [str(m.get("author") or "") for m in metas],
        "dynasty": [DYNASTY_NAMES.get(m.get("dynasty"), str(m.get("dynasty") or "")) for m in metas],
    }
    out = {}
    for name, texts in fields.items():
        started = time.perf_counter()
        tokens = sum(sum(len(e.ids) for e in tokenizer.encode_batch(texts[i:i + BATCH], add_special_tokens=False))
                     for i in range(0, len(texts), BATCH))
        seconds = time.perf_counter() - started
        out[name] = {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds),
                     "texts_per_s": round(len(texts) / seconds)}
    return out


# --- setup --------------------------------------------------------------------------------------

def clean_corpus(base: Path, limit: int | None) -> Path:
    from fuelline.clean.stage import CleanStage
    from fuelline.io import read_records
    from fuelline.pipeline.executor import RunOptions, run_stage

    source = CORPUS
    if limit is not None:
        source = base / "raw.jsonl"
        with open(source, "wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for _, r in zip(range(limit), read_records(CORPUS)))
    run_stage(CleanStage(), source, base / "clean", RunOptions(workers=2, progress=False))
    return base / "clean"


def write_copies(records: list[dict], directory: Path, copies: int) -> list[Path]:
    """`copies` JSONL files of the records; copy k > 0 has ids suffixed `~k` (distinct documents)."""
    directory.mkdir()
    paths = []
    for k in range(copies):
        path = directory / f"copy-{k}.jsonl"
        with open(path, "wb") as f:
            f.writelines(orjson.dumps({**r, "id": r["id"] if k == 0 else f"{r['id']}~{k}"}) + b"\n" for r in records)
        paths.append(path)
    return paths


def write_texts(records: list[dict], directory: Path) -> None:
    """{"id", "text"} JSONL in two halves: datatrove gives each of its 2 tasks whole files."""
    directory.mkdir()
    half = (len(records) + 1) // 2
    for k, part in enumerate((records[:half], records[half:])):
        with open(directory / f"docs-{k}.jsonl", "wb") as f:
            f.writelines(orjson.dumps({"id": r["id"], "text": r["text"]}) + b"\n" for r in part)


def corpus_tokens_per_char(tokenizer_json: Path, texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokens = sum(sum(map(len, tokenizer.encode_batch(texts[i:i + BATCH], add_special_tokens=False)))
                 for i in range(0, len(texts), BATCH))
    return tokens / sum(map(len, texts))


# --- the run --------------------------------------------------------------------------------------

def run_all(args, base: Path) -> dict:
    from fuelline.io import read_records
    from fuelline.tokenizer.train import train_tokenizer

    started = time.perf_counter()
    clean = clean_corpus(base, args.limit)
    records = list(read_records(clean))
    texts = [r["text"] for r in records]
    write_texts(records, base / "texts")
    copies = write_copies(records, base / "copies", max(SIZES))
    print(f"setup: {len(records):,} cleaned documents, {sum(map(len, texts)):,} characters "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    result = {"corpus": CORPUS.name, "documents": len(records), "characters": sum(map(len, texts)),
              "limit": args.limit}
    del records

    # 1. tokenizer training
    training = {}
    for mode in MODES:
        if mode == "bytelevel" and args.skip_bytelevel:
            continue
        out = base / f"tokenizer-{mode}"

        def train(mode=mode, out=out) -> dict:
            shutil.rmtree(out, ignore_errors=True)
            report = train_tokenizer(clean, out, vocab_size=VOCAB, pretokenize=mode)
            return {k: report[k] for k in ("train_seconds", "tokens_per_char", "vocab_size", "documents",
                                           "isolated_share")}

        row = measured(train, f"train {mode}")
        row["tokens_per_char_corpus"] = round(corpus_tokens_per_char(out / "tokenizer.json", texts), 4)
        training[mode] = row
        print(f"train {mode:<9} {row['train_seconds']:7.1f} s, tokens/char {row['tokens_per_char_corpus']:.4f} "
              f"(sample {row['tokens_per_char']:.4f})", flush=True)
    result["training"] = training
    del texts
    tokenizer_dir = base / "tokenizer-han-chars"
    tokenizer_json = tokenizer_dir / "tokenizer.json"

    # 2. raw encode_batch
    raw = {}
    for threads in (1, 2):
        raw[threads] = measured(lambda t=threads: in_child("--encode", base / "texts", "--tokenizer", tokenizer_json,
                                                          threads=t), f"encode {threads} threads")
        print(f"encode_batch, {threads} thread(s): {raw[threads]['encode_batch']['tokens_per_s']:,} tokens/s "
              f"({raw[threads]['encode_batch_ids']['tokens_per_s']:,} with the ids as lists); FastEncoder "
              f"{raw[threads]['fast_encode_batch']['tokens_per_s']:,} tokens/s", flush=True)
    # pack's own encoder is the reference: what pack keeps of raw encoding's speed
    best_raw = max(r["fast_encode_batch"]["tokens_per_s"] for r in raw.values())
    best_raw_docs = max(r["documents"] / r["fast_encode_batch"]["seconds"] for r in raw.values())
    result["raw_encode"] = {"batch_texts": BATCH, "threads": {str(t): r for t, r in raw.items()},
                            "best_tokens_per_s": best_raw, "best_docs_per_s": round(best_raw_docs)}

    # 3. pack: workers x threads
    configs = {}
    for workers, threads, engine in PACK_CONFIGS:
        out = base / "pack-out"
        name = f"{workers}x{threads}" + (f" {engine}" if engine else "")
        row = fastest(lambda w=workers, t=threads, e=engine: in_child(
            "--pack", clean, "--tokenizer", tokenizer_dir, "--out", out, "--workers", w, "--threads", t, threads=t,
            engine=e), f"pack {name}", REPEATS)
        shutil.rmtree(out, ignore_errors=True)
        row["ratio_to_best_raw"] = round(row["tokens_per_s"] / best_raw, 3)
        row["docs_per_s_ratio_to_best_raw"] = round(row["docs_per_s"] / best_raw_docs, 3)
        configs[name] = row
        print(f"pack {name}: {row['seconds']:.1f} s, {row['tokens_per_s']:,} tokens/s, ratio "
              f"{row['ratio_to_best_raw']:.2f}; peak anon parent {row['peak_parent_anon_mib']} MiB, worker "
              f"{row['peak_worker_anon_mib']} MiB", flush=True)
    result["pack"] = {"template": "poetry", "metadata_dropout": 0.25, "val_fraction": 0.05, "configs": configs}
    best = max(configs.values(), key=lambda r: r["tokens_per_s"])
    before = configs["2x1 tokenizers"]

    # where pack's time goes, when it is well below raw encoding
    if args.profile or min(r["ratio_to_best_raw"] for r in configs.values()) < 0.9:
        first = sorted(clean.glob("part-*"))[0]
        work = base / "profile"
        result["profile"] = in_child("--profile-shard", first, "--tokenizer", tokenizer_dir, "--out", work, threads=1)
        shutil.rmtree(work, ignore_errors=True)
        raw1 = raw[1]["encode_batch"]["tokens_per_s"]
        result["profile"]["ratio_to_raw_1_thread"] = round(result["profile"]["tokens_per_s"] / raw1, 3)

    # 4. memory against corpus size
    scale = {}
    for size in SIZES:
        out = base / "pack-out"
        row = measured(lambda n=size: in_child(
            "--pack", *copies[:n], "--tokenizer", tokenizer_dir, "--out", out, "--workers", SCALE_WORKERS,
            "--threads", 1, threads=1), f"pack {size}x corpus")
        shutil.rmtree(out, ignore_errors=True)
        scale[f"{size}x"] = row
        print(f"pack {size}x corpus ({row['documents']:,} docs): {row['seconds']:.1f} s; peak anon parent "
              f"{row['peak_parent_anon_mib']} MiB, worker {row['peak_worker_anon_mib']} MiB", flush=True)
    result["scale"] = {"workers": SCALE_WORKERS, "threads": 1, "input": "uncompressed JSONL copies", "sizes": scale}

    # 5. datatrove
    if not peer_available("datatrove"):
        return result
    peers = {}
    for label, threads in (("RAYON_NUM_THREADS unset", None), ("RAYON_NUM_THREADS=1", 1)):
        out = base / "datatrove-out"
        row = fastest(lambda t=threads: in_child("--datatrove", base / "texts", "--tokenizer", tokenizer_json,
                                                 "--out", out, threads=t), f"datatrove {label}", REPEATS)
        shutil.rmtree(out, ignore_errors=True)
        peers[label] = row
        print(f"datatrove ({label}): {row['seconds']:.1f} s, {row['tokens_per_s']:,} tokens/s", flush=True)
    best_peer = max(peers.values(), key=lambda r: r["tokens_per_s"])
    result["datatrove"] = {
        "runs": peers, "tasks": 2, "workers": 2, "eos_token": "</s>", "shuffle_documents": False,
        "note": "datatrove tokenizes only the text (no metadata template, no loss mask): one '</s>' per "
                "document; fuelline's pack also tokenizes title, author and dynasty and adds the special tokens, "
                "a mask, the split and metadata dropout",
        "fuelline_best_over_datatrove": {
            "tokens_per_s": round(best["tokens_per_s"] / best_peer["tokens_per_s"], 3),
            "docs_per_s": round(best["docs_per_s"] / best_peer["docs_per_s"], 3),
            "seconds": round(best_peer["seconds"] / best["seconds"], 3)},
        "fuelline_tokenizers_engine_over_datatrove": {"seconds": round(best_peer["seconds"] / before["seconds"], 3)},
    }
    return result


def versus(args, base: Path) -> dict:
    """Only pack (2 workers x 1 thread) and datatrove (RAYON_NUM_THREADS=1, its faster setting), in
    turn, `args.versus` rounds: the ratio of documents/s under the same conditions, round by round,
    in minutes instead of the full run's quarter hour (no training but han-chars, no idle waits)."""
    from fuelline.io import read_records
    from fuelline.tokenizer.train import train_tokenizer

    if not peer_available("datatrove"):  # a real run has stopped already, saying how to install it
        sys.exit("--versus compares pack with datatrove, which is not installed here")
    clean = clean_corpus(base, args.limit)
    write_texts(list(read_records(clean)), base / "texts")
    tokenizer_dir = base / "tokenizer-han-chars"
    train_tokenizer(clean, tokenizer_dir, vocab_size=VOCAB, pretokenize="han-chars")
    rounds = []
    for k in range(args.versus):
        ours = in_child("--pack", clean, "--tokenizer", tokenizer_dir, "--out", base / "pack-out", "--workers", 2,
                        "--threads", 1, threads=1)
        theirs = in_child("--datatrove", base / "texts", "--tokenizer", tokenizer_dir / "tokenizer.json",
                          "--out", base / "datatrove-out", threads=1)
        shutil.rmtree(base / "pack-out", ignore_errors=True)
        rounds.append({"fuelline_seconds": ours["seconds"], "datatrove_seconds": theirs["seconds"],
                       "docs_per_s_ratio": round(ours["docs_per_s"] / theirs["docs_per_s"], 2)})
        print(f"round {k + 1}: fuelline {ours['seconds']:.2f} s, datatrove {theirs['seconds']:.2f} s, "
              f"{rounds[-1]['docs_per_s_ratio']:.2f}x documents/s", flush=True)
    return {"corpus": CORPUS.name, "documents": ours["documents"], "limit": args.limit,
            "fuelline": "pack, poetry template, 2 workers x 1 thread", "datatrove": "DocumentTokenizer, 2 tasks, "
            "RAYON_NUM_THREADS=1", "rounds": rounds,
            "median_ratio": statistics.median(r["docs_per_s_ratio"] for r in rounds),
            "best_over_best": round(min(r["datatrove_seconds"] for r in rounds)
                                    / min(r["fuelline_seconds"] for r in rounds), 2)}


def table(result: dict) -> None:
    print("\n== tokenizer training (vocab 4096)")
    print(f"{'pretokenize':<11} {'train s':>8} {'tok/char':>9} {'(sample)':>9}")
    for mode, r in result["training"].items():
        print(f"{mode:<11} {r['train_seconds']:8.1f} {r['tokens_per_char_corpus']:9.4f} {r['tokens_per_char']:9.4f}")
    print(f"\n== raw encoding (han-chars, {BATCH} texts a call)")
    for t, r in result["raw_encode"]["threads"].items():
        print(f"{t} thread(s): HF encode_batch {r['encode_batch']['tokens_per_s']:>12,} tokens/s  "
              f"({r['encode_batch_ids']['tokens_per_s']:,} with ids as lists); FastEncoder "
              f"{r['fast_encode_batch']['tokens_per_s']:,} tokens/s")
    print("\n== pack (poetry template)")
    print(f"{'config':<15} {'s':>7} {'tokens/s':>11} {'ratio':>6} {'docs':>5} {'parent anon/rss MiB':>20} "
          f"{'worker anon/rss MiB':>20}   (ratio: tokens/s, docs: documents/s, to raw FastEncoder's best)")
    rows = [(k, r) for k, r in result["pack"]["configs"].items()]
    rows += [(f"2x1 {k}", r) for k, r in result["scale"]["sizes"].items()]
    for name, r in rows:
        ratio = (f"{r['ratio_to_best_raw']:6.2f} {r['docs_per_s_ratio_to_best_raw']:5.2f}" if "ratio_to_best_raw" in r
                 else " " * 12)
        print(f"{name:<15} {r['seconds']:7.1f} {r['tokens_per_s']:11,} {ratio} "
              f"{r['peak_parent_anon_mib']:>9,}/{r['peak_parent_rss_mib']:<10,} "
              f"{r['peak_worker_anon_mib']:>9,}/{r['peak_worker_rss_mib']:<10,}")
    if "datatrove" in result:
        print("\n== datatrove DocumentTokenizer (text only), tasks=2 workers=2")
        for label, r in result["datatrove"]["runs"].items():
            print(f"{label:<24} {r['seconds']:7.1f} s {r['tokens_per_s']:11,} tokens/s {r['docs_per_s']:9,} docs/s")
        print(f"fuelline best / datatrove best: {result['datatrove']['fuelline_best_over_datatrove']}")
    if "profile" in result:
        p = result["profile"]
        print(f"\n== encode_shard profile ({p['shard_documents']:,} docs, 1 thread): {p['tokens_per_s']:,} tokens/s, "
              f"{p['ratio_to_raw_1_thread']:.2f} of raw 1-thread")
        for row in p["top_tottime"][:10]:
            print(f"  {row['tottime']:7.3f} s {row['calls']:>9,}  {row['function']}")
        for name, row in p["encode_calls"].items():
            print(f"  encode_batch, {name:<8} {row['seconds']:6.2f} s, {row['tokens']:>10,} tokens, "
                  f"{row['texts_per_s']:>9,} texts/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bytelevel", action="store_true", help="do not train the GPT-2-style tokenizer (~3 min)")
    parser.add_argument("--profile", action="store_true", help="profile one shard's encode_shard even if pack is fast")
    parser.add_argument("--limit", type=int, default=None, help="only the first N raw records (a quick run, no result file)")
    parser.add_argument("--no-wait", action="store_true", help="measure at once, however busy the machine (a quick check)")
    parser.add_argument("--versus", type=int, default=0, metavar="ROUNDS",
                        help="only pack against datatrove, in turn, ROUNDS times (results/pack_versus.json)")
    parser.add_argument("--encode", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pack", type=Path, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--datatrove", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-shard", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parse_args(parser)
    child = None
    if args.encode:
        child = child_encode(args.encode, args.tokenizer)
    elif args.pack:
        child = child_pack(args.pack, args.tokenizer, args.out, args.workers, args.threads)
    elif args.datatrove:
        child = child_datatrove(args.datatrove, args.tokenizer, args.out)
    elif args.profile_shard:
        child = child_profile(args.profile_shard, args.tokenizer, args.out)
    if child is not None:
        print(orjson.dumps(child).decode())
        return
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    if args.smoke:  # every step once, on the first records, without waiting for an idle machine
        global IDLE_WINDOW_S, REPEATS, SIZES
        args.limit, args.no_wait = args.limit or SMOKE_RECORDS, True
        IDLE_WINDOW_S, REPEATS, SIZES = 0.1, 1, (1, 2)
    if args.no_wait:
        global IDLE_WAIT_S, ATTEMPTS
        IDLE_WAIT_S, ATTEMPTS = 0, 1
    base = Path(tempfile.mkdtemp(prefix="fuelline-bench-pack-"))
    if args.versus:
        try:
            result = versus(args, base)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(f"median {result['median_ratio']:.2f}x, best against best {result['best_over_best']:.2f}x")
        if args.limit is None or args.smoke:
            print(f"wrote {write_result('pack_versus', result)}")
        return
    try:
        result = run_all(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["versions"] = {n: version(n) for n in ("fuelline", "tokenizers", "datatrove", "numpy")
                          if n != "datatrove" or "datatrove" in result}
    result["machine"] = machine()
    table(result)
    if (args.limit is not None or args.no_wait) and not args.smoke:
        print("a --limit or --no-wait run: no result file written")
        return
    result.pop("machine")  # write_result adds it
    print(f"wrote {write_result('pack', result)}")


if __name__ == "__main__":
    main()
