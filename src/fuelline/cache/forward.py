"""The write step of a cache build: each rank runs the target over its shards' batches and hands
the results to the shard writer (`writer.py`).

Per batch, the main thread pads the batch's ids, runs the forward with the hooks, quantizes on
the device for fp8, and starts the copies to pinned host buffers; the writer thread waits for
those copies, then serializes and writes the unpadded positions of each sample. The forward of
the next batch runs meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import orjson

from fuelline.cache.capture import HiddenStateCapture
from fuelline.cache.plan import CacheConfig, Plan, Shard, layout_for, record_sizes
from fuelline.cache.ranks import Ranks
from fuelline.cache.writer import ShardWriter, WriteQueue, build_file
from fuelline.formats.target_cache import BF16, Layout
from fuelline.io.atomic import write_bytes_atomic
from fuelline.progress import progress_bar, transformers_bars


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


def load_target(ranks: Ranks, model, config: CacheConfig, progress: bool) -> tuple:
    """(device, capture): the target loaded once on this rank's device, with its hooks on `config.layers`."""
    device = _device(config, ranks)
    return device, HiddenStateCapture(load_model(model, device, progress), config.layers)


def write_shards(ranks: Ranks, target: tuple, plan: Plan, config: CacheConfig, shard_ids: list[int],
                 progress: bool) -> None:
    """This rank's shards of `plan`, through `target` (`load_target`)."""
    device, capture = target
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
    queue = WriteQueue(config.queue_bytes, threaded=not config.inline_writes)
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
        # The batches already queued are still committed; a second error while closing would hide the first.
        with contextlib.suppress(Exception):
            queue.close()
        raise
    finally:
        writer.close()
    writer.finish()
    timing.update(wall_seconds=time.perf_counter() - started, wait_seconds=queue.wait_seconds,
                  write_seconds=queue.write_seconds)
    write_bytes_atomic(build_file(plan.build_dir, shard.shard_id, ".stats.json"), orjson.dumps(timing))


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

