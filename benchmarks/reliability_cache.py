"""Reliability family: target caches with damaged bytes, and (issue 25) manifest and index edits,
read by every reader; a reader either returns the original samples or raises CacheFormatError
naming the cache.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson

from common import SHARED_DATA
from trials import Tally, cli, damage_file, isolated, judged, run


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    examples = 200 if full else 40
    return [fuzz_target_cache(work, build_target_cache(work), examples, seed)]


def fuzz_target_cache(work: Path, cache_dir: Path, examples: int, seed: int) -> Tally:
    """A damaged target cache: `verify_cache` lists a problem, or every sample reads back equal."""
    import numpy as np
    import torch
    from hypothesis import given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from fuelline.cache.dataset import CacheDataset
    from fuelline.cache.inspect import verify_cache
    from fuelline.formats.target_cache import CacheFormatError

    def reader(directory: Path):
        def read() -> dict:
            problems = verify_cache(directory)
            if problems:
                raise CacheFormatError(directory, problems[0])
            dataset = CacheDataset(directory)
            return {f"{k}.{name}": np.array(value) if isinstance(value, str)
                    else value.contiguous().view(torch.uint8).numpy()  # bf16, fp8: compared by their bytes
                    for k in range(len(dataset)) for name, value in dataset[k].items()}
        return read

    original = reader(cache_dir)()
    names = sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*") if p.is_file())
    tally = Tally("fuzz: target cache (manifest, index, shards)")

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None)
    @given(st.sampled_from(["truncate", "flip"]), st.sampled_from(names), st.floats(0, 1), st.integers(1, 255))
    def trial(kind, name, where, value) -> None:
        directory = work / "fuzz-cache"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(cache_dir, directory)
        damage_file(directory / name, kind, where, value)
        outcome, note = isolated(lambda: judged(reader(directory), original, CacheFormatError, str(directory)))
        tally.add(outcome, f"{kind} {name} {where:.3f}: {note}")

    trial()
    return tally


def build_target_cache(work: Path) -> Path:
    """A small real cache: a tiny local chat model over 40 conversations of the ShareGPT sample."""
    from fuelline.io import read_records
    from fuelline.models import tiny_chat_model

    chats = work / "cache-chats"
    code, stderr = run(cli("chat", "prepare", "-i", SHARED_DATA / "chat" / "sharegpt_zh_1K.jsonl.zst",
                           "--train-output", chats, "--eval-output", work / "cache-eval", "-q"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    records = [r for _, r in zip(range(40), read_records(chats))]
    (work / "cache-in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    model = tiny_chat_model(work / "cache-model", [t["content"] for r in records for t in r["conversations"]])
    code, stderr = run(cli("cache", "build", "--model", model, "-i", work / "cache-in.jsonl", "-o", work / "cache",
                           "--layers", "0,1", "--max-length", 128, "--hidden-dtype", "fp8", "--no-progress"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    return work / "cache"
