"""Dedup's decision as phases of independent tasks, so that no node holds every document's hashes.

The phases (exact, candidates and verify as tasks on the stage's executor; components and
decisions in the driver) and what each holds in memory: docs/dedup.md, "Phases, and memory".
Each task writes its result atomically and then a marker holding what it returned (`saved_once`,
`_spilled_once`), so an interrupted run redoes only unfinished tasks. Tasks are cut by row counts,
never by the number of workers, and what a phase finds never depends on the cut (equal keys and
equal band hashes share a partition; pairs are made unique within their first document's range):
the bytes are the same on any executor and any cluster.
"""

from __future__ import annotations

import functools
import math
import mmap
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fuelline.dedup.clusters import connected_components, jaccard_pairs, keepers
from fuelline.dedup.config import DedupConfig
from fuelline.dedup.exact import group_labels
from fuelline.dedup.lsh import bucket_pairs, candidate_probability, unique_pairs
from fuelline.dedup.simhash import choose_blocks, find_probability, hamming_pairs
from fuelline.io.atomic import atomic_write, run_once
from fuelline.io.spill import (PARTITIONS, group_ranges, map_saved, range_partition, read_spill, save_array,
                               saved_once, spill_counts, task_prefix, write_spill)
from fuelline.io.writers import JsonlZstWriter

KEEP, EXACT, NEAR = 0, 1, 2
ROWS_PER_TASK = 8_000_000  # exact keys (32 B) or band hashes (16 B) a task holds
PAIRS_PER_TASK = 2_000_000
MIN_VERIFY_TASKS = 8  # verification is the slow phase: spread it even on a small corpus
SIMHASH_TASKS = 8
AUDIT_ROWS_PER_TASK = 200_000
PHASE_DIRS = ("exact", "candidates", "verify", "audit")  # what the phases write under the work directory


@dataclass(frozen=True)
class HashedShards:
    """What hashing left: one directory per input shard, and the global index of each shard's
    first document (then the total), so a task can find any document's rows."""

    dirs: tuple[Path, ...]
    starts: tuple[int, ...]

    @property
    def documents(self) -> int:
        return self.starts[-1]

    def prefixes(self, name: str) -> list[Path]:
        return [d / name for d in self.dirs]

    def by_shard(self, docs: np.ndarray):
        """(shard, positions in `docs`, local indices) for each shard holding some of `docs`."""
        shard = np.searchsorted(np.asarray(self.starts), docs, side="right") - 1
        for k in np.unique(shard).tolist():
            where = np.flatnonzero(shard == k)
            yield k, where, docs[where] - self.starts[k]

    def gather(self, name: str, docs: np.ndarray) -> np.ndarray:
        """Per-document values of the shards' NAME.npy (lengths, simhash) for `docs`."""
        out = None
        for k, where, local in self.by_shard(docs):
            values = np.load(self.dirs[k] / f"{name}.npy", mmap_mode="r")[local]
            out = np.empty(len(docs), dtype=values.dtype) if out is None else out
            out[where] = values
        return out if out is not None else np.empty(0, dtype=np.int64)

    def shingles(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shingles of `docs` (increasing) in one array, and offsets: document i's are
        shingles[offsets[i]:offsets[i + 1]]."""
        pieces, counts = [], []
        for k, _, local in self.by_shard(docs):
            offsets = np.load(self.dirs[k] / "shingle_offsets.npy", mmap_mode="r")
            begin, count = offsets[local], offsets[local + 1] - offsets[local]
            ends = np.cumsum(count)
            index = np.repeat(begin - (ends - count), count) + np.arange(int(ends[-1]) if len(ends) else 0)
            pieces.append(np.load(self.dirs[k] / "shingles.npy", mmap_mode="r")[index])
            counts.append(count)
        offsets = np.concatenate(([0], np.cumsum(np.concatenate(counts)))) if counts else np.zeros(1, np.int64)
        return (np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint64)), offsets.astype(np.int64)

    def jaccard(self, pairs: np.ndarray) -> np.ndarray:
        """True Jaccard similarity of each pair of documents, reading only their shingles."""
        docs = np.unique(pairs)
        shingles, offsets = self.shingles(docs)
        return jaccard_pairs(shingles, offsets, np.searchsorted(docs, pairs))


def is_dropped(bits: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Whether each document's bit is set in a bitmap from `np.packbits` (first document: high bit)."""
    return ((bits[docs >> 3] >> (7 - (docs & 7)).astype(np.uint8)) & 1).astype(bool)


def _spilled_once(directory: Path, i: int, documents: int, find: Callable[[], np.ndarray]) -> dict:
    """Task i's distinct candidate pairs as a spill table by their first document's range, then its marker."""
    prefix = task_prefix(directory, i)

    def spill() -> dict:
        pairs = unique_pairs(find(), documents)
        write_spill(prefix, range_partition(pairs[:, 0], documents), PARTITIONS, {"a": pairs[:, 0], "b": pairs[:, 1]})
        return {"pairs": len(pairs)}

    return run_once(prefix.with_suffix(".json"), spill)


# Phase 1: exact duplicates.

def find_exact(task: tuple[int, int, int], shards: HashedShards, keep: str, directory: Path) -> dict:
    """Groups of equal keys in key partitions [lo, hi); writes (duplicate, keeper) pairs."""
    i, lo, hi = task

    def work() -> tuple[np.ndarray, dict]:
        rows = read_spill(shards.prefixes("exact"), lo, hi, ("key0", "key1", "doc", "length"), shards.starts)
        # Equal keys share a partition and come in document order, so positions order like documents.
        winner = keepers(group_labels(np.stack([rows["key0"], rows["key1"]], axis=1)), rows["length"], keep)
        duplicate = np.flatnonzero(winner != np.arange(len(winner)))
        pairs = np.stack([rows["doc"][duplicate], rows["doc"][winner[duplicate]]], axis=1)
        return pairs, {"duplicates": len(duplicate)}

    return saved_once(directory, i, work)


# Phase 2: candidate pairs.

def band_candidates(task: tuple[int, int, int, int], shards: HashedShards, dropped: Path, directory: Path) -> dict:
    """Pairs sharing a hash in band `band`, partitions [lo, hi), among documents not dropped."""
    i, band, lo, hi = task

    def find() -> np.ndarray:
        first = band * PARTITIONS
        rows = read_spill(shards.prefixes("bands"), first + lo, first + hi, ("hash", "doc"), shards.starts)
        kept = ~is_dropped(np.load(dropped, mmap_mode="r"), rows["doc"])
        return bucket_pairs(rows["hash"][kept], rows["doc"][kept])

    return _spilled_once(directory, i, shards.documents, find)


def simhash_candidates(task: tuple[int, int, int], shards: HashedShards, dropped: Path, directory: Path,
                       hamming: int, blocks: int) -> dict:
    """Pairs within `hamming` bits first found by tables [lo, hi), among documents not dropped."""
    i, lo, hi = task

    def find() -> np.ndarray:
        values = np.concatenate([np.load(d / "simhash.npy") for d in shards.dirs])
        eligible = np.flatnonzero(np.unpackbits(np.load(dropped), count=shards.documents) == 0)
        return hamming_pairs(values[eligible], eligible, hamming, blocks, range(lo, hi))

    return _spilled_once(directory, i, shards.documents, find)


# Phase 3: verification.

def verify_pairs(task: tuple[int, int, int], shards: HashedShards, candidates: list[Path], directory: Path,
                 threshold: float | None) -> dict:
    """The distinct candidate pairs whose first document is in range partitions [lo, hi), and
    those of them at Jaccard ≥ threshold (all of them when threshold is None)."""
    i, lo, hi = task

    def work() -> tuple[np.ndarray, dict]:
        rows = read_spill(candidates, lo, hi, ("a", "b"))
        pairs = unique_pairs(np.stack([rows["a"], rows["b"]], axis=1).astype(np.int64), shards.documents)
        verified = pairs if threshold is None else pairs[shards.jaccard(pairs) >= threshold]
        return verified, {"candidates": len(pairs), "verified": len(verified)}

    return saved_once(directory, i, work)


# The driver.

@dataclass
class Decision:
    """Documents dropped, with the one kept in their place, sorted by document."""

    exact: np.ndarray  # [m, 2]: exact duplicate, its group's keeper
    near: np.ndarray  # [m, 2]: near duplicate (never an exact one), its cluster's keeper
    summary: dict


def _tasks(ranges: list[tuple]) -> list[tuple]:
    return [(i, *r) for i, r in enumerate(ranges)]


def _layout(config: DedupConfig, eligible: int) -> dict:
    if config.method == "minhash":
        bands, rows = config.band_layout()
        layout = {"bands": bands, "rows": rows}
        chance = functools.partial(candidate_probability, bands=bands, rows=rows)
    else:
        hamming = config.max_hamming()
        blocks = config.blocks or choose_blocks(hamming, eligible)
        layout = {"hamming": hamming, "blocks": blocks, "tables": math.comb(blocks, hamming)}
        chance = functools.partial(find_probability, hamming=hamming)
    layout["candidate_probability"] = {f"{s:.2f}": round(float(chance(s)), 4)
                                       for s in (0.5, 0.7, config.threshold, 0.9, 0.95)}
    return layout


def decide(shards: HashedShards, config: DedupConfig, workdir: Path, map_tasks: Callable, laps) -> Decision:
    """Run phases 1–4 over hashed shards with `map_tasks(fn, items, desc)`; `laps(name)` times each."""
    n = shards.documents
    exact_results, exact = map_saved(
        map_tasks, functools.partial(find_exact, shards=shards, keep=config.keep),
        group_ranges(spill_counts(shards.prefixes("exact")), ROWS_PER_TASK), workdir / "exact", "dedup: exact",
        np.empty((0, 2), np.int64))
    exact = exact[np.argsort(exact[:, 0], kind="stable")]
    bits = np.zeros((n + 7) // 8, dtype=np.uint8)  # as np.packbits would make it, without n bytes first
    np.bitwise_or.at(bits, exact[:, 0] >> 3, (0x80 >> (exact[:, 0] & 7)).astype(np.uint8))
    bitmap = workdir / "exact" / "dropped.npy"
    save_array(bitmap, bits)
    laps("exact")

    layout = _layout(config, n - len(exact))
    directory = workdir / "candidates"
    directory.mkdir(parents=True, exist_ok=True)
    if config.method == "minhash":
        counts = spill_counts(shards.prefixes("bands")).reshape(layout["bands"], PARTITIONS)
        candidate_tasks = _tasks([(band, lo, hi) for band in range(layout["bands"])
                                  for lo, hi in group_ranges(counts[band], ROWS_PER_TASK)])
        find = functools.partial(band_candidates, shards=shards, dropped=bitmap, directory=directory)
    else:
        step = -(-layout["tables"] // SIMHASH_TASKS)
        candidate_tasks = _tasks([(lo, min(lo + step, layout["tables"])) for lo in range(0, layout["tables"], step)])
        find = functools.partial(simhash_candidates, shards=shards, dropped=bitmap, directory=directory,
                                 hamming=layout["hamming"], blocks=layout["blocks"])
    map_tasks(find, candidate_tasks, "dedup: candidates")
    laps("candidates")

    candidates = [task_prefix(directory, i) for i, *_ in candidate_tasks]
    counts = spill_counts(candidates) if candidates else np.zeros(PARTITIONS, dtype=np.int64)
    per_task = min(PAIRS_PER_TASK, max(1, -(-int(counts.sum()) // MIN_VERIFY_TASKS)))
    verify_results, verified = map_saved(
        map_tasks, functools.partial(verify_pairs, shards=shards, candidates=candidates,
                                     threshold=config.threshold if config.verify else None),
        group_ranges(counts, per_task), workdir / "verify", "dedup: verify",
        np.empty((0, 2), np.int64))
    laps("verify")

    nodes = np.unique(verified)
    labels = connected_components(len(nodes), np.searchsorted(nodes, verified))
    winner = keepers(labels, shards.gather("lengths", nodes), config.keep)
    near = np.flatnonzero(winner != np.arange(len(nodes)))
    laps("cluster")
    candidate_pairs = sum(r["candidates"] for r in verify_results)
    summary = {
        "method": config.method, **layout,
        "exact_duplicates": len(exact),
        "candidate_pairs": candidate_pairs,
        "verified_pairs": len(verified),
        "rejected_pairs": candidate_pairs - len(verified) if config.verify else None,
        "clusters": len(np.unique(labels)),
        "near_duplicates": len(near),
        "tasks": {"hash": len(shards.dirs), "exact": len(exact_results), "candidates": len(candidate_tasks),
                  "verify": len(verify_results)},
    }
    return Decision(exact, np.stack([nodes[near], nodes[winner[near]]], axis=1), summary)


def shard_codes(decision: Decision, begin: int, end: int) -> np.ndarray:
    """KEEP, EXACT or NEAR for documents [begin, end)."""
    codes = np.zeros(end - begin, dtype=np.uint8)
    for code, dropped in ((EXACT, decision.exact[:, 0]), (NEAR, decision.near[:, 0])):
        inside = dropped[np.searchsorted(dropped, begin):np.searchsorted(dropped, end)]
        codes[inside - begin] = code
    return codes


def document_ids(shards: HashedShards, docs: np.ndarray) -> list[str]:
    """The ids of `docs`, sliced from each shard's id file mapped into memory, so that only the pages
    holding wanted ids are read. A slice of a Python `mmap` is bytes at once (~0.1 µs); one of a numpy
    memmap took ~1.5 µs: ~20 ms of the ~90 ms that the poetry corpus's 46,000 audit rows took, as one task."""
    ids: list[str | None] = [None] * len(docs)
    for k, where, local in shards.by_shard(docs):
        offsets = np.load(shards.dirs[k] / "id_offsets.npy", mmap_mode="r")
        with open(shards.dirs[k] / "ids.bin", "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if offsets[-1] else b""  # none of an empty file
        for position, begin, end in zip(where.tolist(), offsets[local].tolist(), offsets[local + 1].tolist()):
            ids[position] = data[begin:end].decode("utf-8")
    return ids


AUDIT_LEVELS = [None, "exact", "near"]


def write_audit_part(task: tuple, shards: HashedShards, directory: Path) -> dict:
    """Rows of the audit, in order, as one zstd frame: (index, documents, their exact keepers,
    their final keepers, their codes)."""
    i, docs, exact_keeper, final, codes = task
    path = directory / f"part-{i:05d}.jsonl.zst"

    def work() -> dict:
        # An exact copy's similarity is its keeper's: the same text; a kept document's with itself is 1.0, unread.
        similarity, other = np.ones(len(docs)), exact_keeper != final
        similarity[other] = shards.jaccard(np.stack([exact_keeper[other], final[other]], axis=1))
        with JsonlZstWriter(path) as writer:
            for doc_id, cluster, code, value in zip(document_ids(shards, docs), document_ids(shards, final),
                                                    codes.tolist(), np.round(similarity, 4).tolist()):
                writer.write({"id": doc_id, "cluster": cluster, "kept": code == KEEP, "removed": AUDIT_LEVELS[code],
                              "similarity": value})
        return {"rows": len(docs)}

    return run_once(directory / f"part-{i:05d}.json", work)


def write_audit(path: Path, shards: HashedShards, decision: Decision, map_tasks: Callable, workdir: Path) -> None:
    """One row per document of every duplicate cluster, grouped by cluster.

    A cluster is everything that ends with the same kept document (through exact copies, then
    near-duplicates); `cluster` is that document's id. `removed` says at which level a document
    went (null: kept), `similarity` is its Jaccard similarity to the kept document. Tasks write
    AUDIT_ROWS_PER_TASK rows each, one zstd frame; the file is their concatenation.
    """
    involved = np.unique(np.concatenate([decision.exact.ravel(), decision.near.ravel()]))
    exact_keeper, near_keeper, codes = involved.copy(), involved.copy(), np.full(len(involved), KEEP, np.uint8)
    for keeper, code, dropped in ((exact_keeper, EXACT, decision.exact), (near_keeper, NEAR, decision.near)):
        where = np.searchsorted(involved, dropped[:, 0])
        keeper[where], codes[where] = dropped[:, 1], code
    final = near_keeper[np.searchsorted(involved, exact_keeper)]
    sizes = np.unique(final, return_counts=True)
    members = np.flatnonzero(sizes[1][np.searchsorted(sizes[0], final)] > 1)
    members = members[np.lexsort((involved[members], final[members]))]
    tasks = [(i, involved[rows], exact_keeper[rows], final[rows], codes[rows])
             for i, rows in enumerate(np.array_split(members, max(1, -(-len(members) // AUDIT_ROWS_PER_TASK))))]
    directory = workdir / "audit"
    directory.mkdir(parents=True, exist_ok=True)
    map_tasks(functools.partial(write_audit_part, shards=shards, directory=directory), tasks, "dedup: audit")
    with atomic_write(path) as out:
        for i, *_ in tasks:
            with open(directory / f"part-{i:05d}.jsonl.zst", "rb") as part:
                shutil.copyfileobj(part, out)
