"""The dedup stage: exact duplicates first, then near-duplicates by MinHash or SimHash + Jaccard.

`prepare` does the corpus-level work, resumably, under `_prepare/`: hashing, a task per shard
(`hash_shard`), then the decision as phases of tasks (`fuelline.dedup.phases`, which also says
what memory they take), which leaves a keep/drop code per document, `clusters.jsonl.zst` (the
audit) and `summary.json` (the numbers for stats.json). The method is an option, so it is part
of the stage's identity: a rerun into the same directory with the other method is refused (or,
with --restart, starts over), never mixed with this one's hashes. Then the shards run as usual
and drop what was decided (`exact_duplicate`, `near_duplicate`).
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

from fuelline.dedup.config import DedupConfig
from fuelline.dedup.exact import exact_keys
from fuelline.dedup.lsh import band_hashes
from fuelline.dedup.minhash import MinHasher
from fuelline.dedup.phases import (
    EXACT,
    NEAR,
    PHASE_DIRS,
    HashedShards,
    decide,
    shard_codes,
    write_audit,
)
from fuelline.dedup.simhash import simhashes
from fuelline.formats import chat_record
from fuelline.io.atomic import run_once, write_bytes_atomic
from fuelline.io.readers import RecordError, iter_file_records
from fuelline.io.spill import PARTITIONS, hash_partition, save_array, write_spill
from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage
from fuelline.records import Location, user_turns

DROP_REASONS = {EXACT: "exact_duplicate", NEAR: "near_duplicate"}
AUDIT_FILE = "clusters.jsonl.zst"


def compared_text(record: dict, compare: str, source: str, line: int) -> str | None:
    """The text dedup compares: a document's text (None for a record without one), or a chat record's
    user turns joined by newlines (a record that breaks the contract of `fuelline.formats.chat_record`,
    another kind of record included, is a `ChatRecordError` located at SOURCE:LINE)."""
    if compare == "text":
        text = record.get("text")
        return text if isinstance(text, str) else None
    chat_record.require(record, f"{source}:{line}")
    return "\n".join(user_turns(record["conversations"]))


def hash_shard(shard: InputShard, config: DedupConfig, workdir: Path) -> int:
    """Hashing, for one shard: each text normalized; its 128-bit exact key and its LSH band hashes
    (`method = "minhash"`) as spill files (`fuelline.io.spill`), or its 64-bit SimHash
    (`fuelline.dedup.simhash`); lengths, shingles (for verification) and ids. Returns its number
    of documents."""
    target = workdir / "shards" / shard.part_name

    def work() -> dict:
        ids, texts, lengths = [], [], []
        # FILE:LINE strings only where needed: one per record for nothing cost ~10 ms of a 50,000-poem shard.
        for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip"):
            text = compared_text(record, config.compare, shard.source, line)
            if text is None:
                raise RecordError(shard.source, line, 'no string field "text": dedup reads document records '
                                                      '(compare = user_turns reads chat records)')
            ids.append(str(record["id"]) if "id" in record else f"{shard.source}:{line}")
            texts.append(text)
            lengths.append(len(text))
        normalize = config.normalizer()
        normalized = normalize.many(texts)
        # SimHash needs only the shingle hashes: one permutation is the least a MinHasher computes.
        hasher = MinHasher(config.num_perm if config.method == "minhash" else 1, config.ngram, config.shingle,
                           config.seed)
        signatures, shingles, offsets = hasher.signatures_and_shingles(normalized)
        docs, lengths = np.arange(len(texts), dtype=np.uint32), np.array(lengths, dtype=np.int64)
        keys = exact_keys(normalized)
        writes = [functools.partial(write_spill, target / "exact", hash_partition(keys[:, 0]), PARTITIONS,
                                    {"key0": keys[:, 0], "key1": keys[:, 1], "doc": docs, "length": lengths})]
        if config.method == "minhash":
            bands, rows = config.band_layout()
            hashes = band_hashes(signatures, bands, rows).T.ravel()  # band by band, documents in order within
            band = np.repeat(np.arange(bands), len(docs))
            writes.append(functools.partial(write_spill, target / "bands", band * PARTITIONS + hash_partition(hashes),
                                            bands * PARTITIONS, {"hash": hashes, "doc": np.tile(docs, bands)}))
        else:
            writes.append(functools.partial(save_array, target / "simhash.npy", simhashes(shingles, offsets)))
        encoded = [i.encode("utf-8") for i in ids]  # memory-mappable: the audit looks ids up one by one
        arrays = {"lengths": lengths, "shingles": shingles, "shingle_offsets": offsets,
                  "id_offsets": np.cumsum([0] + [len(e) for e in encoded], dtype=np.int64)}
        writes += [functools.partial(save_array, target / f"{name}.npy", array) for name, array in arrays.items()]
        writes.append(functools.partial(write_bytes_atomic, target / "ids.bin", b"".join(encoded)))
        target.mkdir(parents=True, exist_ok=True)
        write_together(writes)
        return {"documents": len(texts)}

    return run_once(target / "done.json", work)["documents"]


def write_together(writes: list[Callable[[], None]]) -> None:
    """Run the atomic file writes of a task at once, on threads: their fsyncs overlap (ext4 commits
    them in one journal transaction), so the 9 files of a 50,000-poem shard take ~30 ms instead of
    ~110 ms one after the other. The first error is raised once every write has ended."""
    with ThreadPoolExecutor(len(writes)) as pool:
        done = [pool.submit(write) for write in writes]
    for future in done:
        future.result()


class Stopwatch:
    """Seconds spent per named step, for stats.json."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


class DedupStage(Stage):
    name = "dedup"
    description = "Remove exact duplicates, then near-duplicates (MinHash + LSH or SimHash, verified by Jaccard)."
    Config = DedupConfig
    writes = (AUDIT_FILE,)
    _workdir: Path | None = None  # set by `prepare`

    def prepare(self, ctx: PrepareContext) -> None:
        self._workdir = ctx.workdir
        if (ctx.workdir / "summary.json").exists():
            return  # decided in an earlier, interrupted run
        laps = Stopwatch()
        hash_one = functools.partial(hash_shard, config=self.config, workdir=ctx.workdir)
        sizes = ctx.map(hash_one, ctx.shards, "dedup: hashing")
        starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        shards = HashedShards(tuple(ctx.workdir / "shards" / s.part_name for s in ctx.shards), tuple(starts.tolist()))
        laps("hash")
        decision = decide(shards, self.config, ctx.workdir, ctx.map, laps)
        write_audit(ctx.workdir.parent / AUDIT_FILE, shards, decision, ctx.map, ctx.workdir)
        laps("audit")
        for shard, begin, end in zip(ctx.shards, starts[:-1], starts[1:]):
            save_array(ctx.workdir / "decisions" / f"{shard.part_name}.npy", shard_codes(decision, begin, end))
        write_bytes_atomic(ctx.workdir / "summary.json", orjson.dumps({**decision.summary, "seconds": laps.laps}))
        # Decided: the phases' files are no longer needed. Removed by the workers, a directory a task:
        # the poetry corpus's 226 MB took ~95 ms to unlink in this process, with every worker waiting.
        ctx.map(shutil.rmtree, [*shards.dirs, *(ctx.workdir / name for name in PHASE_DIRS)], "dedup: cleanup")
        (ctx.workdir / "shards").rmdir()

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        codes = np.load(self._workdir / "decisions" / f"part-{ctx.shard_id:05d}.npy")
        for k, (location, record) in enumerate(records):
            if k >= len(codes):
                raise RuntimeError(f"{location.source}: more records than when it was hashed; rerun with --restart")
            if codes[k]:
                ctx.drop(record, DROP_REASONS[int(codes[k])], location)
            else:
                yield record

    def summary(self, workdir: Path, stats: dict) -> dict:
        path = workdir / "summary.json"
        return {"dedup": orjson.loads(path.read_bytes())} if path.exists() else {}
