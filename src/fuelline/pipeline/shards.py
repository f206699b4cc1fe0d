"""Cutting inputs into shards whose boundaries depend only on the data, never on the workers.

A shard is a half-open range of physical lines (JSONL) or rows (Parquet) of one file, at most
`shard_size` long; a JSON array is one shard. Because shard k always covers the same records
and writes `part-k`, the output bytes are the same whatever the number of workers, and a
resumed run redoes exactly the shards that have no completion marker.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from fuelline.io.readers import count_units
from fuelline.io.remote import describe_url, is_url
from fuelline.io.stage_layout import STAGE_PART_PREFIX


@dataclass(frozen=True)
class InputShard:
    shard_id: int
    source: str
    start: int
    stop: int | None  # None: to the end of the file
    units: int | None  # lines or rows in the range (None for a JSON array), for progress

    @property
    def part_name(self) -> str:
        return f"{STAGE_PART_PREFIX}{self.shard_id:05d}"

    def to_json(self) -> dict:
        return asdict(self)


def plan_shards(files: list[Path | str], shard_size: int) -> list[InputShard]:
    if shard_size < 1:
        raise ValueError(f"shard_size must be at least 1, not {shard_size}")
    shards: list[InputShard] = []
    for path in files:
        total = count_units(path)
        source = os.fspath(path)
        if total is None:
            shards.append(InputShard(len(shards), source, 0, None, None))
            continue
        for start in range(0, max(total, 1), shard_size):
            stop = min(start + shard_size, total)
            shards.append(InputShard(len(shards), source, start, stop, stop - start))
    return shards


def describe_inputs(files: list[Path | str]) -> list[dict]:
    """Identity of the input files for the resume check: absolute path, size and mtime; for a URL
    (`expand_inputs` gives it as a `str`), the URL, size and version its backend reports."""
    described = []
    for path in files:
        if is_url(path):
            described.append(describe_url(path))
            continue
        st = path.stat()
        described.append({"path": os.fspath(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return described
