"""Does training wait for data? `examples/train_poetry.py` for a fixed number of steps on the
packed real corpus, measuring the data-wait share of step time (target: under 1%) and tokens/s.

Data (setup, not timed): the real poetry corpus cleaned, a 4,096-token tokenizer and the poetry
template pack, built as `bench_loader.py` builds them (`--packed DIR` reuses a pack output).
Training: the example's defaults (2 layers, dim 64, windows of 128 tokens, batches of 16,
`make_loader` in the main process, `CUDAPrefetcher`) for `--steps` steps (500), validating every
100 (not timed), on CUDA when there is a GPU, else on the CPU. The data wait is the time blocked
fetching the next batch; its share is that time over the steps' wall time, which includes
waiting for the GPU (`loss.item()` each step), so time a GPU sits idle for want of a batch
counts. Waits for an idle machine first, as `bench_loader.py` does.

    python benchmarks/bench_train_poetry.py [--packed DIR] [--steps 500]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from bench_loader import CORPUS, build_pack, wait_until_idle
from common import ROOT, corpus_head, parse_args, write_result

STEPS, EVAL_EVERY, TARGET_WAIT_SHARE = 500, 100, 0.01


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packed", type=Path, help="a pack output directory (train/ and val/) to reuse")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--no-wait", action="store_true", help="measure even on a busy machine (no result file)")
    args = parse_args(parser)
    if args.smoke:
        args.steps, args.no_wait = 5, True
    if args.packed is None and not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus (or --packed DIR)")
    sys.path.insert(0, str(ROOT / "examples"))
    from train_poetry import main as train

    with tempfile.TemporaryDirectory(prefix="bench-train-poetry-") as tmp:
        packed, setup = args.packed, {}
        if packed is None:
            wait_until_idle("the setup", not args.no_wait)
            print("setup: clean, tokenizer, pack (2 workers)", flush=True)
            train_dir, setup = build_pack(Path(tmp), corpus_head() if args.smoke else CORPUS)
            packed = train_dir.parent
        idle = wait_until_idle("training", not args.no_wait)
        metrics = train(["--data", str(packed), "--steps", str(args.steps), "--eval-every", str(EVAL_EVERY)])
    share = metrics["data_wait_share"]
    met = share < TARGET_WAIT_SHARE
    print(f"{metrics['device']}: {metrics['tokens_per_s']:,.0f} tokens/s, data wait {share:.3%} of step time "
          f"(target < {TARGET_WAIT_SHARE:.0%}: {'met' if met else 'NOT met'}); val loss {metrics['val_loss']:.3f}, "
          f"unigram entropy {metrics['unigram_entropy']:.3f} nats")
    if args.no_wait and not args.smoke:
        return
    result = {"corpus": CORPUS.name, "reused_pack": args.packed is not None,
              "setup_seconds": {k: round(v, 3) for k, v in setup.items()}, "device": metrics["device"],
              "steps": metrics["steps"], "config": {k: v for k, v in metrics["config"].items() if k not in ("data", "json_out")},
              "tokens_per_s": round(metrics["tokens_per_s"]), "data_wait_share": round(share, 5),
              "train_loss": round(metrics["train_loss"], 4), "val_loss": round(metrics["val_loss"], 4),
              "unigram_entropy": round(metrics["unigram_entropy"], 4), "idle_check": idle,
              "targets": {"data_wait_share": {"target": f"< {TARGET_WAIT_SHARE}", "value": round(share, 5),
                                              "met": met}},
              "versions": {n: version(n) for n in ("fuelline", "torch", "numpy", "numba")}}
    print(f"wrote {write_result('train_poetry', result)}")


if __name__ == "__main__":
    main()
