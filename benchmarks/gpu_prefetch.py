"""CUDAPrefetcher on a real GPU: same batches as the CPU path, errors at the right batch, position
for resuming, host-to-device bandwidth and how much of the copy the prefetcher hides.

For any machine with CUDA and a CUDA build of torch (the torch 2.13.0 wheel a stock Linux index
gives; see "Installing torch" in the README); about a minute. Without CUDA it says so and exits
with 0 (`--smoke`, the test's quick run: it times the CPU loader alone first).

    python benchmarks/gpu_prefetch.py [--packed DIR] [--batches 200] [--step-ms 2]

Data: a synthetic token dataset written with `TokenDatasetWriter` in a temp dir (4 M uint16
tokens, documents of 20 to 3,000 tokens, a loss mask masking each document's first fifth), or
`--packed DIR` (a pack output: DIR/train). Windows of 1,024 tokens, batches of 32. Checks:

1. identical: every batch of one epoch through `CUDAPrefetcher(make_loader(...), "cuda")` equals,
   after `.cpu()`, the plain CPU loader's batch (same seed): input_ids, labels and, with
   `document_aware`, position_ids and cu_seqlens; same dtypes, on the GPU. The GPU batches are
   all kept and compared at the end, with a matmul between batches, so a pinned buffer reused
   too early or device memory handed out again would show. Three loaders: pinned by the
   DataLoader (the default with a GPU), unpinned (staged into the prefetcher's pinned buffers),
   document-aware.
2. error at its batch: a loader that raises after N batches; the prefetcher must deliver those N
   batches, equal to the plain ones, and then raise the loader's own exception.
3. resume position: after k batches taken through the prefetcher, `loader.state_dict()` must
   say k batches, as the plain loader does (a prefetcher that reads ahead must not make a resumed
   run skip the batch it held).

Measured: host-to-device copy of a 64 MiB tensor, pinned and pageable (GB/s, best of 10, CUDA
events); and overlap: `--batches` batches each followed by a fake training step (a matmul loop
calibrated to `--step-ms`), without the prefetcher (pageable `.to("cuda")` of each batch, then
the step) and with it. The share of the copy hidden is 1 - (prefetched - compute) / (plain -
compute), where compute is the same steps on a batch already on the GPU.

Prints a JSON summary and writes benchmarks/results/gpu_prefetch.json; exits with 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import parse_args, write_result

SEQ_LEN, BATCH = 1024, 32
SYNTHETIC_TOKENS, VOCAB = 4 << 20, 32_000
COPY_BYTES = 64 << 20
FAIL_AFTER, RESUME_AFTER = 5, 3


def synthetic_dataset(directory: Path) -> Path:
    import numpy as np

    from fuelline.formats.tokens import TokenDatasetWriter

    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 3000, SYNTHETIC_TOKENS // 1500)
    ids = rng.integers(0, VOCAB, int(lengths.sum()), dtype=np.int64)
    position = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    mask = position >= np.repeat(lengths // 5, lengths)  # each document's first fifth is not trained on
    writer = TokenDatasetWriter(directory, dtype="uint16", vocab_size=VOCAB, bos_id=None, eos_id=None,
                                tokenizer={"name": "synthetic"}, with_mask=True)
    writer.add_documents(ids, lengths, mask)
    writer.close()
    return directory


def loader(path: Path, **options):
    from fuelline.loader import TokenDataset, make_loader

    document_aware = options.pop("document_aware", False)
    return make_loader(TokenDataset(path, SEQ_LEN, document_aware=document_aware), BATCH, seed=0, **options)


def differences(gpu_batch: dict, cpu_batch: dict) -> list[str]:
    import torch

    found = []
    if set(gpu_batch) != set(cpu_batch):
        found.append(f"keys {sorted(gpu_batch)} vs {sorted(cpu_batch)}")
    for key, expected in cpu_batch.items():
        value = gpu_batch.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type != "cuda":
            found.append(f"{key} on {value.device}")
        if value.dtype != expected.dtype or not torch.equal(value.cpu(), expected):
            found.append(f"{key} differs ({value.dtype} vs {expected.dtype})")
    return found


def check_identical(path: Path, work) -> dict:
    """One epoch per loader variant; GPU batches kept until the end, then compared."""
    from fuelline.loader import CUDAPrefetcher

    out = {}
    for name, options in (("pinned_by_dataloader", {"pin_memory": True}), ("unpinned", {"pin_memory": False}),
                          ("document_aware", {"document_aware": True, "pin_memory": False})):
        kept = []
        for batch in CUDAPrefetcher(loader(path, **options), "cuda"):
            work()
            kept.append(batch)
        expected = list(loader(path, **{**options, "pin_memory": False}))
        problems = [f"batch {k}: {p}" for k, (g, c) in enumerate(zip(kept, expected)) for p in differences(g, c)]
        if len(kept) != len(expected):
            problems.append(f"{len(kept)} batches through the prefetcher, {len(expected)} plain")
        out[name] = {"batches": len(kept), "ok": not problems, "problems": problems[:5]}
    return out


def check_error(path: Path) -> dict:
    from fuelline.loader import CUDAPrefetcher

    class LoaderFailure(RuntimeError):
        pass

    def failing(batches):
        for k, batch in enumerate(batches):
            if k == FAIL_AFTER:
                raise LoaderFailure(f"the loader failed at batch {k}")
            yield batch

    delivered, raised = [], None
    try:
        for batch in CUDAPrefetcher(failing(loader(path, pin_memory=False)), "cuda"):
            delivered.append(batch)
    except LoaderFailure as error:
        raised = error
    expected = [b for _, b in zip(range(FAIL_AFTER), loader(path, pin_memory=False))]
    same = len(delivered) == FAIL_AFTER and all(not differences(g, c) for g, c in zip(delivered, expected))
    return {"fail_after": FAIL_AFTER, "delivered_before_error": len(delivered), "raised": repr(raised),
            "ok": raised is not None and same}


def check_resume(path: Path) -> dict:
    from fuelline.loader import CUDAPrefetcher

    positions = {}
    for name in ("plain", "prefetched"):
        source = loader(path, pin_memory=False)
        batches = CUDAPrefetcher(source, "cuda") if name == "prefetched" else source
        for k, _ in enumerate(batches, 1):
            if k == RESUME_AFTER:
                positions[name] = source.state_dict()["position"]
                break
    return {"after_batches": RESUME_AFTER, "expected_position": RESUME_AFTER * BATCH, **positions,
            "ok": positions.get("prefetched") == RESUME_AFTER * BATCH}


def bandwidth() -> dict:
    import torch

    out = {}
    device = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    for name, pinned in (("pinned", True), ("pageable", False)):
        host = torch.ones(COPY_BYTES, dtype=torch.uint8, pin_memory=pinned)
        best = float("inf")
        for _ in range(11):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            device.copy_(host, non_blocking=pinned)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        out[f"{name}_GB_per_s"] = round(COPY_BYTES / best / 1e9, 2)
    return out


def make_step(step_ms: float):
    """A fake training step on the GPU: a matmul loop taking about `step_ms`, which reads the batch."""
    import torch

    a = torch.randn(2048, 2048, device="cuda")

    def run(iterations: int, batch=None) -> None:
        x = a
        for _ in range(iterations):
            x = torch.tanh(x @ a)
        if batch is not None:
            x[0, 0] += batch["input_ids"][0, 0].float()

    run(3)
    torch.cuda.synchronize()
    start = time.perf_counter()
    run(50)
    torch.cuda.synchronize()
    iterations = max(1, round(step_ms / ((time.perf_counter() - start) * 1e3 / 50)))
    return lambda batch=None: run(iterations, batch), iterations


def loader_seconds(path: Path, batches: int) -> float:
    """The plain loader's time for `batches` batches on the CPU: what the prefetcher's copies overlap with."""
    import itertools

    start = time.perf_counter()
    for _ in itertools.islice(loader(path, pin_memory=False), batches):
        pass
    return time.perf_counter() - start


def overlap(path: Path, batches: int, step_ms: float) -> dict:
    import itertools

    import torch

    from fuelline.loader import CUDAPrefetcher

    step, iterations = make_step(step_ms)

    def timed(source, prepare):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in itertools.islice(source, batches):
            step(prepare(batch))
        torch.cuda.synchronize()
        return time.perf_counter() - start

    loader_only = loader_seconds(path, batches)
    resident = {k: v.to("cuda") for k, v in next(iter(loader(path))).items()}
    plain_copy = lambda b: {k: v.to("cuda") for k, v in b.items()}
    compute = timed(itertools.repeat(resident), lambda b: b)
    plain = timed(loader(path, pin_memory=False), plain_copy)
    prefetched = timed(CUDAPrefetcher(loader(path, pin_memory=False), "cuda"), lambda b: b)
    per_batch = lambda seconds: round(seconds / batches * 1e3, 4)
    hidden = 1 - (prefetched - compute) / (plain - compute) if plain > compute else None
    return {"batches": batches, "step_matmuls": iterations, "compute_ms_per_batch": per_batch(compute),
            "plain_ms_per_batch": per_batch(plain), "prefetched_ms_per_batch": per_batch(prefetched),
            "exposed_plain_ms_per_batch": per_batch(plain - compute),
            "exposed_prefetched_ms_per_batch": per_batch(prefetched - compute),
            "loader_cpu_ms_per_batch": per_batch(loader_only),
            "share_of_copy_hidden": None if hidden is None else round(hidden, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packed", default=None, help="a pack output directory (holding train/)")
    parser.add_argument("--batches", type=int, default=200, help="batches of the overlap measurement")
    parser.add_argument("--step-ms", type=float, default=2.0, help="duration of the fake training step")
    args = parse_args(parser)
    import torch

    if args.smoke:
        args.batches = 20
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to check; run this on a machine with a GPU")
        if args.smoke:  # CUDA absent: the CPU side alone
            with tempfile.TemporaryDirectory(prefix="gpu-prefetch-") as tmp:
                seconds = loader_seconds(synthetic_dataset(Path(tmp) / "tokens"), args.batches)
            per_batch_ms = seconds / args.batches * 1e3
            print(f"CPU loader alone: {per_batch_ms:.2f} ms per batch of {BATCH} x {SEQ_LEN}")
            write_result("gpu_prefetch", {"cuda": False, "loader_cpu_ms_per_batch": round(per_batch_ms, 4)})
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-prefetch-") as tmp:
        path = Path(args.packed) / "train" if args.packed else synthetic_dataset(Path(tmp) / "tokens")
        step, _ = make_step(0.5)
        summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "data": "packed" if args.packed else f"synthetic {SYNTHETIC_TOKENS:,} tokens",
                   "identical": check_identical(path, step), "error_at_batch": check_error(path),
                   "resume_position": check_resume(path), "host_to_device": bandwidth(),
                   "overlap": overlap(path, args.batches, args.step_ms)}
    checks = [*summary["identical"].values(), summary["error_at_batch"], summary["resume_position"]]
    summary["all_checks_ok"] = all(c["ok"] for c in checks)
    print(json.dumps(summary, indent=2))
    print(f"wrote {write_result('gpu_prefetch', summary)}")
    return 0 if summary["all_checks_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
