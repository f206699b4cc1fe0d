"""The token dataset format (docs/design.md, "Token dataset", version 1).

A directory holding:

    manifest.json  format, version, dtype, vocab_size, counts, bos/eos ids, tokenizer
                   fingerprint and special tokens, mask summary, every file's size and sha256,
                   the config that produced it; written last, so no manifest = not finished
    tokens.bin     token ids, little-endian uint16 or uint32, documents back to back
    docs.idx       uint64 token offsets, num_documents + 1 of them
    mask.bin       optional loss mask, 1 bit per token (np.packbits, little bit order), 1 = trained on

The writer streams: tokens, offsets and mask bits go to disk as documents arrive (memory does
not grow with the corpus); files are renamed into place and the manifest written only when
all are complete.

The reader trusts nothing it has not checked. Opening (`TokenFiles`) costs one read of the
manifest and one pass over docs.idx, never a read of tokens.bin:
- the manifest against a typed schema (`validate_manifest`): every field present with its type
  and range, file sizes consistent with the counts, and a mask field that agrees with the files
  (a mask.bin the manifest does not describe is refused, not ignored);
- every file's size on disk against the manifest;
- docs.idx: starts at 0, never decreases, ends at num_tokens (8 bytes a document, in blocks).
What opening cannot see, a changed byte inside tokens.bin or mask.bin or an offset moved between
its neighbours, `verify_token_dataset` finds: it also checks every sha256, that every id is below
vocab_size, and the mask's supervised count. The loader checks ids against vocab_size as it
gathers them (`loader/dataset.py`). Every problem is a `TokenFormatError` naming the file (and,
for the manifest, the field).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fuelline.formats.errors import FormatError
from fuelline.io.atomic import AtomicFile, write_bytes_atomic

FORMAT, VERSION = "fuelline.tokens", 1
MANIFEST, TOKENS, OFFSETS, MASK = "manifest.json", "tokens.bin", "docs.idx", "mask.bin"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
OFFSET_BLOCK = 1 << 22  # docs.idx entries checked at a time when opening (32 MiB)
SCAN_BLOCK = 1 << 24  # tokens (or mask bytes) read at a time by verify_token_dataset


class TokenFormatError(FormatError):
    """A token dataset that is missing, incomplete, corrupted or inconsistent."""


def dtype_for(max_id: int) -> str:
    """The narrowest dtype that holds `max_id`: uint16 up to 65,535, else uint32."""
    return "uint16" if max_id <= 0xFFFF else "uint32"


def check_dtype(dtype: str, max_id: int, where: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"{where}: dtype must be uint16 or uint32, not {dtype!r}")
    if max_id > np.iinfo(DTYPES[dtype]).max:
        raise ValueError(f"{where}: token id {max_id:,} does not fit in {dtype} (max "
                         f"{np.iinfo(DTYPES[dtype]).max:,}); use --dtype uint32 or auto")


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _HashingFile:
    """An AtomicFile that also computes the sha256 and size of what is written."""

    def __init__(self, path: Path):
        self.target, self.sha, self.size = AtomicFile(path), hashlib.sha256(), 0

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self.target.file.write(view)
        self.sha.update(view)
        self.size += view.nbytes

    def describe(self) -> dict:
        return {"size": self.size, "sha256": self.sha.hexdigest()}


class TokenDatasetWriter:
    """Append documents (ids and, optionally, a boolean loss mask); `close()` finishes the directory."""

    def __init__(self, directory: str | os.PathLike, *, dtype: str, vocab_size: int, bos_id: int | None,
                 eos_id: int | None, tokenizer: dict, with_mask: bool, config: dict | None = None):
        check_dtype(dtype, vocab_size - 1, os.fspath(directory))
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / MANIFEST).unlink(missing_ok=True)  # unfinished until a new manifest lands
        if not with_mask:  # a mask.bin left by an earlier run would make the reader refuse the directory
            (self.directory / MASK).unlink(missing_ok=True)
        self.dtype, self.vocab_size = DTYPES[dtype], vocab_size
        self.header = {"dtype": dtype, "vocab_size": vocab_size, "bos_id": bos_id, "eos_id": eos_id,
                       "tokenizer": tokenizer, "config": config or {}}
        self._tokens = _HashingFile(self.directory / TOKENS)
        self._offsets = _HashingFile(self.directory / OFFSETS)
        self._mask = _HashingFile(self.directory / MASK) if with_mask else None
        self._pending_bits = np.zeros(0, dtype=bool)
        self.num_tokens = self.num_documents = self.supervised = 0
        self._offsets.write(np.zeros(1, dtype="<u8"))

    def add_documents(self, ids: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Append documents given back to back: `ids` flat, `lengths` per document."""
        if len(ids) and (int(ids.max()) >= self.vocab_size or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= self.vocab_size else int(ids.min())
            raise TokenFormatError(self.directory, f"token id {bad} outside the vocabulary (size {self.vocab_size})")
        if (mask is None) != (self._mask is None):
            raise ValueError("a mask must be given for every document or for none")
        self._tokens.write(np.ascontiguousarray(ids, dtype=self.dtype))
        ends = self.num_tokens + np.cumsum(lengths, dtype=np.uint64)
        self._offsets.write(ends.astype("<u8"))
        self.num_tokens += len(ids)
        self.num_documents += len(lengths)
        if mask is not None:
            bits = np.concatenate([self._pending_bits, mask.astype(bool)])
            whole = len(bits) - len(bits) % 8
            self._mask.write(np.packbits(bits[:whole], bitorder="little"))
            self._pending_bits = bits[whole:]
            self.supervised += int(mask.sum())

    def close(self) -> dict:
        """Write the last mask bits, move every file into place, then the manifest."""
        files = {TOKENS: self._tokens, OFFSETS: self._offsets}
        if self._mask is not None:
            if len(self._pending_bits):
                self._mask.write(np.packbits(self._pending_bits, bitorder="little"))
            files[MASK] = self._mask
        for part in files.values():
            part.target.commit()
        manifest = {
            "format": FORMAT, "version": VERSION, **self.header,
            "num_tokens": self.num_tokens, "num_documents": self.num_documents,
            "mask": {"kind": "bits", "supervised_tokens": self.supervised} if self._mask is not None else None,
            "files": {name: part.describe() for name, part in files.items()},
        }
        write_bytes_atomic(self.directory / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
        return manifest

    def abort(self) -> None:
        for part in (self._tokens, self._offsets, self._mask):
            if part is not None:
                part.target.abort()


_MISSING = object()


def _describe(value: Any) -> str:
    """A JSON value as an error message names it."""
    if value is _MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return "an object"


class _Fields:
    """Typed reads of a manifest's fields; each raises TokenFormatError naming the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, field: str, expected: str, found: Any) -> TokenFormatError:
        return TokenFormatError(self.path, f"field {field}: expected {expected}, found {_describe(found)}")

    def integer(self, obj: dict, key: str, low: int = 0, high: int | None = None, *, prefix: str = "",
                nullable: bool = False) -> int | None:
        value = obj.get(key, _MISSING)
        if value is None and nullable:
            return None
        if type(value) is not int or value < low or (high is not None and value > high):
            bounds = f"from {low:,} to {high:,}" if high is not None else f"of at least {low:,}"
            raise self.fail(prefix + key, f"{'null or ' if nullable else ''}an integer {bounds}", value)
        return value

    def obj(self, obj: dict, key: str, *, prefix: str = "", nullable: bool = False) -> dict | None:
        value = obj.get(key, _MISSING)
        if value is None and nullable:
            return None
        if not isinstance(value, dict):
            raise self.fail(prefix + key, f"{'null or ' if nullable else ''}an object", value)
        return value

    def choice(self, obj: dict, key: str, allowed: tuple, *, prefix: str = "") -> Any:
        value = obj.get(key, _MISSING)
        if type(value) not in (str, int) or value not in allowed:
            raise self.fail(prefix + key, " or ".join(repr(a) if isinstance(a, str) else str(a) for a in allowed), value)
        return value


def validate_manifest(manifest: Any, path: str | os.PathLike) -> dict[str, Any]:
    """A parsed manifest checked against the format's schema (module docstring), or a TokenFormatError
    naming `path` and the first bad field. Unknown extra fields are allowed: a later writer may add some."""
    check = _Fields(Path(path))
    if not isinstance(manifest, dict):
        raise TokenFormatError(path, f"expected a JSON object at the top level, found {_describe(manifest)}")
    check.choice(manifest, "format", (FORMAT,))
    check.choice(manifest, "version", (VERSION,))
    dtype = check.choice(manifest, "dtype", tuple(DTYPES))
    vocab_size = check.integer(manifest, "vocab_size", 1, int(np.iinfo(DTYPES[dtype]).max) + 1)
    for key in ("bos_id", "eos_id"):
        check.integer(manifest, key, 0, vocab_size - 1, nullable=True)
    check.obj(manifest, "tokenizer")
    check.obj(manifest, "config")
    num_tokens = check.integer(manifest, "num_tokens")
    num_documents = check.integer(manifest, "num_documents")
    mask = check.obj(manifest, "mask", nullable=True)
    if mask is not None:
        check.choice(mask, "kind", ("bits",), prefix="mask.")
        check.integer(mask, "supervised_tokens", 0, num_tokens, prefix="mask.")
    files = check.obj(manifest, "files")
    itemsize = DTYPES[dtype].itemsize
    expected = {TOKENS: (num_tokens * itemsize, f"num_tokens × {itemsize} bytes"),
                OFFSETS: ((num_documents + 1) * 8, "(num_documents + 1) × 8 bytes")}
    if mask is not None:
        expected[MASK] = ((num_tokens + 7) // 8, "num_tokens bits, rounded up to whole bytes")
    elif MASK in files:
        raise check.fail("mask", f"an object describing {MASK}, which field files lists", None)
    for name in files:
        if name not in expected:
            raise TokenFormatError(path, f"field files.{name}: not a file of this dataset (expected "
                                         f"{', '.join(expected)})")
    for name, (size, why) in expected.items():
        entry = check.obj(files, name, prefix="files.")
        found = entry.get("size", _MISSING)
        if type(found) is not int or found != size:
            raise check.fail(f"files.{name}.size", f"{size:,} ({why})", found)
        digest = entry.get("sha256", _MISSING)
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise check.fail(f"files.{name}.sha256", "64 lowercase hex digits", digest)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a token dataset, parsed and validated (`validate_manifest`)."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        splits = sorted(p.parent.name for p in Path(directory).glob(f"*/{MANIFEST}"))
        if splits:  # a pack output: its token datasets are its split directories
            raise TokenFormatError(directory, f"no manifest.json: a pack output, whose token datasets are its split "
                                              f"directories {', '.join(splits)}; open one, e.g. "
                                              f"{Path(directory) / splits[0]}")
        raise TokenFormatError(directory, "no manifest.json: not a token dataset, or its writing never finished")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise TokenFormatError(path, f"unreadable manifest: {e}") from None
    except OSError as e:
        raise TokenFormatError(path, f"cannot be read: {e.strerror or e}") from None
    return validate_manifest(manifest, path)


def check_offsets(offsets: np.ndarray, num_tokens: int, path: str | os.PathLike) -> None:
    """docs.idx runs from 0 to num_tokens and never decreases (so every offset lies within the
    tokens): one vectorized pass, in blocks of OFFSET_BLOCK entries."""
    if len(offsets) == 0 or int(offsets[0]) != 0:
        raise TokenFormatError(path, f"the first offset is {int(offsets[0]) if len(offsets) else None}, expected 0: "
                                     "the file is corrupted")
    if int(offsets[-1]) != num_tokens:
        raise TokenFormatError(path, f"the last offset is {int(offsets[-1]):,}, expected num_tokens "
                                     f"{num_tokens:,} from {MANIFEST}: the file is corrupted")
    for first in range(0, len(offsets) - 1, OFFSET_BLOCK):
        block = offsets[first:first + OFFSET_BLOCK + 1]
        down = block[1:] < block[:-1]
        if down.any():
            k = first + int(np.argmax(down))
            raise TokenFormatError(path, f"offsets decrease at document {k:,} (from {int(offsets[k]):,} to "
                                         f"{int(offsets[k + 1]):,}): the file is corrupted")


class TokenFiles:
    """A token dataset opened for reading: memory maps of its files, checked against the manifest."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.manifest = m = read_manifest(directory)
        self.dtype = DTYPES[m["dtype"]]
        for name, described in m["files"].items():  # validated: the sizes follow from the counts
            path = self.directory / name
            if not path.is_file():
                raise TokenFormatError(path, "missing" if not path.exists() else "not a regular file")
            actual, size = path.stat().st_size, described["size"]
            if actual != size:
                raise TokenFormatError(path, f"{actual:,} bytes on disk, the manifest implies {size:,} "
                                             "(truncated or from another run)")
        if m["mask"] is None and os.path.lexists(self.directory / MASK):
            raise TokenFormatError(self.directory / MASK, f"present, but the field mask of {MANIFEST} is null and "
                                                          "its files do not list it: a loss mask the manifest does "
                                                          "not describe; delete it if it is stale, or re-pack")
        self._maps: list[mmap.mmap] = []
        self.tokens = self._map(TOKENS, self.dtype)
        self.offsets = self._map(OFFSETS, np.dtype("<u8"))
        self.mask_bits = self._map(MASK, np.dtype("u1")) if m["mask"] is not None else None
        check_offsets(self.offsets, m["num_tokens"], self.directory / OFFSETS)

    def _map(self, name: str, dtype: np.dtype) -> np.ndarray:
        """A read-only memory map as a plain ndarray (slicing an np.memmap object costs ~3x more:
        each slice builds a new memmap instance, which the loader's hot path feels)."""
        path = self.directory / name
        if path.stat().st_size == 0:
            return np.zeros(0, dtype=dtype)
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps.append(mapped)
        return np.frombuffer(mapped, dtype=dtype)

    def release(self) -> None:
        """Drop the pages this process has read from its resident set (they stay in the page
        cache, so reading them again is cheap): keeps a long pass over a large file from
        growing the process's memory."""
        for mapped in self._maps:
            mapped.madvise(mmap.MADV_DONTNEED)

    @property
    def num_documents(self) -> int:
        return self.manifest["num_documents"]

    @property
    def num_tokens(self) -> int:
        return self.manifest["num_tokens"]

    def mask(self, start: int, stop: int) -> np.ndarray | None:
        """Loss mask of tokens start..stop-1 as booleans (None when the dataset has no mask)."""
        if self.mask_bits is None:
            return None
        first, last = start // 8, (stop + 7) // 8
        bits = np.unpackbits(self.mask_bits[first:last], bitorder="little")
        return bits[start - first * 8: stop - first * 8].astype(bool)

    def document(self, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        if not 0 <= k < self.num_documents:
            raise IndexError(f"document {k} out of range ({self.num_documents} documents)")
        start, stop = int(self.offsets[k]), int(self.offsets[k + 1])
        return np.asarray(self.tokens[start:stop]), self.mask(start, stop)


def verify_token_dataset(directory: str | os.PathLike) -> dict:
    """What opening cannot see (module docstring), or a TokenFormatError at the first problem; the manifest.
    Reads tokens.bin and mask.bin once, in blocks: memory stays flat."""
    files = TokenFiles(directory)
    m = files.manifest
    for name, described in m["files"].items():
        if sha256_file(files.directory / name) != described["sha256"]:
            raise TokenFormatError(files.directory / name, f"checksum mismatch with {MANIFEST} (files.{name}.sha256): "
                                                           "the file is corrupted")
    for start in range(0, m["num_tokens"], SCAN_BLOCK):
        top = int(files.tokens[start:start + SCAN_BLOCK].max())
        if top >= m["vocab_size"]:
            raise TokenFormatError(files.directory / TOKENS, f"token id {top} >= vocab_size {m['vocab_size']} (from "
                                                             f"{MANIFEST}): the file is corrupted")
    if m["mask"] is not None:
        supervised = 0
        for start in range(0, len(files.mask_bits), SCAN_BLOCK):
            bits = np.unpackbits(files.mask_bits[start:start + SCAN_BLOCK], bitorder="little")
            supervised += int(bits[: m["num_tokens"] - start * 8].sum())
        if supervised != m["mask"]["supervised_tokens"]:
            raise TokenFormatError(files.directory / MASK, f"{supervised:,} supervised tokens, {MANIFEST} says "
                                                           f"{m['mask']['supervised_tokens']:,} (field mask.supervised_tokens)")
    return m
