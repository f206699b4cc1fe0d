"""The whole poetry pipeline (configs/poetry.toml) on the full real corpus: time per stage and
peak memory, on this machine's cores. Target: under 5 minutes in all.

    python benchmarks/bench_pipeline.py [--workers 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, SHARED_DATA, MemoryPeaks, corpus_head, parse_args, write_result

from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.report.funnel import format_funnel, load_funnel

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    corpus = corpus_head() if args.smoke else CORPUS
    run_dir = Path(tempfile.mkdtemp(prefix="fuelline-pipeline-")) / "run"
    try:
        with MemoryPeaks() as peaks:
            started = time.perf_counter()
            run_pipeline(load_pipeline(ROOT / "configs" / "poetry.toml"), run_dir, input=[str(corpus)],
                         workers=args.workers, progress=False)
            seconds = time.perf_counter() - started
        funnel = load_funnel(run_dir)
        print(format_funnel(funnel))
        print(f"\ntotal {seconds:.0f} s; peak memory (MiB): {peaks.result()}")
        path = write_result("pipeline", {
            "corpus": CORPUS.name, "workers": args.workers, "seconds": round(seconds, 1),
            "stage_seconds": {s["name"]: s["seconds"] for s in funnel["steps"]}, **peaks.result(),
            "funnel": funnel})
        print(f"wrote {path}")
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
