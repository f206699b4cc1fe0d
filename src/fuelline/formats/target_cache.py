"""The target cache on disk: DeepSpec's version 2, byte for byte, and fuelline's own format.

A cache directory holds `manifest.json` (written last: no manifest = not finished),
`samples.idx` (one fixed-size little-endian record per sample, sample ids dense) and shard files
`shard-00000.bin`, `shard-00001.bin`, … holding each sample's tensors back to back:

    field                       dtype                 shape
    input_ids                   int32                 [T]
    attention_mask              uint8                 [T]       (all ones: padding is never stored)
    loss_mask                   uint8                 [T]
    target_hidden_states        bfloat16 | e4m3       [T, L·H]  (the captured layers side by side)
    target_last_hidden_states   bfloat16 | e4m3       [T, H]    (the final normed hidden state)

**deepspec-v2** (docs/design.md, "Target cache"): index records `<QIIQQQQQ` (56 bytes: sample_id,
shard_id, seq_len, then the byte offset of each of the five tensors), tensors packed with no
padding, manifest fields as the reference writes them (JSON, indent 2, sorted keys). A plain
fp8 cast (`float8_e4m3fn`, no scale) is what version 2 calls fp8; we write bf16 there.

**fuelline** (version 2) adds what version 2 lacks. A record is one contiguous block starting
at a 64-byte boundary: the source record id (UTF-8), then the five tensors, then, for fp8, the
scales `target_hidden_scales` float32 [T, L] and `target_last_hidden_scales` float32 [T]; every
field starts at a 64-byte boundary and the gaps are zero bytes. Index records `<QIIQQQIIQ`
(56 bytes): sample_id, shard_id, seq_len, the record's offset and length, its xxh3-64 checksum
(over the whole block, padding included), the id's length, the number of supervised tokens, and
`index_checksum`: the xxh3-64 of the record's first 48 bytes seeded with the manifest's digest
(`manifest_digest`, over the whole manifest). So an edited index field fails its own record, and
an edited manifest fails every record: neither can lie without the other being rewritten to
match. The manifest adds the model and tokenizer fingerprints, the sources, and counts.
Version 1 (48-byte records, no index checksum) is refused, saying to rebuild (docs/cache.md).

fp8 (`float8_e4m3fn` with a float32 scale per token and layer): x ≈ q · s with
s = max|x| / 448 over the token's H values at that layer. Rounding to e4m3 (3 mantissa bits,
subnormals below 2^-6) bounds the error of each value by

    |x̂ − x| ≤ |x| / 16 + s / 1024

and widening to bfloat16 adds its own rounding (≤ |x| / 256). Non-finite hidden states cannot
be scaled and are an error when the cache is built.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from fuelline.formats.errors import FormatError
from fuelline.io.atomic import write_bytes_atomic

MANIFEST, INDEX = "manifest.json", "samples.idx"
DEEPSPEC_V2, FUELLINE = "deepspec-v2", "fuelline"
FORMATS = (DEEPSPEC_V2, FUELLINE)
FUELLINE_FORMAT_NAME, FUELLINE_VERSION, DEEPSPEC_VERSION = "fuelline.target-cache", 2, 2
BF16, FP8 = "bfloat16", "float8_e4m3fn"
HIDDEN_DTYPES = {"bf16": BF16, "bfloat16": BF16, "fp8": FP8, "float8_e4m3fn": FP8}
TOKEN_DTYPE, MASK_DTYPE, SCALE_DTYPE = "int32", "uint8", "float32"
ALIGN = 64
CHECKSUM = "xxh3_64"  # of records, index records and the manifest (fuelline format)
FP8_MAX = 448.0  # the largest finite float8_e4m3fn

TENSORS = ("input_ids", "attention_mask", "loss_mask", "target_hidden_states", "target_last_hidden_states")
SCALES = ("target_hidden_scales", "target_last_hidden_scales")

V2_INDEX = np.dtype([("sample_id", "<u8"), ("shard_id", "<u4"), ("seq_len", "<u4"),
                     ("input_ids", "<u8"), ("attention_mask", "<u8"), ("loss_mask", "<u8"),
                     ("target_hidden_states", "<u8"), ("target_last_hidden_states", "<u8")])
FUELLINE_INDEX = np.dtype([("sample_id", "<u8"), ("shard_id", "<u4"), ("seq_len", "<u4"),
                           ("offset", "<u8"), ("nbytes", "<u8"), ("checksum", "<u8"),
                           ("id_len", "<u4"), ("loss_tokens", "<u4"), ("index_checksum", "<u8")])
SEALED_BYTES = 48  # the fuelline index record's bytes its index_checksum covers: all but itself
assert V2_INDEX.itemsize == 56 and FUELLINE_INDEX.itemsize == SEALED_BYTES + 8

V2_REQUIRED = ("version", "num_samples", "num_shards", "target_layer_ids", "hidden_dtype", "token_dtype",
               "mask_dtype", "index_record_size", "hidden_size", "shards")


class CacheFormatError(FormatError):
    """A target cache that is missing, unfinished, damaged or inconsistent; says which file and what."""


def shard_name(shard_id: int) -> str:
    return f"shard-{shard_id:05d}.bin"


SHARD_FILES = "shard-*.bin"  # every shard_name


def align(n):
    """`n` (an int or an array of them) rounded up to a multiple of ALIGN."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Layout:
    """The shape of one cache: which format, layers, hidden size and hidden dtype. Knows every
    field's dtype, shape and byte size for a given sequence length, and where each field lies."""

    format: str
    num_layers: int
    hidden_size: int
    hidden_dtype: str = BF16

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"cache format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if self.hidden_dtype not in (BF16, FP8):
            raise ValueError(f"hidden dtype must be bf16 or fp8, not {self.hidden_dtype!r}")
        if self.format == DEEPSPEC_V2 and self.hidden_dtype == FP8:
            raise ValueError("--hidden-dtype fp8 needs --format fuelline: version 2 has no place for scales "
                             "(its fp8 is a plain cast with no error bound)")

    @property
    def scaled(self) -> bool:
        return self.hidden_dtype == FP8

    @property
    def fields(self) -> tuple[str, ...]:
        return TENSORS + (SCALES if self.scaled else ())

    def field_spec(self, name: str, seq_len: int) -> tuple[np.dtype, tuple[int, ...]]:
        """(numpy storage dtype, shape) of one field; bf16 is stored as uint16, e4m3 as uint8."""
        hidden = np.dtype("<u2") if self.hidden_dtype == BF16 else np.dtype("u1")
        return {
            "input_ids": (np.dtype("<i4"), (seq_len,)),
            "attention_mask": (np.dtype("u1"), (seq_len,)),
            "loss_mask": (np.dtype("u1"), (seq_len,)),
            "target_hidden_states": (hidden, (seq_len, self.num_layers * self.hidden_size)),
            "target_last_hidden_states": (hidden, (seq_len, self.hidden_size)),
            "target_hidden_scales": (np.dtype("<f4"), (seq_len, self.num_layers)),
            "target_last_hidden_scales": (np.dtype("<f4"), (seq_len,)),
        }[name]

    def field_nbytes(self, name: str, seq_len: int) -> int:
        dtype, shape = self.field_spec(name, seq_len)
        return dtype.itemsize * math.prod(shape)

    def relative_offsets(self, seq_len: int, id_len: int = 0) -> dict[str, int]:
        """Each field's offset from the start of a sample's bytes, and `end`: the sample's size."""
        if self.format == FUELLINE:
            return {"record_id": 0, **self._offsets(seq_len, align(id_len))}
        return self._offsets(seq_len, 0)

    def bytes_per_token(self) -> int:
        """Shard bytes per token, ignoring the per-record id and alignment padding."""
        return sum(self.field_nbytes(name, 1) for name in self.fields)

    def record_sizes(self, seq_len, id_len=None) -> np.ndarray:
        """The byte size of many records at once (int64), from their lengths and, in the fuelline
        format, their ids' lengths in bytes."""
        first = align(np.asarray(id_len, dtype=np.int64)) if self.format == FUELLINE else 0
        return self._offsets(np.asarray(seq_len, dtype=np.int64), first)["end"]

    def field_offsets(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """Each field's byte offset in its shard for every record of `index` (int64 arrays): version 2's
        index holds them; a fuelline record's follow from its offset, id length and seq_len."""
        if self.format != FUELLINE:
            return {name: index[name].astype(np.int64) for name in self.fields}
        first = index["offset"].astype(np.int64) + align(index["id_len"].astype(np.int64))
        return self._offsets(index["seq_len"].astype(np.int64), first)

    def _offsets(self, seq, at):
        """Each field's offset and `end`, for one record or many (numpy arrays), from where the first
        field is: back to back, each padded to ALIGN in the fuelline format."""
        offsets = {}
        for name in self.fields:
            offsets[name] = at
            nbytes = seq * self.field_nbytes(name, 1)
            at = at + (align(nbytes) if self.format == FUELLINE else nbytes)
        offsets["end"] = at
        return offsets

    def index_dtype(self) -> np.dtype:
        return FUELLINE_INDEX if self.format == FUELLINE else V2_INDEX

    def pieces(self, record_id: str, arrays: dict[str, np.ndarray]):
        """One sample's bytes as a sequence of buffers (fields and zero padding), without copying
        the fields, and each field's offset from the sample's start (`end` = its length).

        `arrays` holds numpy arrays already in storage dtype (see `field_spec`) with the sample's
        shape; a wrong dtype or shape is a bug in the caller and raises."""
        seq_len = int(arrays["input_ids"].shape[0])
        id_bytes = record_id.encode("utf-8") if self.format == FUELLINE else b""
        offsets = self.relative_offsets(seq_len, len(id_bytes))
        fields = [("record_id", id_bytes)] if self.format == FUELLINE else []
        for name in self.fields:
            dtype, shape = self.field_spec(name, seq_len)
            array = arrays[name]
            if array.dtype != dtype or array.shape != shape:
                raise ValueError(f"{name}: expected {dtype}{list(shape)}, got {array.dtype}{list(array.shape)}")
            fields.append((name, memoryview(np.ascontiguousarray(array)).cast("B")))
        parts, at = [], 0
        for name, data in fields:
            if offsets[name] > at:
                parts.append(bytes(offsets[name] - at))
            parts.append(data)
            at = offsets[name] + len(data)
        if offsets["end"] > at:
            parts.append(bytes(offsets["end"] - at))
        return parts, offsets

    def serialize(self, record_id: str, arrays: dict[str, np.ndarray]) -> tuple[bytes, dict[str, int]]:
        """`pieces`, joined: one sample's bytes and each field's offset from its start."""
        parts, offsets = self.pieces(record_id, arrays)
        return b"".join(parts), offsets


def checksum(data) -> int:
    """The fuelline format's checksum of a record's bytes (`CHECKSUM`, named in its manifest)."""
    return xxhash.xxh3_64_intdigest(data)


def checksum_of(parts) -> int:
    """`checksum` of the buffers `parts` back to back, without joining them (as `pieces` returns a record)."""
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part)
    return digest.intdigest()


def index_entry(layout: Layout, sample_id: int, shard_id: int, seq_len: int, offset: int, fields: dict[str, int],
                digest: int = 0, id_len: int = 0, loss_tokens: int = 0) -> tuple:
    """One samples.idx record, as a tuple for `layout.index_dtype()`, of a sample written at `offset`
    whose fields lie at `fields` (relative offsets, as `pieces` returns them); `digest`, `id_len` and
    `loss_tokens` are the fuelline format's (the checksum of the sample's bytes)."""
    if layout.format == FUELLINE:  # index_checksum: filled by `seal_index` once the manifest is known
        return sample_id, shard_id, seq_len, offset, fields["end"], digest, id_len, loss_tokens, 0
    return (sample_id, shard_id, seq_len, *(offset + fields[name] for name in TENSORS))


def cache_manifest(layout: Layout, layer_ids: list[int], shards: list[tuple[int, int]], build: dict[str, Any]) -> dict:
    """The manifest of a finished cache. `shards`: each shard's (bytes, samples), in shard id order;
    `build`: what the build records of itself, the manifest fields `target_model_name_or_path`,
    `chat_template`, `max_length`, `min_loss_tokens`, `num_tokens`, `num_loss_tokens`,
    `model_fingerprint`, `tokenizer_fingerprint` and `sources` (each input's path, size and sha256).
    Version 2 keeps only what the reference writes, and the sources' paths."""
    entries = [{"shard_id": k, "file_name": shard_name(k)} for k in range(len(shards))]
    common = {
        "num_samples": sum(samples for _, samples in shards), "num_shards": len(shards),
        "target_layer_ids": list(layer_ids), "hidden_dtype": layout.hidden_dtype, "token_dtype": TOKEN_DTYPE,
        "mask_dtype": MASK_DTYPE, "index_record_size": layout.index_dtype().itemsize,
        "hidden_size": layout.hidden_size, "shards": entries,
        **{key: build[key] for key in ("target_model_name_or_path", "chat_template", "max_length", "min_loss_tokens")},
    }
    if layout.format == DEEPSPEC_V2:
        return {"version": DEEPSPEC_VERSION, **common, "source_jsonl_paths": [s["path"] for s in build["sources"]]}
    for entry, (nbytes, samples) in zip(entries, shards):
        entry.update(num_bytes=nbytes, num_samples=samples)
    return {"format": FUELLINE_FORMAT_NAME, "version": FUELLINE_VERSION, **common, "alignment": ALIGN,
            "checksum": CHECKSUM, "scale_dtype": SCALE_DTYPE if layout.scaled else None,
            **{key: build[key] for key in ("model_fingerprint", "tokenizer_fingerprint", "sources", "num_tokens",
                                           "num_loss_tokens")}}


def manifest_digest(manifest: dict[str, Any]) -> int:
    """xxh3-64 of the manifest's canonical JSON (sorted keys, no spaces): any edited, added or
    removed field changes it, and neither whitespace nor key order does."""
    return checksum(orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS))


def index_checksums(index: np.ndarray, manifest: dict[str, Any]) -> np.ndarray:
    """What each fuelline index record's `index_checksum` must be under `manifest` (uint64).
    One xxh3 call per record: 0.3 s for 1.3 M records."""
    seed = manifest_digest(manifest)
    raw = np.ascontiguousarray(index).view(np.uint8).reshape(len(index), FUELLINE_INDEX.itemsize)
    sealed = raw[:, :SEALED_BYTES].tobytes()
    return np.fromiter((xxhash.xxh3_64_intdigest(sealed[k: k + SEALED_BYTES], seed)
                        for k in range(0, len(sealed), SEALED_BYTES)), dtype=np.uint64, count=len(index))


def seal_index(index: np.ndarray, manifest: dict[str, Any]) -> None:
    """Fill in every record's `index_checksum` (in place): binds the records to each other's
    fields and to the manifest they are published with."""
    index["index_checksum"] = index_checksums(index, manifest)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """manifest.json as the reference writes it (indent 2, sorted keys), atomically."""
    write_bytes_atomic(directory / MANIFEST,
                       orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest, checked field by field; a clear CacheFormatError for anything a reader cannot trust."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise CacheFormatError(directory, "a file, not a cache directory (a target cache is a directory holding "
                                          f"{MANIFEST}, {INDEX} and its shards)" if directory.exists()
                               else "no such cache directory")
    if not path.exists():
        building = (directory / ".build").exists()
        raise CacheFormatError(path, "missing: the cache build has not finished (run the same build again to "
                                     "resume it)" if building else "missing: not a target cache")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise CacheFormatError(path, f"not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise CacheFormatError(path, "not a JSON object")
    missing = [key for key in V2_REQUIRED if key not in manifest]
    if missing:
        raise CacheFormatError(path, f"missing field(s) {', '.join(missing)}")

    def check(ok: bool, what: str):
        if not ok:
            raise CacheFormatError(path, what)

    fmt = cache_format(manifest)
    version = manifest["version"]
    check(not (fmt == FUELLINE and version == 1),
          "fuelline target cache version 1, written before index and manifest checksums: this version "
          f"reads only version {FUELLINE_VERSION}; rebuild it with `fuelline cache build` into a new directory")
    check(version == (FUELLINE_VERSION if fmt == FUELLINE else DEEPSPEC_VERSION),
          f"unsupported version {version!r} for format {fmt}")
    check(manifest["hidden_dtype"] in ((BF16, FP8) if fmt == FUELLINE else (BF16, FP8, "float8_e5m2")),
          f"unsupported hidden_dtype {manifest['hidden_dtype']!r}")
    check(manifest["token_dtype"] == TOKEN_DTYPE, f"token_dtype must be {TOKEN_DTYPE}, not {manifest['token_dtype']!r}")
    check(manifest["mask_dtype"] == MASK_DTYPE, f"mask_dtype must be {MASK_DTYPE}, not {manifest['mask_dtype']!r}")
    index = FUELLINE_INDEX if fmt == FUELLINE else V2_INDEX
    check(manifest["index_record_size"] == index.itemsize,
          f"index_record_size {manifest['index_record_size']!r} is not {index.itemsize}")
    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    for key in ("num_samples", "num_shards", "hidden_size"):
        check(count(manifest[key]), f"{key} must be a non-negative integer")
    check(manifest["hidden_size"] > 0, "hidden_size must be positive")
    layers = manifest["target_layer_ids"]
    check(isinstance(layers, list) and layers and all(isinstance(x, int) and not isinstance(x, bool) for x in layers),
          "target_layer_ids must be a non-empty list of integers")
    check(layers == sorted(set(layers)), "target_layer_ids must be sorted ascending, without repeats")
    shards = manifest["shards"]
    check(isinstance(shards, list) and len(shards) == manifest["num_shards"],
          f"num_shards {manifest['num_shards']} does not match the {len(shards) if isinstance(shards, list) else 0} "
          "shard entries")
    for k, shard in enumerate(shards):
        check(isinstance(shard, dict) and shard.get("shard_id") == k and isinstance(shard.get("file_name"), str),
              f"shard entry {k} must be {{shard_id: {k}, file_name: …}}")
        check(count(shard.get("num_bytes", 0)), f"shard {k}: num_bytes must be a non-negative integer")
        name = shard["file_name"]
        check("/" not in name and "\\" not in name and name not in ("", ".", ".."),
              f"shard {k}: file name {name!r} must be a plain name inside the cache directory")
    return manifest


def cache_format(manifest: dict[str, Any]) -> str:
    return FUELLINE if manifest.get("format") == FUELLINE_FORMAT_NAME else DEEPSPEC_V2


def layout_of(manifest: dict[str, Any]) -> Layout:
    fmt = cache_format(manifest)
    dtype = manifest["hidden_dtype"]
    if fmt == DEEPSPEC_V2 and dtype != BF16:
        # Version 2's plain fp8 casts: read as stored, one byte per value, no scales.
        return _PlainFp8Layout(fmt, len(manifest["target_layer_ids"]), manifest["hidden_size"], dtype)
    return Layout(fmt, len(manifest["target_layer_ids"]), manifest["hidden_size"], dtype)


@dataclass(frozen=True)
class _PlainFp8Layout(Layout):
    """A version-2 cache of plain fp8 casts (written by the reference, never by us)."""

    def __post_init__(self):
        pass

    @property
    def scaled(self) -> bool:
        return False

    def field_spec(self, name: str, seq_len: int):
        dtype, shape = Layout.field_spec(self, name, seq_len)
        return (np.dtype("u1"), shape) if name.startswith("target_") else (dtype, shape)


def read_index(directory: str | os.PathLike, manifest: dict[str, Any]) -> np.ndarray:
    """samples.idx as a structured array (memory-mapped), with its size checked against the manifest."""
    path = Path(directory) / INDEX
    if not path.exists():
        raise CacheFormatError(path, "missing")
    dtype = layout_of(manifest).index_dtype()
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise CacheFormatError(path, f"size {size:,} is not a multiple of the {dtype.itemsize}-byte record "
                                     "(truncated or from another format)")
    if size // dtype.itemsize != manifest["num_samples"]:
        raise CacheFormatError(path, f"holds {size // dtype.itemsize:,} records; the manifest says "
                                     f"{manifest['num_samples']:,} samples")
    if size == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")
