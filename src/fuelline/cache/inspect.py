"""Looking at a finished target cache: is it whole (`verify_cache`), what is in it (`cache_info`),
and does it fit the draft model about to be trained on it (`validate_for_draft`); and at a
streaming one: its published partitions verified, its partitions' states and its consumers
(`verify_cache`, `stream_info`).

`verify_cache` lists every problem instead of stopping at the first, so one run tells what a
damaged cache needs (rebuild a shard, or everything); the reader (`CacheDataset`) raises at the
first problem it meets instead. The checks themselves are the format's
(`fuelline.formats.target_cache_checks`). numpy only: no torch.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import orjson

from fuelline.cache.estimate import human_bytes
from fuelline.formats.target_cache import (FUELLINE, INDEX, MANIFEST, CacheFormatError, Layout, cache_format,
                                           layout_of, read_index, read_manifest)
from fuelline.formats.target_cache_checks import Problems, check_records, check_structure, load_index
from fuelline.formats.target_stream import (CONSUMERS, STATES, STREAM_MANIFEST, acknowledged, read_stream_manifest)


def verify_cache(path: str | os.PathLike) -> list[str]:
    """Every problem found in the cache at `path` (empty: the cache is whole). Raises only when
    `path` is no cache (not a directory, no manifest.json), as every reader does; any damage
    inside a cache is a problem in the list."""
    directory = Path(path)
    if not directory.is_dir():
        raise CacheFormatError(directory, "not a directory")
    if (directory / STREAM_MANIFEST).exists():
        return _verify_stream(directory)
    try:
        manifest = read_manifest(directory)
    except CacheFormatError as e:
        if not (directory / MANIFEST).exists():
            raise  # the readers' error: not a target cache, or a build not finished
        return [str(e)]
    problems = Problems()
    layout = layout_of(manifest)
    index = load_index(directory, manifest, layout, problems)
    if index is None:
        return problems.result()
    _, spans = check_structure(directory, manifest, layout, index, problems)
    if layout.format == FUELLINE:
        check_records(directory, manifest, layout, index, spans, problems)
    return problems.result()


def _verify_stream(directory: Path) -> list[str]:
    """Every problem of every published partition of a stream (one being built or deleted has none yet)."""
    problems = []
    for entry in read_stream_manifest(directory)["partitions"]:
        if (directory / entry["name"] / MANIFEST).exists():
            problems += [f"{entry['name']}/{problem}" for problem in verify_cache(directory / entry["name"])]
    return problems


def stream_info(path: str | os.PathLike) -> str:
    """A stream's state in lines: its plan, the partitions in each state, each consumer's acknowledgements."""
    directory = Path(path)
    manifest = read_stream_manifest(directory)
    partitions, plan = manifest["partitions"], manifest["plan"]
    held = [p for p in partitions if p["state"] in ("published", "acknowledged")]
    lines = [("path", str(directory)),
             ("format", f"streaming target cache of {manifest['cache_format']} partitions, {manifest['hidden_dtype']}"),
             ("plan", f"{plan['samples']:,} samples, {plan['tokens']:,} tokens, {human_bytes(plan['bytes_per_epoch'])} "
                      f"an epoch, in {plan['batches']:,} forward batches"),
             ("partitions", f"{len(partitions):,} over {manifest['epochs']} epoch(s), up to "
                            f"{manifest['partition_samples']:,} samples each; "
                            + ", ".join(f"{sum(p['state'] == s for p in partitions)} {s}" for s in STATES)),
             ("on disk", f"{len(held)} published, {human_bytes(sum(p['bytes'] for p in held))} (window "
                         f"{manifest['window']}; at most {human_bytes(manifest['high_water_bytes'])} so far)")]
    for name in manifest["consumers"]:
        found = acknowledged(directory, name) if (directory / CONSUMERS / name).exists() else None
        lines.append((f"consumer {name}", "not started" if found is None else
                      f"{len(found):,} of {len(partitions):,} partitions acknowledged"))
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


def cache_info(path: str | os.PathLike) -> dict[str, Any]:
    """What a cache holds and what it costs on disk; CacheFormatError if it cannot be read."""
    directory = Path(path)
    manifest = read_manifest(directory)
    layout = layout_of(manifest)
    index = np.asarray(read_index(directory, manifest))
    sizes = []
    for entry in manifest["shards"]:
        try:
            sizes.append((directory / entry["file_name"]).stat().st_size)
        except FileNotFoundError:
            raise CacheFormatError(directory / entry["file_name"], "missing") from None
    seq = index["seq_len"].astype(np.int64)
    tokens = int(seq.sum())
    info = {"path": str(directory), "format": cache_format(manifest), "version": manifest["version"],
            "samples": len(index), "tokens": tokens, "supervised_tokens": supervised_tokens(directory, manifest,
                                                                                              layout, index),
            "shards": manifest["num_shards"],
            "total_bytes": sum(sizes) + (directory / INDEX).stat().st_size + (directory / MANIFEST).stat().st_size,
            "bytes_per_token": sum(sizes) / tokens if tokens else None,
            "target_layer_ids": manifest["target_layer_ids"], "hidden_size": manifest["hidden_size"],
            "hidden_dtype": manifest["hidden_dtype"], "target_model": manifest.get("target_model_name_or_path")}
    for key in ("chat_template", "max_length"):
        if key in manifest:
            info[key] = manifest[key]
    if len(seq):
        info["seq_len"] = {"min": int(seq.min()), "median": float(median(seq.tolist())), "max": int(seq.max())}
    return info


def supervised_tokens(directory: Path, manifest: dict, layout: Layout, index: np.ndarray) -> int:
    """Tokens with loss_mask 1: in the fuelline index; summed from the shards' loss masks for version 2."""
    if layout.format == FUELLINE:
        return int(index["loss_tokens"].astype(np.int64).sum())
    total = 0
    for k, entry in enumerate(manifest["shards"]):
        samples = np.flatnonzero(index["shard_id"] == k)
        path = directory / entry["file_name"]
        if not len(samples) or not path.stat().st_size:
            continue
        shard = np.memmap(path, dtype=np.uint8, mode="r")
        for i in samples.tolist():
            start, n = int(index["loss_mask"][i]), int(index["seq_len"][i])
            if start + n > len(shard):
                raise CacheFormatError(path, f"sample {i}: loss_mask extends past the end of the shard")
            total += int(shard[start: start + n].sum(dtype=np.int64))
    return total


def format_info(info: dict[str, Any]) -> str:
    """`cache_info` as aligned human-readable lines."""
    tokens, supervised = info["tokens"], info["supervised_tokens"]
    share = f", {supervised / tokens:.1%}" if tokens else ""
    lines = [("path", info["path"]),
             ("format", f"{info['format']} (version {info['version']})"),
             ("samples", f"{info['samples']:,}"),
             ("tokens", f"{tokens:,} ({supervised:,} supervised{share})"),
             ("shards", f"{info['shards']:,}, {human_bytes(info['total_bytes'], binary=True)} in all"),
             ("bytes per token", f"{info['bytes_per_token']:,.0f}" if info["bytes_per_token"] else "-"),
             ("layers", f"{info['target_layer_ids']} x hidden size {info['hidden_size']}, {info['hidden_dtype']}"),
             ("target model", info["target_model"] or "(not recorded)")]
    if "chat_template" in info:
        lines.append(("chat template", str(info["chat_template"])))
    if "max_length" in info:
        lines.append(("max length", str(info["max_length"])))
    if "seq_len" in info:
        s = info["seq_len"]
        lines.append(("seq_len", f"min {s['min']:,}, median {s['median']:,g}, max {s['max']:,}"))
    width = max(len(label) for label, _ in lines)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


DRAFT_KEYS = ("target_layer_ids", "hidden_size", "target_model_name_or_path")


def validate_for_draft(path: str | os.PathLike, draft_config: str | os.PathLike,
                       target_model: str | None = None) -> list[str]:
    """Does the cache fit the draft model? The reference trainer's check before training: the
    cache's target_layer_ids, hidden_size and target model must be the draft config's (the
    target model: `target_model` when given). Returns the problems, each naming both values."""
    config_path = Path(draft_config)
    try:
        manifest = read_manifest(path)
    except CacheFormatError as e:
        return [str(e)]
    try:
        config = load_config(config_path)
    except (OSError, ValueError) as e:
        return [f"{config_path}: cannot read the draft config ({e})"]
    problems = []
    for key in DRAFT_KEYS:
        present, wanted = find_key(config, key)
        source = str(config_path)
        if key == "target_model_name_or_path" and target_model is not None:
            present, wanted, source = True, target_model, "--target-model"
        cached = manifest.get(key)
        if not present:
            problems.append(f"{config_path}: the draft config has no {key} (the cache has {cached!r})")
        elif key not in manifest:
            problems.append(f"{key}: the cache's manifest does not record it; the draft ({source}) wants {wanted!r}")
        elif (list(wanted) if isinstance(wanted, (list, tuple)) else wanted) != cached:
            problems.append(f"{key}: the cache has {cached!r}, the draft ({source}) wants {wanted!r}")
    return problems


def load_config(path: Path) -> dict:
    text = path.read_bytes()
    if path.suffix == ".toml":
        config = tomllib.loads(text.decode("utf-8"))
    else:
        config = orjson.loads(text)
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    return config


def find_key(config: dict, key: str) -> tuple[bool, Any]:
    """(found, value) of `key` at the top level of a config or one table down (e.g. `[model]`)."""
    if key in config:
        return True, config[key]
    for value in config.values():
        if isinstance(value, dict) and key in value:
            return True, value[key]
    return False, None
