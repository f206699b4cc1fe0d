"""The merge step of a cache build, on rank 0 once every shard is done: the shard files moved
into the cache directory, the shard indexes concatenated into `samples.idx` (dense sample ids,
sealed with the manifest's digest in the fuelline format), `stats.json`, and `manifest.json`
last, so a cache with a manifest is whole.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import orjson

from fuelline.cache.plan import REJECTS, CacheConfig, Plan, layout_for
from fuelline.cache.writer import build_file, shard_done
from fuelline.formats.target_cache import (FUELLINE, INDEX, Layout, cache_manifest, manifest_digest,
                                           seal_index, shard_name, write_manifest)
from fuelline.io.atomic import atomic_write, fsync_dir
from fuelline.io.stage_layout import REJECTS_DIR
from fuelline.pipeline.stats import StepStats


def merge(output: Path, plan: Plan, config: CacheConfig, finish: Callable[[StepStats], dict]) -> dict:
    """Every shard done: shards into place, samples.idx, stats.json (`finish`: the step's `WorkDir.finish`),
    then manifest.json; returns the stats."""
    build = plan.build_dir
    layout = layout_for(config, plan.hidden_size)
    missing = [s.shard_id for s in plan.shards if not shard_done(build, s.shard_id)]
    if missing:
        raise RuntimeError(f"shard(s) {missing} are not finished; run the build again to finish them")
    stats = _stats(plan, layout, config)
    manifest = _manifest(plan, layout, config, stats.details["cache"])
    stats.details["manifest_digest"] = f"{manifest_digest(manifest):016x}"  # what verify and readers check it against
    index = np.concatenate([np.fromfile(build_file(build, s.shard_id, ".idx"), dtype=layout.index_dtype())
                            for s in plan.shards]) if plan.shards else np.zeros(0, layout.index_dtype())
    if layout.format == FUELLINE:
        seal_index(index, manifest)
    with atomic_write(output / INDEX) as f:
        f.write(index.tobytes())
    for shard in plan.shards:
        name = shard_name(shard.shard_id)
        if (build / name).exists():
            os.replace(build / name, output / name)
    if (build / REJECTS).exists():  # the records the plan left out, with their reasons, files and lines
        (output / REJECTS_DIR).mkdir(exist_ok=True)
        os.replace(build / REJECTS, output / REJECTS_DIR / REJECTS)
        fsync_dir(output / REJECTS_DIR)
    fsync_dir(output)
    written = finish(stats)
    write_manifest(output, manifest)
    shutil.rmtree(build)
    return written


def _stats(plan: Plan, layout: Layout, config: CacheConfig) -> StepStats:
    samples, _, _ = plan.tokens()
    samples = samples[[row for shard in plan.shards for row in shard.samples]]  # a stream partition's only
    timing = {"forward_seconds": 0.0, "wait_seconds": 0.0, "write_seconds": 0.0, "wall_seconds": 0.0}
    for shard in plan.shards:
        path = build_file(plan.build_dir, shard.shard_id, ".stats.json")
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
    return StepStats("cache", plan.records_in, len(samples), dict(plan.dropped), dict(plan.drop_examples),
                     counters={"truncated": plan.truncated}, details={"cache": cache})


def _manifest(plan: Plan, layout: Layout, config: CacheConfig, cache: dict) -> dict:
    """The format's manifest, of what this build records of itself."""
    identity = plan.identity
    build = {"target_model_name_or_path": identity["model"], "chat_template": config.chat_template,
             "max_length": config.max_length, "min_loss_tokens": config.min_loss_tokens,
             "num_tokens": cache["tokens"], "num_loss_tokens": cache["loss_tokens"],
             "model_fingerprint": identity["model_fingerprint"],
             "tokenizer_fingerprint": identity["tokenizer_fingerprint"], "sources": identity["inputs"]}
    return cache_manifest(layout, config.layers, [(s.nbytes, len(s.samples)) for s in plan.shards], build)
