"""`fuelline cache build`: run the target once over the conversations and store its hidden states.

One process per GPU (`torchrun --nproc-per-node N -m fuelline cache build …`; one process
without torchrun). Rank 0 makes the plan (`plan.py`: encoding, shards, batches) and deals out
the unfinished shards; every rank loads the model and writes its shards (`writer.py`); rank 0
then merges: shard files moved into the cache directory, the shard indexes concatenated into
`samples.idx` (dense sample ids), `stats.json`, and `manifest.json` last. The ranks talk only
through the gloo backend (a barrier and a few small objects), so a CPU run with 2 ranks behaves
as a GPU run does.

Per batch, the main thread pads the batch's ids, runs the forward with the hooks, quantizes on
the device for fp8, and starts the copies to pinned host buffers; the writer thread waits for
those copies, then serializes and writes the unpadded positions of each sample. The forward of
the next batch runs meanwhile.

Interrupted at any point, the same command resumes: finished shards are kept, a partial one
continues after its last committed batch, with any number of ranks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import orjson

from fuelline.cache.capture import HiddenStateCapture, check_layer_ids
from fuelline.cache.plan import BUILD_DIR, CacheConfig, Plan, Shard, assign, layout_for, make_plan, \
    model_config, model_fingerprint, record_sizes, resolve_model
from fuelline.cache.writer import ShardWriter, WriteQueue
from fuelline.formats.target_cache import (BF16, DEEPSPEC_V2, DEEPSPEC_VERSION, FUELLINE_FORMAT_NAME,
                                           FUELLINE, FUELLINE_VERSION, INDEX, MANIFEST, MASK_DTYPE, SCALE_DTYPE,
                                           STATS, TOKEN_DTYPE, Layout, manifest_digest, seal_index, shard_name,
                                           write_manifest)
from fuelline.io.atomic import atomic_write, fsync_dir, write_bytes_atomic
from fuelline.io.lock import exclusive_output
from fuelline.io.paths import expand_inputs
from fuelline.pipeline.lifetime import die_with_parent
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.task import resumed
from fuelline.progress import progress_bar, transformers_bars
from fuelline.fingerprints import tokenizer_fingerprint



@dataclass
class Ranks:
    """This process's place among the ranks torchrun started (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Ranks":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        ranks = cls(int(os.environ.get("RANK", "0")), world_size, int(os.environ.get("LOCAL_RANK", "0")))
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank must not outlive a killed torchrun (it holds the output)
            die_with_parent(os.getppid())
        if world_size > 1:
            import torch.distributed as dist

            if not dist.is_initialized():  # ranks wait for each other through whole builds: no short timeout
                dist.init_process_group("gloo", timeout=timedelta(days=7))
        return ranks

    def share(self, value, source: int = 0):
        """`value` of rank `source`, on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=source)
        return box[0]

    def gather(self, value) -> list:
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def close(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def build_identity(model: str | os.PathLike, inputs: list[str], config: CacheConfig, name: str | None = None) -> dict:
    """What the cache's bytes depend on: options, model and tokenizer contents, the input files.
    `name`: the model as the user named it (a Hub id), when `model` is its resolved directory."""
    return {"config": config.identity(), "model": name or os.fspath(Path(model).resolve()),
            "model_fingerprint": model_fingerprint(model), "tokenizer_fingerprint": tokenizer_fingerprint(model),
            "inputs": describe_inputs(expand_inputs(inputs))}


def build_cache(model: str | os.PathLike, inputs: list[str], output: str | os.PathLike, config: CacheConfig,
                progress: bool = True) -> dict:
    """Build (or resume, or find finished) the cache at `output`; returns its stats (on every rank).

    `model`: a model directory or a Hub id (`resolve_model`)."""
    name, model = resolve_model(model)
    ranks = Ranks.from_env()
    output = Path(output)
    try:
        if ranks.rank == 0:
            with exclusive_output(output):
                return _run(ranks, (name, model), inputs, output, config, progress)
        return _run(ranks, (name, model), inputs, output, config, progress)
    finally:
        ranks.close()


def _on_rank_zero(ranks: Ranks, work):
    """`work()` run by rank 0 and its result on every rank; its error raised on every rank (as text
    beyond rank 0: an exception may not pickle)."""
    result, error = None, None
    if ranks.rank == 0:
        try:
            result = work()
        except Exception as e:
            error = e
    if ranks.world_size > 1:
        shared = ranks.share(("error", f"{type(error).__name__}: {error}") if error else ("ok", result))
        if error is None:
            if shared[0] == "error":
                raise RuntimeError(f"rank 0 stopped the build: {shared[1]}")
            result = shared[1]
    if error is not None:
        raise error
    return result


def _run(ranks: Ranks, target: tuple[str, Path], inputs, output: Path, config: CacheConfig, progress: bool) -> dict:
    started = time.perf_counter()
    state = _on_rank_zero(ranks, lambda: _prepare(ranks, target, inputs, output, config, progress))
    if state.get("finished"):
        return state["finished"]
    plan = Plan.load(output)
    mine = state["assignment"][ranks.rank]
    error = None
    try:
        if mine:
            _write_shards(ranks, target[1], plan, config, mine, progress)
    except Exception as e:
        error = e
    errors = ranks.gather(None if error is None else f"{type(error).__name__}: {error}")
    resumable = f"the plan and the finished batches are kept in {output / BUILD_DIR}: the same command resumes there"
    if error is not None:
        error.add_note(resumable)
        raise error
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise RuntimeError("; ".join(f"rank {r} failed: {e}" for r, e in failed) + f"; {resumable}")
    return _on_rank_zero(ranks, lambda: _merge(output, plan, config, time.perf_counter() - started))


def _prepare(ranks: Ranks, target: tuple[str, Path], inputs, output: Path, config: CacheConfig,
             progress: bool) -> dict:
    """Rank 0: the finished cache's stats, or the plan made or found and each rank's shards."""
    started = time.perf_counter()
    name, model = target
    _, text = model_config(model)
    check_layer_ids(config.layers, text.num_hidden_layers)
    layout = layout_for(config, text.hidden_size)
    identity = build_identity(model, inputs, config, name)
    if (output / MANIFEST).exists():
        stats = orjson.loads((output / STATS).read_bytes()) if (output / STATS).exists() else {}
        if stats.get("identity") != identity:
            raise ValueError(f"{output} already holds a target cache built with other options, model or inputs; "
                             "choose another --output")
        shutil.rmtree(output / BUILD_DIR, ignore_errors=True)  # left by a merge stopped after the manifest
        return {"finished": resumed(stats, started)}
    if output.exists() and not (output / BUILD_DIR).exists() and any(p.name[0] != "." for p in output.iterdir()):
        raise ValueError(f"{output} is not empty and holds no target cache build; choose another --output")
    plan = Plan.load(output)
    if plan is not None and plan.identity != identity:
        raise ValueError(f"{output} holds an unfinished build with other options, model or inputs; resume it with "
                         f"the same command, or choose another --output")
    if plan is None:
        plan = _make_plan_or_leave_nothing(output, inputs, model, config, identity, text.hidden_size, progress)
    _check_disk(output, plan, layout, config.force)
    remaining = [s for s in plan.shards if not _shard_done(output, s)]
    work = assign(remaining, ranks.world_size)
    return {"assignment": work}


def _make_plan_or_leave_nothing(output: Path, inputs, model, config: CacheConfig, identity: dict, hidden_size: int,
                                progress: bool) -> Plan:
    """make_plan; when it fails (a bad record, an interrupt), nothing it began stays: without its plan a
    `.build/` resumes nothing, and an output directory the build created goes too."""
    created = not output.exists()
    try:
        return make_plan(output, inputs, model, config, identity, hidden_size, progress)
    except BaseException:
        shutil.rmtree(output / BUILD_DIR, ignore_errors=True)
        if created and output.is_dir() and not any(output.iterdir()):
            output.rmdir()
        raise


def _shard_done(output: Path, shard: Shard) -> bool:
    name = shard_name(shard.shard_id)
    index = output / BUILD_DIR / (name[: -len(".bin")] + ".idx")
    return index.exists() and ((output / BUILD_DIR / name).exists() or (output / name).exists())


def _check_disk(output: Path, plan: Plan, layout: Layout, force: bool) -> None:
    written = sum(p.stat().st_size for p in (output / BUILD_DIR).glob("shard-*.bin*"))
    needed = plan.total_bytes - written + len(plan.record_ids) * layout.index_dtype().itemsize
    free = shutil.disk_usage(output).free
    if needed > free and not force:
        raise ValueError(f"the cache needs {needed / 2**30:,.2f} GiB more and {output} has {free / 2**30:,.2f} GiB "
                         "free; free some space or pass --force to start anyway")


def _device(config: CacheConfig, ranks: Ranks):
    import torch

    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine (use --device cpu)")
    torch.cuda.set_device(ranks.local_rank)
    return torch.device("cuda", ranks.local_rank)


def load_model(model: str | os.PathLike, device, progress: bool = False):
    """The target's base model (no LM head) in bfloat16, in eval mode, on `device`; transformers'
    loading bar only with `progress` on a terminal."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # its load report lists the LM head it was asked not to load
    try:
        with transformers_bars(progress):
            return AutoModel.from_pretrained(model, dtype=torch.bfloat16).to(device).eval()
    finally:
        logging.set_verbosity(level)


def _write_shards(ranks: Ranks, model, plan: Plan, config: CacheConfig, shard_ids: list[int], progress: bool) -> None:
    device = _device(config, ranks)
    capture = HiddenStateCapture(load_model(model, device, progress), config.layers)
    layout = layout_for(config, plan.hidden_size)
    samples, ids, mask = plan.tokens()
    sizes = record_sizes(layout, samples, plan.record_ids)
    shards = [s for s in plan.shards if s.shard_id in shard_ids]
    total = sum(len(s.samples) for s in shards)
    with progress_bar(total=total, desc=f"cache rank {ranks.rank}", unit=" conv", position=ranks.rank,
                      disable=not progress) as bar:
        for shard in shards:
            offsets = np.concatenate([[0], np.cumsum(sizes[shard.samples])])
            _write_shard(plan, shard, ShardWriter(plan.build_dir, shard, layout, offsets), capture, layout,
                         (samples, ids, mask), device, config, bar)


def _write_shard(plan: Plan, shard: Shard, writer: ShardWriter, capture: HiddenStateCapture, layout: Layout,
                 tokens, device, config: CacheConfig, bar) -> None:
    import torch

    samples, ids, mask = tokens
    first = writer.open()
    bar.update(first)
    queue = WriteQueue(config.queue_bytes, threaded=config.writer_thread)
    pinned = _PinnedPool() if device.type == "cuda" else None
    timing = {"forward_seconds": 0.0}
    started = time.perf_counter()
    try:
        bounds = shard.batches + [len(shard.samples)]
        for start, end in zip(bounds, bounds[1:]):
            if end <= first:
                continue
            rows = samples[shard.samples[start:end]]
            batch_ids, attention = padded_batch(rows, ids)
            began = time.perf_counter()
            captured = capture.forward(torch.from_numpy(batch_ids).to(device), torch.from_numpy(attention).to(device))
            tensors = _storage_tensors(captured, layout)
            host, ready = _to_host(tensors, pinned)
            timing["forward_seconds"] += time.perf_counter() - began
            records_of = _records_job(plan, shard, writer, start, rows, (ids, mask), host, ready, pinned, bar)
            queue.put(records_of, sum(t.numel() * t.element_size() for t in tensors.values()))
        queue.close()
    except BaseException:
        with contextlib.suppress(Exception):  # the batches already queued are still committed
            queue.close()
        raise
    finally:
        writer.close()
    writer.finish()
    timing.update(wall_seconds=time.perf_counter() - started, wait_seconds=queue.wait_seconds,
                  write_seconds=queue.write_seconds)
    write_bytes_atomic(plan.build_dir / f"{shard_name(shard.shard_id)[:-4]}.stats.json", orjson.dumps(timing))


def padded_batch(rows: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(input ids, attention mask) of one forward batch: the rows' tokens, right-padded with zeros."""
    width = int(rows["length"].max())
    batch_ids = np.zeros((len(rows), width), dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    for k, row in enumerate(rows):
        batch_ids[k, : row["length"]] = ids[row["start"]: row["start"] + row["length"]]
        attention[k, : row["length"]] = 1
    return batch_ids, attention


def _storage_tensors(captured, layout: Layout) -> dict:
    """The captured batch in storage dtypes (fp8 quantized on the device, with its scales)."""
    import torch

    from fuelline.cache.fp8 import quantize

    if layout.hidden_dtype == BF16:
        return {"target_hidden_states": captured.hidden.to(torch.bfloat16),
                "target_last_hidden_states": captured.last.to(torch.bfloat16)}
    hidden, hidden_scales = quantize(captured.hidden, layout.num_layers)
    last, last_scales = quantize(captured.last, 1)
    return {"target_hidden_states": hidden, "target_last_hidden_states": last,
            "target_hidden_scales": hidden_scales, "target_last_hidden_scales": last_scales.squeeze(-1)}


class _PinnedPool:
    """Reused page-locked host buffers for the device-to-host copies (pinning memory is slow)."""

    def __init__(self):
        import threading

        self.free: list = []
        self.lock = threading.Lock()

    def take(self, nbytes: int):
        import torch

        with self.lock:
            fitting = [b for b in self.free if b.numel() >= nbytes]
            if fitting:
                buffer = min(fitting, key=lambda b: b.numel())
                self.free.remove(buffer)
                return buffer
        return torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, pin_memory=True)

    def give(self, buffers) -> None:
        with self.lock:
            self.free.extend(buffers)


def _to_host(tensors: dict, pinned: _PinnedPool | None):
    """Host copies of the batch's tensors; on CUDA asynchronous into pinned buffers, with the event
    that says they are complete. On the CPU the tensors are already the host's."""
    if pinned is None:
        return tensors, None
    import torch

    host, buffers = {}, []
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        buffer = pinned.take(nbytes)
        buffers.append(buffer)
        view = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor, non_blocking=True)
        host[name] = view
    ready = torch.cuda.Event()
    ready.record()
    host["_buffers"] = buffers
    return host, ready


def _numpy(tensor) -> np.ndarray:
    """A host tensor's bytes as the numpy storage dtype (bf16 as uint16, fp8 as uint8), without copying."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view("<u2")
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()


def _records_job(plan: Plan, shard: Shard, writer: ShardWriter, start: int, rows, tokens, host: dict, ready,
                 pinned, bar):
    """The writer thread's work for one batch: wait for its copies, write each sample's unpadded positions."""
    ids, mask = tokens

    def job():
        if ready is not None:
            ready.synchronize()
        arrays = {name: _numpy(t) for name, t in host.items() if name != "_buffers"}
        records = []
        for k, row in enumerate(rows):
            n, at = int(row["length"]), int(row["start"])
            sample = {name: array[k, :n] for name, array in arrays.items()}
            sample.update(input_ids=np.asarray(ids[at: at + n]), attention_mask=np.ones(n, dtype=np.uint8),
                          loss_mask=np.asarray(mask[at: at + n]))
            records.append((plan.record_ids[shard.samples[start + k]], sample, int(row["loss_tokens"])))
        writer.write_batch(start, records)
        if pinned is not None:
            pinned.give(host["_buffers"])
        bar.update(len(rows))

    return job


def _merge(output: Path, plan: Plan, config: CacheConfig, wall_seconds: float) -> dict:
    """Rank 0, every shard done: shards into place, samples.idx, stats.json, then manifest.json."""
    build = output / BUILD_DIR
    layout = layout_for(config, plan.hidden_size)
    missing = [s.shard_id for s in plan.shards if not _shard_done(output, s)]
    if missing:
        raise RuntimeError(f"shard(s) {missing} are not finished; run the build again to finish them")
    stats = _stats(plan, layout, config, wall_seconds)
    manifest = _manifest(plan, layout, config, stats)
    stats["manifest_digest"] = f"{manifest_digest(manifest):016x}"  # what verify and readers check it against
    index = np.concatenate([np.fromfile(build / (shard_name(s.shard_id)[:-4] + ".idx"), dtype=layout.index_dtype())
                            for s in plan.shards]) if plan.shards else np.zeros(0, layout.index_dtype())
    if layout.format == FUELLINE:
        seal_index(index, manifest)
    with atomic_write(output / INDEX) as f:
        f.write(index.tobytes())
    for shard in plan.shards:
        name = shard_name(shard.shard_id)
        if (build / name).exists():
            os.replace(build / name, output / name)
    fsync_dir(output)
    write_bytes_atomic(output / STATS, orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    write_manifest(output, manifest)
    shutil.rmtree(build)
    return stats


def _stats(plan: Plan, layout: Layout, config: CacheConfig, wall_seconds: float) -> dict:
    samples, _, _ = plan.tokens()
    timing = {"forward_seconds": 0.0, "wait_seconds": 0.0, "write_seconds": 0.0, "wall_seconds": 0.0}
    for shard in plan.shards:
        path = plan.build_dir / f"{shard_name(shard.shard_id)[:-4]}.stats.json"
        if path.exists():
            for key, value in orjson.loads(path.read_bytes()).items():
                if key in timing:
                    timing[key] += value
    tokens = int(samples["length"].sum()) if len(samples) else 0
    padded = sum(s.cost for s in plan.shards)
    loss_tokens = int(samples["loss_tokens"].sum()) if len(samples) else 0
    cache = {
        "tokens": tokens, "loss_tokens": loss_tokens,
        "supervised_share": round(loss_tokens / tokens, 4) if tokens else 0.0,
        "padding_share": round(1 - tokens / padded, 4) if padded else 0.0,
        "shards": len(plan.shards), "bytes": plan.total_bytes,
        "bytes_per_token": round(plan.total_bytes / tokens, 2) if tokens else 0.0,
        "format": config.format, "hidden_dtype": layout.hidden_dtype, "layers": list(config.layers),
        "hidden_size": plan.hidden_size,
        "forward_seconds": round(timing["forward_seconds"], 3), "writer_wait_seconds": round(timing["wait_seconds"], 3),
        "write_seconds": round(timing["write_seconds"], 3), "shard_seconds": round(timing["wall_seconds"], 3),
        "forward_share": round(timing["forward_seconds"] / timing["wall_seconds"], 4) if timing["wall_seconds"] else 0.0,
    }
    return {"stage": "cache", "identity": plan.identity, "records_in": plan.records_in, "records_out": len(samples),
            "dropped": dict(sorted(plan.dropped.items())), "counters": {"truncated": plan.truncated},
            "cache": cache, "wall_seconds": round(wall_seconds, 3)}


def _manifest(plan: Plan, layout: Layout, config: CacheConfig, stats: dict) -> dict:
    identity = plan.identity
    shards = [{"shard_id": s.shard_id, "file_name": shard_name(s.shard_id)} for s in plan.shards]
    common = {
        "num_samples": stats["records_out"], "num_shards": len(shards), "target_layer_ids": list(config.layers),
        "hidden_dtype": layout.hidden_dtype, "token_dtype": TOKEN_DTYPE, "mask_dtype": MASK_DTYPE,
        "index_record_size": layout.index_dtype().itemsize, "hidden_size": plan.hidden_size,
        "target_model_name_or_path": identity["model"], "chat_template": config.chat_template,
        "max_length": config.max_length, "min_loss_tokens": config.min_loss_tokens,
    }
    if layout.format == DEEPSPEC_V2:
        return {"version": DEEPSPEC_VERSION, **common, "shards": shards,
                "source_jsonl_paths": [i["path"] for i in identity["inputs"]]}
    for entry, shard in zip(shards, plan.shards):
        entry.update(num_bytes=shard.nbytes, num_samples=len(shard.samples))
    return {"format": FUELLINE_FORMAT_NAME, "version": FUELLINE_VERSION, **common, "shards": shards,
            "alignment": 64, "checksum": "xxh3_64", "scale_dtype": SCALE_DTYPE if layout.scaled else None,
            "model_fingerprint": identity["model_fingerprint"],
            "tokenizer_fingerprint": identity["tokenizer_fingerprint"], "sources": identity["inputs"],
            "num_tokens": stats["cache"]["tokens"], "num_loss_tokens": stats["cache"]["loss_tokens"]}
