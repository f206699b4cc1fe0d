"""Dedup at scale: millions of synthetic documents with planted duplicates, on 2 workers.

Shows the memory arithmetic of the README holding: peak resident memory of the parent
(which holds the per-document arrays) and of the largest worker, time per step, and whether
the planted exact and near duplicates are found.

    python benchmarks/bench_dedup_scale.py [--docs 3000000] [--workers 2]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from common import SMOKE_RECORDS, MemoryPeaks, parse_args, write_result

from fuelline.dedup.stage import DedupStage
from fuelline.pipeline.executor import RunOptions, run_stage

HAN_FIRST, HAN_COUNT = 0x4E00, 6000


def generate(path: Path, docs: int, seed: int = 0) -> dict:
    """Unique texts of 80–120 Han characters; 8% exact copies and 8% near copies (one character
    changed: Jaccard of 5-grams ≥ 0.88) of one of the last 100,000 texts."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(3, size=docs, p=[0.84, 0.08, 0.08])  # 0 unique, 1 exact copy, 2 near copy
    kinds[0] = 0
    texts: collections.deque[str] = collections.deque(maxlen=100_000)
    with open(path, "wb") as f:
        for start in range(0, docs, 100_000):
            chunk = []
            for i in range(start, min(start + 100_000, docs)):
                if kinds[i] == 0 or not texts:
                    length = int(rng.integers(80, 121))
                    text = "".join(map(chr, (HAN_FIRST + rng.integers(0, HAN_COUNT, length)).tolist()))
                else:
                    text = texts[int(rng.integers(0, len(texts)))]
                    if kinds[i] == 2:
                        chars = list(text)
                        position = int(rng.integers(0, len(chars)))
                        chars[position] = chr(HAN_FIRST + (ord(chars[position]) - HAN_FIRST + 1) % HAN_COUNT)
                        text = "".join(chars)
                texts.append(text)
                chunk.append(orjson.dumps({"id": f"d{i}", "text": text}))
            f.write(b"\n".join(chunk) + b"\n")
    return {"planted_exact": int((kinds == 1).sum()), "planted_near": int((kinds == 2).sum())}


def dedup(source: Path, workers: int) -> dict:
    """Run the stage (in a process of its own, so peak memory is the dedup's alone)."""
    with MemoryPeaks() as peaks:
        started = time.perf_counter()
        stats = run_stage(DedupStage(), source, source.parent / "out", RunOptions(workers=workers, progress=False))
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 1), "stats": stats, **peaks.result()}


def in_child(*args: str) -> dict:
    child = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return orjson.loads(child.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--generate", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--dedup", metavar="PATH", help=argparse.SUPPRESS)
    args = parse_args(parser)
    if args.smoke:
        args.docs = SMOKE_RECORDS
    if args.generate or args.dedup:
        result = generate(Path(args.generate), args.docs) if args.generate else dedup(Path(args.dedup), args.workers)
        print(orjson.dumps(result).decode())
        return
    base = Path(tempfile.mkdtemp(prefix="fuelline-dedup-scale-"))
    try:
        source = base / "docs.jsonl"
        started = time.perf_counter()
        planted = in_child("--docs", str(args.docs), "--generate", str(source))
        print(f"generated {args.docs:,} documents ({source.stat().st_size / 1e9:.2f} GB) in "
              f"{time.perf_counter() - started:.0f} s: {planted}")
        run = in_child("--workers", str(args.workers), "--dedup", str(source))
        stats = run.pop("stats")
        print(f"dedup: {run['seconds']:.0f} s, {args.docs / run['seconds']:,.0f} docs/s; peak memory (MiB): "
              f"parent {run['peak_parent_anon_mib']:,} anonymous, {run['peak_parent_rss_mib']:,} resident with "
              f"mapped files; largest worker {run['peak_worker_anon_mib']:,} anonymous")
        print(stats["dedup"])
        path = write_result("dedup_scale", {
            "documents": args.docs, "workers": args.workers, **run, "docs_per_s": round(args.docs / run["seconds"]),
            "planted": planted, "dropped": stats["dropped"], "dedup": stats["dedup"]})
        print(f"wrote {path}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
