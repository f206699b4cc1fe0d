"""The distillation pipeline on a CPU: `fuelline demo chat`, timed step by step (target: < 3 min).

Builds the demo's tiny model and sample in a temporary directory, runs chat-prepare →
regenerate (one `transformers serve` server, started and stopped by the run) → cache → report,
and records each step's wall time and counts, plus the whole run's, with the time to build the
model and start the server included in the total.

    python benchmarks/bench_chat_pipeline.py [--conversations 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from common import parse_args, write_result

from fuelline.chat.demo import CONVERSATIONS, run_chat_demo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=CONVERSATIONS)
    args = parse_args(parser)
    if args.smoke:
        args.conversations = 8
    work = Path(tempfile.mkdtemp(prefix="bench-chat-pipeline-"))
    try:
        started = time.perf_counter()
        _, stats = run_chat_demo(str(work), conversations=args.conversations, progress=False)
        total = time.perf_counter() - started
        steps = {s["stage"]: {"seconds": s["wall_seconds"], "in": s.get("records_in"), "out": s.get("records_out")}
                 for s in stats if "records_in" in s}
        regenerate = next(s for s in stats if s["stage"] == "regenerate")
        cache = next(s for s in stats if s["stage"] == "cache")["cache"]
        result = {"conversations": args.conversations, "total_seconds": round(total, 1), "steps": steps,
                  "requests": regenerate["counters"]["requests"],
                  "requests_per_s": round(regenerate["counters"]["requests"] / regenerate["wall_seconds"], 2),
                  "cache_tokens": cache["tokens"], "cache_bytes": cache["bytes"],
                  "other_seconds": round(total - sum(s["seconds"] for s in steps.values()), 1)}
        print(write_result("chat_pipeline", result).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
