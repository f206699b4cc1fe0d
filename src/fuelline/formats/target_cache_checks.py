"""The checks of a target cache's bytes (`target_cache.py` owns the bytes, this module what they
must agree on). `CacheDataset` makes the structural ones when it opens a cache (`opened`);
`fuelline cache verify` makes them all and lists every problem (`Problems`).

Without reading a record (`check_structure`):
- the manifest against `stats.json`, the build's own record of it, where there is one (caches
  built by DeepSpec have none): the fields both record, and the manifest's digest;
- fuelline: every index record's `index_checksum`, which covers the record and the manifest;
- the index: dense sample ids, shard ids inside the manifest, no empty sample, record lengths
  from seq_len (and the id length), offsets aligned; version 2: the five tensors back to back;
- the shards: present, regular files, the size the manifest records;
- the samples of each shard tile it: sorted by offset, each starts where the one before ends,
  the first at byte 0 and the last at the shard's end (both writers pack records back to back).

So a manifest or index that lies about sizes (hidden_size, layers, dtype, seq_len, offsets,
shard ids) cannot place a tensor on bytes that are not its own. Every check is vectorized over
the index: about 0.5 s for a million samples, most of it the index checksums.

Reading every record (`check_records`, fuelline format): its checksum, UTF-8 id, loss token
count and all-ones attention mask, shard by shard in offset order through a large buffer:
sequential I/O, even on a network file system.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import orjson

from fuelline.formats.target_cache import (ALIGN, FUELLINE, INDEX, MANIFEST, TENSORS, CacheFormatError,
                                           Layout, cache_format, checksum, index_checksums, manifest_digest,
                                           read_index)
from fuelline.io.stage_layout import STATS_FILE

LIMIT = 20  # problems of one kind listed before they are only counted
READ_BUFFER = 16 << 20

# Manifest fields and where stats.json records the same value (None: the key is the same).
STATS_FIELDS = {
    "num_samples": ("records_out",), "num_shards": ("cache", "shards"), "target_layer_ids": ("cache", "layers"),
    "hidden_dtype": ("cache", "hidden_dtype"), "hidden_size": ("cache", "hidden_size"),
    "target_model_name_or_path": ("identity", "model"), "chat_template": ("identity", "config", "chat_template"),
    "max_length": ("identity", "config", "max_length"), "min_loss_tokens": ("identity", "config", "min_loss_tokens"),
    "num_tokens": ("cache", "tokens"), "num_loss_tokens": ("cache", "loss_tokens"),
    "model_fingerprint": ("identity", "model_fingerprint"),
    "tokenizer_fingerprint": ("identity", "tokenizer_fingerprint"), "sources": ("identity", "inputs"),
}


class Problems:
    """Problem messages in order found, at most LIMIT of each kind, the rest counted."""

    def __init__(self):
        self.listed: list[str] = []
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, message: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= LIMIT:
            self.listed.append(message)

    def each(self, kind: str, samples: np.ndarray, message) -> None:
        """A problem for each sample of `samples` (ints); only those listed are formatted."""
        room = max(LIMIT - self.counts[kind], 0)
        self.listed += [message(k) for k in samples[:room].tolist()]
        self.counts[kind] += len(samples)

    def result(self) -> list[str]:
        return self.listed + [f"… and {n - LIMIT:,} more problems of this kind: {kind}"
                              for kind, n in self.counts.items() if n > LIMIT]


def check_structure(directory: Path, manifest: dict, layout: Layout, index: np.ndarray,
                    problems: Problems) -> tuple[list[int | None], np.ndarray]:
    """Every check of the module docstring; returns each shard's size (None: missing) and each
    sample's byte span [start, end) (0, 0 where it lies outside its shard)."""
    check_stats(directory, manifest, problems)
    if layout.format == FUELLINE:
        check_index_checksums(index, manifest, problems)
    check_index(index, manifest, layout, problems)
    sizes = check_shard_files(directory, manifest, index, problems)
    spans = check_bounds(manifest, layout, index, sizes, problems)
    check_tiling(manifest, index, spans, sizes, problems)
    return sizes, spans


def opened(directory: Path, manifest: dict, layout: Layout) -> tuple[np.ndarray, list[int]]:
    """The index and the shard sizes of a cache about to be read, or a CacheFormatError naming the
    cache and its first problem (and how many more there are)."""
    index = read_index(directory, manifest)
    problems = Problems()
    sizes, _ = check_structure(directory, manifest, layout, np.asarray(index), problems)
    found = problems.result()
    if found:
        more = sum(problems.counts.values()) - 1
        raise CacheFormatError(directory, found[0] + (f" (and {more:,} more problem{'s' * (more > 1)}: `fuelline "
                                                      "cache verify` lists them)" if more else ""))
    return index, sizes


def check_stats(directory: Path, manifest: dict, problems: Problems) -> None:
    """The manifest against stats.json's record of the build, when the build left one."""
    path = directory / STATS_FILE
    if not path.exists():
        return
    try:
        stats = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        problems.add("stats", f"{STATS_FILE}: cannot be read ({e}): the build's record to check {MANIFEST} against")
        return
    if not isinstance(stats, dict):
        problems.add("stats", f"{STATS_FILE}: not a JSON object")
        return
    for key, where in [("format", ("cache", "format"))] + list(STATS_FIELDS.items()):
        found, recorded = _lookup(stats, where)
        if not found or (key != "format" and key not in manifest):
            continue  # recorded by an older build, or not a field of this format (a removed one changes the digest)
        value = cache_format(manifest) if key == "format" else manifest[key]
        if value != recorded:
            problems.add("manifest", f"{MANIFEST}: {key} is {value!r}, but {STATS_FILE} records {recorded!r} for the "
                                     "build: the manifest was edited, or the files are from different builds")
    digest = stats.get("manifest_digest")
    if digest is not None and digest != f"{manifest_digest(manifest):016x}":
        problems.add("manifest", f"{MANIFEST}: its digest is {manifest_digest(manifest):016x}, {STATS_FILE} records "
                                 f"{digest} for the build: the manifest was edited after the build")


def _lookup(stats: dict, where: tuple[str, ...]):
    value = stats
    for key in where:
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def check_index_checksums(index: np.ndarray, manifest: dict, problems: Problems) -> None:
    """fuelline: each record's index_checksum; all of them wrong means the manifest was changed."""
    wrong = np.flatnonzero(index["index_checksum"] != index_checksums(index, manifest))
    if len(index) > 1 and len(wrong) == len(index):
        problems.add("manifest", f"{MANIFEST}: not the manifest {INDEX} was written with (every index record's "
                                 "checksum disagrees with it): edited after the build, or another cache's")
        return
    problems.each("index checksums", wrong,
                  lambda k: f"{INDEX}: sample {k}: index record checksum mismatch (the record was edited or damaged)")


def check_index(index: np.ndarray, manifest: dict, layout: Layout, problems: Problems) -> None:
    def bad(kind, where, message):
        problems.each(kind, np.flatnonzero(where), message)

    num_shards = manifest["num_shards"]
    bad("sample ids", index["sample_id"] != np.arange(len(index), dtype=np.uint64),
        lambda k: f"{INDEX}: record {k} holds sample_id {int(index['sample_id'][k])} "
                  f"(sample ids must be 0…{len(index) - 1} in order)")
    bad("shard ids", index["shard_id"] >= num_shards,
        lambda k: f"{INDEX}: sample {k}: shard_id {int(index['shard_id'][k])} is beyond the {num_shards} shards "
                  "of the manifest")
    bad("empty samples", index["seq_len"] == 0, lambda k: f"{INDEX}: sample {k}: seq_len 0")
    seq = index["seq_len"].astype(np.uint64)
    if layout.format == FUELLINE:
        expected = layout.record_sizes(seq, index["id_len"])
        bad("record lengths", index["nbytes"] != expected,
            lambda k: f"{INDEX}: sample {k}: record length {int(index['nbytes'][k]):,} does not match its seq_len "
                      f"{int(seq[k])} and id length {int(index['id_len'][k])} ({int(expected[k]):,} bytes)")
        bad("alignment", index["offset"] % np.uint64(ALIGN) != 0,
            lambda k: f"{INDEX}: sample {k}: record offset {int(index['offset'][k]):,} is not a multiple of {ALIGN}")
        bad("loss tokens", index["loss_tokens"] > index["seq_len"],
            lambda k: f"{INDEX}: sample {k}: {int(index['loss_tokens'][k])} supervised tokens in a sample of "
                      f"{int(seq[k])}")
        return
    for before, after in pairwise(TENSORS):  # version 2: the five tensors back to back, in order
        follows = index[before] + seq * np.uint64(layout.field_nbytes(before, 1))
        bad("contiguity", index[after] != follows,
            lambda k: f"{INDEX}: sample {k}: {after} at byte {int(index[after][k]):,}, but {before} ends at "
                      f"{int(follows[k]):,} (the tensors must be back to back, in order)")


def check_shard_files(directory: Path, manifest: dict, index: np.ndarray, problems: Problems) -> list[int | None]:
    """Each shard's size (None: missing), checked against the size the manifest records."""
    sizes = []
    for k, entry in enumerate(manifest["shards"]):
        path = directory / entry["file_name"]
        if not path.is_file():
            held = int((index["shard_id"] == k).sum())
            problems.add("missing shards", f"{entry['file_name']}: missing or not a file (shard {k}, {held:,} samples)")
            sizes.append(None)
            continue
        size = path.stat().st_size
        recorded = entry.get("num_bytes")
        if recorded is not None and recorded != size:
            problems.add("shard sizes", f"{entry['file_name']}: {size:,} bytes, the manifest says {recorded}: "
                                        "truncated or replaced shard")
        sizes.append(size)
    return sizes


def check_bounds(manifest: dict, layout: Layout, index: np.ndarray, sizes: list[int | None],
                 problems: Problems) -> np.ndarray:
    """Check every sample's fields lie inside its shard file; returns each sample's byte span
    [start, end) as an (N, 2) uint64 array, with start == end == 0 where it cannot be read."""
    by_shard = np.array([-1 if size is None else size for size in sizes] + [-1], dtype=np.int64)
    size = by_shard[np.minimum(index["shard_id"], len(sizes))]  # -1: unknown shard id or missing file
    present, size = size >= 0, np.maximum(size, 0).astype(np.uint64)
    seq = index["seq_len"].astype(np.uint64)
    if layout.format == FUELLINE:
        fields = {"record": (index["offset"], index["nbytes"])}
    else:
        fields = {name: (index[name], seq * np.uint64(layout.field_nbytes(name, 1))) for name in TENSORS}
    inside = present.copy()
    for name, (offset, nbytes) in fields.items():
        fits = (offset <= size) & (nbytes <= size - np.minimum(offset, size))  # no uint64 overflow
        problems.each("out of bounds", np.flatnonzero(present & ~fits),
                      lambda k: f"{manifest['shards'][int(index['shard_id'][k])]['file_name']}: sample {k}: {name} "
                                f"at byte {int(offset[k]):,} (+{int(nbytes[k]):,}) extends past the end of the shard "
                                f"({int(size[k]):,} bytes)")
        inside &= fits
    starts = np.min([offset for offset, _ in fields.values()], axis=0)
    ends = np.max([offset + nbytes for offset, nbytes in fields.values()], axis=0)
    spans = np.zeros((len(index), 2), dtype=np.uint64)
    spans[inside, 0], spans[inside, 1] = starts[inside], ends[inside]
    return spans


def check_tiling(manifest: dict, index: np.ndarray, spans: np.ndarray, sizes: list[int | None],
                 problems: Problems) -> None:
    """The readable samples of each whole shard, sorted by offset, cover it exactly: no overlap,
    no gap, nothing after the last. Shards with an unreadable sample are left to the problem
    already reported for it."""
    readable = spans[:, 1] > spans[:, 0]
    unreadable = np.bincount(index["shard_id"][~readable].astype(np.int64), minlength=len(sizes))
    for k, entry in enumerate(manifest["shards"]):
        if sizes[k] is None or (k < len(unreadable) and unreadable[k]):
            continue
        samples = np.flatnonzero(readable & (index["shard_id"] == k))
        samples = samples[np.argsort(spans[samples, 0], kind="stable")]
        starts = spans[samples, 0]
        ends = np.concatenate([[0], spans[samples, 1]]).astype(np.uint64)
        name = entry["file_name"]
        problems.each("overlaps", np.flatnonzero(starts < ends[:-1]),
                      lambda j: f"{name}: samples {int(samples[j - 1])} and {int(samples[j])} overlap")
        problems.each("gaps", np.flatnonzero(starts > ends[:-1]),
                      lambda j: f"{name}: sample {int(samples[j])} starts at byte {int(starts[j]):,}, not at "
                                f"{int(ends[j]):,} (the records are back to back from byte 0)")
        if int(ends[-1]) != sizes[k] and not (starts < ends[:-1]).any():
            problems.add("gaps", f"{name}: its samples end at byte {int(ends[-1]):,}, the shard holds {sizes[k]:,} "
                                 "bytes (bytes no sample owns)")


def load_index(directory: Path, manifest: dict, layout: Layout, problems: Problems) -> np.ndarray | None:
    """The index; when its size is wrong, the problem and then the whole records it does hold."""
    path = directory / INDEX
    try:
        return np.asarray(read_index(directory, manifest))
    except CacheFormatError as e:
        problems.add("index", str(e))
    except OSError as e:
        problems.add("index", f"{path}: cannot be read ({e.strerror or e})")
        return None
    if not path.exists():
        return None
    dtype = layout.index_dtype()
    return np.fromfile(path, dtype=dtype, count=path.stat().st_size // dtype.itemsize)


def check_records(directory: Path, manifest: dict, layout: Layout, index: np.ndarray, spans: np.ndarray,
                  problems: Problems) -> None:
    """fuelline: read every readable record (in offset order, through a large buffer) and check
    its checksum, its id, its loss token count and its attention mask."""
    readable = (spans[:, 1] > spans[:, 0]) & (index["nbytes"] == layout.record_sizes(
        index["seq_len"], index["id_len"]))
    for k, entry in enumerate(manifest["shards"]):
        samples = np.flatnonzero(readable & (index["shard_id"] == k))
        if not len(samples):
            continue
        samples = samples[np.argsort(index["offset"][samples], kind="stable")]
        name = entry["file_name"]
        try:
            with open(directory / name, "rb", buffering=READ_BUFFER) as f:
                for i in samples.tolist():
                    record = index[i]
                    f.seek(int(record["offset"]))
                    check_record(name, i, record, f.read(int(record["nbytes"])), layout, problems)
        except OSError as e:
            problems.add("unreadable shards", f"{name}: cannot be read ({e.strerror or e})")


def verify_record_checksum(data, expected: int, path: Path, sample: int) -> None:
    """The one check of a fuelline record's bytes as a reader meets them: its xxh3 against the
    index's, or a CacheFormatError naming the shard and the sample (`CacheDataset`, vocab-map)."""
    actual = checksum(data)
    if actual != expected:
        raise CacheFormatError(path, f"sample {sample}: checksum mismatch ({actual:016x}, the index says "
                                     f"{expected:016x}): the record is damaged")


def check_record(shard: str, i: int, record, data: bytes, layout: Layout, problems: Problems) -> None:
    if checksum(data) != int(record["checksum"]):
        problems.add("checksums", f"{shard}: sample {i}: checksum mismatch (the record is damaged)")
    seq_len, id_len = int(record["seq_len"]), int(record["id_len"])
    try:
        data[:id_len].decode("utf-8")
    except UnicodeDecodeError:
        problems.add("record ids", f"{shard}: sample {i}: the record id is not UTF-8")
    at = layout.relative_offsets(seq_len, id_len)
    loss = np.frombuffer(data, np.uint8, seq_len, at["loss_mask"])
    if int(loss.sum()) != int(record["loss_tokens"]):
        problems.add("loss tokens", f"{shard}: sample {i}: the loss mask has {int(loss.sum())} supervised tokens, "
                                    f"the index says {int(record['loss_tokens'])}")
    if not (np.frombuffer(data, np.uint8, seq_len, at["attention_mask"]) == 1).all():
        problems.add("attention masks", f"{shard}: sample {i}: the attention mask is not all ones")
