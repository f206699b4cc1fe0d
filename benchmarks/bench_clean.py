"""Clean the full real poetry corpus (poetry profile) on 2 workers: docs/s and the funnel.

    python benchmarks/bench_clean.py [--workers 2] [--convert none|t2s]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from common import SHARED_DATA, corpus_head, parse_args, write_result

from fuelline.clean.stage import CleanConfig, CleanStage
from fuelline.pipeline.executor import RunOptions, run_stage

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--convert", default="none")
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    corpus = corpus_head() if args.smoke else CORPUS
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        stats = run_stage(CleanStage(CleanConfig(convert=args.convert)), corpus, out,
                          RunOptions(workers=args.workers, progress=False))
        seconds = time.perf_counter() - start
    docs_per_s = stats["records_in"] / seconds
    print(f"{stats['records_in']:,} records in {seconds:.1f} s on {args.workers} workers: {docs_per_s:,.0f} docs/s")
    print(f"{'reason':<26}{'records':>10}{'share':>9}")
    for reason, n in sorted(stats["dropped"].items(), key=lambda kv: -kv[1]):
        print(f"{reason:<26}{n:>10,}{n / stats['records_in']:>9.2%}")
    print(f"{'kept':<26}{stats['records_out']:>10,}{stats['records_out'] / stats['records_in']:>9.2%}")
    path = write_result(f"clean{'-' + args.convert if args.convert != 'none' else ''}", {
        "corpus": CORPUS.name, "workers": args.workers, "convert": args.convert, "seconds": round(seconds, 2),
        "docs_per_s": round(docs_per_s), "stats": stats})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
