"""Read throughput of the real poetry corpus (JSONL.zst) on one core, against the usual way.

Baseline: `zstandard` stream reader wrapped in a TextIOWrapper, `json.loads` per line, which is
what most corpus tools do. fuelline: `fuelline.io.read_records`. Both parse every record into a
dict; the process is pinned to one core so a decompression thread could not help either side.

    python benchmarks/bench_read.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

import zstandard

from common import SHARED_DATA, best_of, corpus_head, parse_args, write_result

from fuelline.io import read_records

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"


def baseline(corpus: Path) -> int:
    count = 0
    with open(corpus, "rb") as f:
        for line in io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8"):
            if line.strip():
                json.loads(line)
                count += 1
    return count


def fuelline_reader(corpus: Path) -> int:
    return sum(1 for _ in read_records(corpus))


def decompressed_bytes(corpus: Path) -> int:
    with open(corpus, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        return sum(len(chunk) for chunk in iter(lambda: reader.read(1 << 20), b""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    corpus = corpus_head() if args.smoke else CORPUS
    size = decompressed_bytes(corpus)
    rows = {}
    for name, fn in [("zstandard + json.loads per line", baseline), ("fuelline read_records", fuelline_reader)]:
        seconds, records = best_of(lambda: fn(corpus), args.repeats)
        rows[name] = {"seconds": round(seconds, 3), "records": records, "decompressed_MB_per_s": round(size / seconds / 1e6, 1)}
        print(f"{name:<34} {records:>8,} records  {seconds:6.2f} s  {size / seconds / 1e6:7.1f} MB/s")
    names = list(rows)
    ratio = rows[names[0]]["seconds"] / rows[names[1]]["seconds"]
    print(f"fuelline / baseline throughput: {ratio:.2f}x")
    path = write_result("read", {"corpus": CORPUS.name, "decompressed_bytes": size, "cores_used": 1,
                                 "repeats": args.repeats, "results": rows, "speedup_vs_baseline": round(ratio, 2)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
