"""Spill files: rows written grouped by partition, so that one task reads one partition of every writer.

Corpus-level passes (dedup's phases, boilerplate's line counts) need all rows with the same key
together (an exact key, a band hash, a line hash, the pairs of a document range) without any node
holding all rows. Each task that produces rows writes them as one table sorted (stably) by
partition, with the offsets of every partition; the task of partitions [lo, hi) then reads rows
offsets[lo]:offsets[hi] from each writer's table, memory-mapped: one contiguous slice per writer.

Partitions are fine-grained (PARTITIONS per key space, the top PARTITION_BITS of a hash) and
fixed before any count is known; a phase groups consecutive partitions into tasks once the
counts are in (`group_ranges`), so how the work is cut never changes what it finds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from fuelline.io.atomic import atomic_write, run_once

PARTITION_BITS = 10
PARTITIONS = 1 << PARTITION_BITS


def hash_partition(hashes: np.ndarray) -> np.ndarray:
    """The partition of each uint64 hash: its top PARTITION_BITS bits."""
    return (hashes >> np.uint64(64 - PARTITION_BITS)).astype(np.int64)


def range_partition(values: np.ndarray, total: int) -> np.ndarray:
    """The partition of each value in [0, total): PARTITIONS equal ranges, in order."""
    return values.astype(np.int64) * PARTITIONS // max(total, 1)


def save_array(path: Path, array: np.ndarray) -> None:
    """`np.save`, atomically."""
    with atomic_write(path) as f:
        np.save(f, array)


def write_spill(prefix: Path, partition: np.ndarray, partitions: int, columns: dict[str, np.ndarray]) -> None:
    """Write `columns` (equal length, row i in partition[i]) as one table PREFIX.npy grouped by
    partition, rows of a partition in their given order, and PREFIX.offsets.npy last (its presence
    means complete)."""
    # A stable sort of keys of 16 bits or fewer is a radix sort: ~5x faster than of int64.
    narrow = partition.astype(np.uint16) if partitions <= 1 << 16 else partition
    order = np.argsort(narrow, kind="stable")
    table = np.empty(len(order), dtype=[(name, values.dtype) for name, values in columns.items()])
    for name, values in columns.items():
        table[name] = values[order]
    save_array(prefix.with_name(f"{prefix.name}.npy"), table)
    offsets = np.zeros(partitions + 1, dtype=np.int64)
    np.cumsum(np.bincount(partition, minlength=partitions), out=offsets[1:])
    save_array(prefix.with_name(f"{prefix.name}.offsets.npy"), offsets)


def _offsets(prefix: Path) -> np.ndarray:
    return np.load(prefix.with_name(f"{prefix.name}.offsets.npy"))


def spill_counts(prefixes: Sequence[Path]) -> np.ndarray:
    """Rows per partition, summed over every writer."""
    return sum(np.diff(_offsets(p)) for p in prefixes)


def read_spill(prefixes: Sequence[Path], lo: int, hi: int, columns: Sequence[str],
               base: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The rows of partitions [lo, hi) from every writer, in writer order.

    With `base`, a "doc" column holds each writer's local row numbers, and base[k] is added to
    writer k's: the global document index.
    """
    parts: dict[str, list[np.ndarray]] = {name: [] for name in columns}
    for k, prefix in enumerate(prefixes):
        offsets = _offsets(prefix)
        rows = np.load(prefix.with_name(f"{prefix.name}.npy"), mmap_mode="r")[int(offsets[lo]):int(offsets[hi])]
        for name in columns:
            parts[name].append(rows[name].astype(np.int64) + base[k] if name == "doc" and base is not None
                               else np.array(rows[name]))
    return {name: np.concatenate(arrays) if arrays else np.empty(0) for name, arrays in parts.items()}


def group_ranges(counts: np.ndarray, target: int) -> list[tuple[int, int]]:
    """Consecutive partition ranges [lo, hi) holding about `target` rows each (more only when one
    partition alone does); partitions without rows are left out."""
    ranges, lo, held = [], None, 0
    for p, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        if lo is not None and held + count > target:
            ranges.append((lo, p))
            lo, held = None, 0
        if lo is None:
            lo = p
        held += count
    if lo is not None:
        ranges.append((lo, len(counts)))
    return ranges


def task_prefix(directory: Path, i: int) -> Path:
    """Where task i of a phase writes, in the phase's directory."""
    return directory / f"task-{i:05d}"


def saved_once(directory: Path, i: int, work: Callable[[], tuple[np.ndarray, dict]]) -> dict:
    """Task i's array as task-I.npy, then a marker holding what `work` returned (`run_once`), unless
    an earlier run finished it."""
    path = task_prefix(directory, i).with_suffix(".npy")

    def save() -> dict:
        array, result = work()
        save_array(path, array)
        return result

    return run_once(path.with_suffix(".json"), save)


def map_saved(map_tasks: Callable, task: Callable, ranges: Sequence[tuple], directory: Path, desc: str,
              empty: np.ndarray, axis: int = 0) -> tuple[list, np.ndarray]:
    """A phase of `saved_once` tasks, task((i, *ranges[i]), directory=directory) for each range: what
    each returned, and their arrays concatenated in task order (`empty` when there are none)."""
    directory.mkdir(parents=True, exist_ok=True)
    results = map_tasks(functools.partial(task, directory=directory), [(i, *r) for i, r in enumerate(ranges)], desc)
    arrays = [np.load(task_prefix(directory, i).with_suffix(".npy")) for i in range(len(ranges))]
    return results, np.concatenate(arrays, axis=axis) if arrays else empty
