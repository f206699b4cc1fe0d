"""The dedup stage: exact duplicates first, then near-duplicates by MinHash or SimHash + Jaccard.

`prepare` does the corpus-level work, resumably, under `_prepare/`:

1. per shard, on the workers (`hash_shard`): normalize each text, its 128-bit exact key, its
   shingles (kept on disk for verification) and its near-duplicate keys: LSH band hashes of its
   MinHash signature (`method = "minhash"`) or its 64-bit SimHash (`"simhash"`, see
   `fuelline.dedup.simhash`); one directory per shard, written atomically, so an interrupted
   run keeps the finished shards;
2. in the parent (`decide`): one document per exact key; candidate pairs among those (LSH
   buckets band by band, or the SimHash block tables); true Jaccard of every pair, whichever
   method found it; union-find over the verified pairs; one document per cluster; a keep/drop
   code per document, per shard; `clusters.jsonl.zst` (the audit); `summary.json` (the numbers
   for stats.json, with the method). The method is an option, so it is part of the stage's
   identity: a rerun into the same directory with the other method is refused (or, with
   --restart, starts over), never mixed with this one's hashes.

Then the shards run as usual and drop what was decided (`exact_duplicate`, `near_duplicate`).

Memory in the parent, per document: exact key 16 B + length 8 B + one band column and its
sort order 16 B + union-find labels and keepers 24 B + decision 1 B ≈ 65 B (SimHash: the hashes
and one table's copies instead of the band column, ≈ 90 B), plus 16 B per candidate pair;
shingles stay on disk (memory-mapped). 10 M documents: ~0.65 GB + pairs.
"""

from __future__ import annotations

import functools
import math
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from fuelline.dedup.clusters import connected_components, jaccard_pairs, keepers
from fuelline.dedup.exact import exact_keys, group_labels
from fuelline.dedup.lsh import (
    band_hashes,
    bucket_pairs,
    candidate_probability,
    choose_bands,
    unique_pairs,
)
from fuelline.dedup.minhash import MinHasher
from fuelline.dedup.normalize import Normalizer
from fuelline.dedup.simhash import (
    choose_blocks,
    choose_hamming,
    find_probability,
    hamming_pairs,
    simhashes,
)
from fuelline.io.atomic import atomic_write, write_bytes_atomic
from fuelline.io.readers import RecordError, iter_file_records
from fuelline.io.writers import JsonlZstWriter
from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.stage import (
    Location,
    PrepareContext,
    ShardContext,
    Stage,
    StageConfig,
)
from fuelline.records import user_turns

KEEP, EXACT, NEAR = 0, 1, 2
DROP_REASONS = {EXACT: "exact_duplicate", NEAR: "near_duplicate"}
AUDIT_FILE = "clusters.jsonl.zst"


@dataclass
class DedupConfig(StageConfig):
    threshold: float = field(default=0.85, metadata={"help": "Jaccard similarity at which documents are duplicates"})
    method: str = field(default="minhash", metadata={
        "help": "how near-duplicate candidates are found (both verified by Jaccard): MinHash + LSH bands, or "
                "64-bit SimHash within a Hamming distance", "choices": ["minhash", "simhash"]})
    hamming: int | None = field(default=None, metadata={
        "help": "simhash: most bits a candidate pair may differ in (default: from the threshold, 10 at 0.85)"})
    blocks: int = field(default=0, metadata={
        "help": "simhash: blocks of the search tables (0: the fastest for the corpus size); changes time, not results"})
    shingle: str = field(default="auto", metadata={
        "help": "char n-grams, word n-grams, or auto: char for mostly-CJK documents", "choices": ["auto", "char", "word"]})
    ngram: int = field(default=5, metadata={"help": "shingle length (characters or words)"})
    num_perm: int = field(default=128, metadata={"help": "MinHash permutations"})
    bands: int = field(default=0, metadata={"help": "LSH bands (0: chosen from the threshold)"})
    rows: int = field(default=0, metadata={"help": "LSH rows per band (0: chosen from the threshold)"})
    keep: str = field(default="first", metadata={"help": "which document of a cluster stays", "choices": ["first", "longest"]})
    verify: bool = field(default=True, metadata={"help": "check every candidate pair's true Jaccard similarity"})
    seed: int = field(default=1, metadata={"help": "seed of the MinHash hash family"})
    compare: str = field(default="text", metadata={
        "help": "what is compared: the text of document records, or the user turns of chat records "
                "(regenerated answers are only as varied as the prompts)", "choices": ["text", "user_turns"]})
    lowercase: bool = field(default=True, metadata={"help": "normalization: ignore case"})
    ignore_punctuation: bool = field(default=True, metadata={"help": "normalization: ignore punctuation and spaces"})

    def __post_init__(self):
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, not {self.threshold}")
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError("give both bands and rows, or neither")
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.shingle not in ("auto", "char", "word") or self.keep not in ("first", "longest"):
            raise ValueError("shingle must be auto, char or word; keep must be first or longest")
        if self.compare not in ("text", "user_turns"):
            raise ValueError(f"compare must be text or user_turns, not {self.compare!r}")
        if self.method not in ("minhash", "simhash"):
            raise ValueError(f"method must be minhash or simhash, not {self.method!r}")
        if self.hamming is not None and not 0 <= self.hamming < 64:
            raise ValueError(f"hamming must be between 0 and 63, not {self.hamming}")
        if self.blocks and not self.max_hamming() < self.blocks <= 64:
            raise ValueError(f"blocks must be more than hamming ({self.max_hamming()}) and at most 64, not {self.blocks}")

    def band_layout(self) -> tuple[int, int]:
        return (self.bands, self.rows) if self.bands else choose_bands(self.threshold, self.num_perm)

    def max_hamming(self) -> int:
        return self.hamming if self.hamming is not None else choose_hamming(self.threshold)

    def normalizer(self) -> Normalizer:
        return Normalizer(lowercase=self.lowercase, punctuation=self.ignore_punctuation)


def compared_text(record: dict, compare: str) -> str | None:
    """The text dedup compares: a document's text, or a chat record's user turns joined by newlines."""
    if compare == "text":
        text = record.get("text")
        return text if isinstance(text, str) else None
    turns = record.get("conversations")
    try:
        return "\n".join(user_turns(turns))
    except (TypeError, KeyError):
        return None


def hash_shard(shard: InputShard, config: DedupConfig, workdir: Path) -> int:
    """Step 1 for one shard: exact keys, lengths, band hashes or SimHashes, shingles, ids. Returns its size."""
    target = workdir / "shards" / shard.part_name
    if (target / "done.json").exists():
        return orjson.loads((target / "done.json").read_bytes())["documents"]
    ids, texts, lengths = [], [], []
    for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip"):
        text = compared_text(record, config.compare)
        if text is None:
            what = ('no string field "text": dedup reads document records' if config.compare == "text" else
                    'no "conversations" list of {"role", "content"} turns: compare = user_turns reads chat records')
            raise RecordError(shard.source, line, what)
        ids.append(str(record.get("id", f"{shard.source}:{line}")))
        texts.append(text)
        lengths.append(len(text))
    normalize = config.normalizer()
    normalized = [normalize(t) for t in texts]
    # SimHash needs only the shingle hashes: one permutation is the least a MinHasher computes.
    hasher = MinHasher(config.num_perm if config.method == "minhash" else 1, config.ngram, config.shingle, config.seed)
    signatures, shingles, offsets = hasher.signatures_and_shingles(normalized)
    near = (("bands", band_hashes(signatures, *config.band_layout())) if config.method == "minhash"
            else ("simhash", simhashes(shingles, offsets)))
    target.mkdir(parents=True, exist_ok=True)
    for name, array in (("exact", exact_keys(normalized)), ("lengths", np.array(lengths, dtype=np.int64)), near,
                        ("shingles", shingles), ("shingle_offsets", offsets)):
        with atomic_write(target / f"{name}.npy") as f:
            np.save(f, array)
    write_bytes_atomic(target / "ids.json", orjson.dumps(ids))
    write_bytes_atomic(target / "done.json", orjson.dumps({"documents": len(texts)}))
    return len(texts)


def _shard_dirs(ctx: PrepareContext) -> list[Path]:
    return [ctx.workdir / "shards" / s.part_name for s in ctx.shards]


def _concatenate_shingles(dirs: list[Path], target: Path) -> tuple[np.ndarray, np.ndarray]:
    """All shards' shingles in one memory-mapped file, and global per-document offsets."""
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    with atomic_write(target) as f:
        for d in dirs:
            f.write(np.load(d / "shingles.npy", mmap_mode="r").tobytes())
            local = np.load(d / "shingle_offsets.npy")
            offsets.append(local[1:] + base)
            base += int(local[-1])
    shingles = np.memmap(target, dtype=np.uint64, mode="r") if base else np.empty(0, dtype=np.uint64)
    return shingles, np.concatenate(offsets)


def near_duplicate_pairs(dirs: list[Path], eligible: np.ndarray, num_docs: int, bands: int) -> np.ndarray:
    """Distinct candidate pairs among `eligible` documents, one band column in memory at a time."""
    found = []
    for band in range(bands):
        column = np.concatenate([np.load(d / "bands.npy", mmap_mode="r")[:, band] for d in dirs])
        found.append(bucket_pairs(column[eligible], eligible))
    return unique_pairs(np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64), num_docs)


def candidate_pairs(dirs: list[Path], eligible: np.ndarray, num_docs: int, config: DedupConfig) -> tuple[np.ndarray, dict]:
    """Distinct candidate pairs among `eligible` documents by the configured method, and its layout
    for the summary, with the chance that a pair of a given Jaccard similarity becomes a candidate."""
    if config.method == "minhash":
        bands, rows = config.band_layout()
        layout = {"bands": bands, "rows": rows}
        pairs = near_duplicate_pairs(dirs, eligible, num_docs, bands)
        chance = functools.partial(candidate_probability, bands=bands, rows=rows)
    else:
        hamming = config.max_hamming()
        blocks = config.blocks or choose_blocks(hamming, len(eligible))
        layout = {"hamming": hamming, "blocks": blocks, "tables": math.comb(blocks, hamming)}
        values = np.concatenate([np.load(d / "simhash.npy") for d in dirs])[eligible]
        pairs = hamming_pairs(values, eligible, hamming, blocks)
        chance = functools.partial(find_probability, hamming=hamming)
    layout["candidate_probability"] = {f"{s:.2f}": round(float(chance(s)), 4)
                                       for s in (0.5, 0.7, config.threshold, 0.9, 0.95)}
    return pairs, layout


class Stopwatch:
    """Seconds spent per named step, for stats.json."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


@dataclass
class Decision:
    """What `decide` concluded for every document (global index)."""

    codes: np.ndarray  # KEEP, EXACT or NEAR
    exact_keeper: np.ndarray  # the document kept in place of each one (itself if unique)
    near_keeper: np.ndarray
    summary: dict


def decide(dirs: list[Path], config: DedupConfig, shingles: np.ndarray, offsets: np.ndarray) -> Decision:
    clock = Stopwatch()
    keys = np.concatenate([np.load(d / "exact.npy") for d in dirs])
    lengths = np.concatenate([np.load(d / "lengths.npy") for d in dirs])
    n = len(keys)
    index = np.arange(n)
    exact_keeper = keepers(group_labels(keys), lengths, config.keep)
    codes = np.where(exact_keeper != index, EXACT, KEEP).astype(np.uint8)
    eligible = np.flatnonzero(codes == KEEP)
    clock.lap("exact")
    candidates, layout = candidate_pairs(dirs, eligible, n, config)
    clock.lap("candidates")
    if config.verify:
        verified = candidates[jaccard_pairs(shingles, offsets, candidates) >= config.threshold]
    else:
        verified = candidates
    clock.lap("verify")
    labels = connected_components(n, verified)
    near_keeper = keepers(labels, lengths, config.keep)
    codes[near_keeper != index] = NEAR
    clock.lap("cluster")
    cluster_sizes = np.bincount(labels, minlength=n)
    summary = {
        "method": config.method, **layout,
        "exact_duplicates": int((codes == EXACT).sum()),
        "candidate_pairs": len(candidates),
        "verified_pairs": len(verified),
        "rejected_pairs": len(candidates) - len(verified) if config.verify else None,
        "clusters": int((cluster_sizes > 1).sum()),
        "near_duplicates": int((codes == NEAR).sum()),
        "seconds": clock.laps,
    }
    return Decision(codes, exact_keeper, near_keeper, summary)


class IdLookup:
    """Document ids by global index, reading each shard's ids only when first needed."""

    def __init__(self, dirs: list[Path], starts: np.ndarray):
        self.dirs, self.starts, self._loaded = dirs, starts, {}

    def __call__(self, docs: np.ndarray) -> list[str]:
        shards = (np.searchsorted(self.starts, docs, side="right") - 1).tolist()
        local = (docs - self.starts[shards]).tolist()
        for shard in set(shards) - self._loaded.keys():
            self._loaded[shard] = orjson.loads((self.dirs[shard] / "ids.json").read_bytes())
        return [self._loaded[s][i] for s, i in zip(shards, local)]


def write_audit(path: Path, ids: IdLookup, decision: Decision, shingles: np.ndarray, offsets: np.ndarray) -> None:
    """One row per document of every duplicate cluster, grouped by cluster.

    A cluster is everything that ends with the same kept document (through exact copies, then
    near-duplicates); `cluster` is that document's id. `removed` says at which level a document
    went (null: kept), `similarity` is its Jaccard similarity to the kept document.
    """
    final = decision.near_keeper[decision.exact_keeper]
    members = np.flatnonzero(np.bincount(final, minlength=len(final))[final] > 1)
    members = members[np.lexsort((members, final[members]))]
    similarity = np.round(jaccard_pairs(shingles, offsets, np.stack(
        [decision.exact_keeper[members], final[members]], axis=1)), 4)  # an exact copy is its keeper's text
    levels = [None, "exact", "near"]
    with JsonlZstWriter(path) as writer:
        for doc_id, cluster, code, value in zip(ids(members), ids(final[members]),
                                                decision.codes[members].tolist(), similarity.tolist()):
            writer.write({"id": doc_id, "cluster": cluster, "kept": code == KEEP, "removed": levels[code],
                          "similarity": value})


class DedupStage(Stage):
    name = "dedup"
    description = "Remove exact duplicates, then near-duplicates (MinHash + LSH or SimHash, verified by Jaccard)."
    Config = DedupConfig

    def __init__(self, config: DedupConfig | None = None):
        super().__init__(config)
        self._workdir: Path | None = None

    def prepare(self, ctx: PrepareContext) -> None:
        self._workdir = ctx.workdir
        if (ctx.workdir / "summary.json").exists():
            return  # decided in an earlier, interrupted run
        clock = Stopwatch()
        hash_one = functools.partial(hash_shard, config=self.config, workdir=ctx.workdir)
        sizes = ctx.map(hash_one, ctx.shards, "dedup: hashing")
        dirs = _shard_dirs(ctx)
        starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        shingles, offsets = _concatenate_shingles(dirs, ctx.workdir / "shingles.bin")
        clock.lap("hash")
        decision = decide(dirs, self.config, shingles, offsets)
        clock.lap("decide")  # itemized inside decision.summary
        write_audit(ctx.workdir.parent / AUDIT_FILE, IdLookup(dirs, starts), decision, shingles, offsets)
        clock.lap("audit")
        decision.summary["seconds"] = {"hash": clock.laps["hash"], **decision.summary["seconds"],
                                       "audit": clock.laps["audit"]}
        for shard, begin, end in zip(ctx.shards, starts[:-1], starts[1:]):
            with atomic_write(ctx.workdir / "decisions" / f"{shard.part_name}.npy") as f:
                np.save(f, decision.codes[begin:end])
        write_bytes_atomic(ctx.workdir / "summary.json", orjson.dumps(decision.summary))
        for d in dirs:  # the decisions are made: the per-shard hashes are no longer needed
            shutil.rmtree(d)
        (ctx.workdir / "shingles.bin").unlink()

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
