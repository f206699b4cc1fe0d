"""The token dataset format (DESIGN.md, "Token dataset format", version 1).

A directory holding:

    manifest.json  format, version, dtype, vocab_size, counts, bos/eos ids, tokenizer
                   fingerprint and special tokens, mask summary, every file's size and sha256,
                   the config that produced it; written last, so no manifest = not finished
    tokens.bin     token ids, little-endian uint16 or uint32, documents back to back
    docs.idx       uint64 token offsets, num_documents + 1 of them
    mask.bin       optional loss mask, 1 bit per token (np.packbits, little bit order), 1 = trained on

The writer streams: tokens, offsets and mask bits go to disk as documents arrive (memory does
not grow with the corpus); files are renamed into place and the manifest written only when
all are complete. The reader maps the files (`np.memmap`, nothing read up front) after checking
the manifest against the sizes on disk; `verify_token_dataset` also checks checksums, offsets
and that every id is below vocab_size.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fuelline.io.atomic import AtomicFile, write_bytes_atomic

FORMAT, VERSION = "fuelline.tokens", 1
MANIFEST, TOKENS, OFFSETS, MASK = "manifest.json", "tokens.bin", "docs.idx", "mask.bin"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


class TokenFormatError(ValueError):
    """A token dataset that is missing, incomplete, corrupted or inconsistent."""

    def __init__(self, path: str | os.PathLike, what: str):
        super().__init__(f"{os.fspath(path)}: {what}")


def dtype_for(max_id: int) -> str:
    """The narrowest dtype that holds `max_id`: uint16 up to 65,535, else uint32."""
    return "uint16" if max_id <= 0xFFFF else "uint32"


def check_dtype(dtype: str, max_id: int, where: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"{where}: dtype must be uint16 or uint32, not {dtype!r}")
    if max_id > np.iinfo(DTYPES[dtype]).max:
        raise ValueError(f"{where}: token id {max_id:,} does not fit in {dtype} (max "
                         f"{np.iinfo(DTYPES[dtype]).max:,}); use --dtype uint32 or auto")


def sha256_file(path: Path, block: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


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
        self.num_tokens += int(len(ids))
        self.num_documents += int(len(lengths))
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


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise TokenFormatError(directory, "no manifest.json: not a token dataset, or its writing never finished")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise TokenFormatError(path, f"unreadable manifest: {e}") from None
    if manifest.get("format") != FORMAT:
        raise TokenFormatError(path, f"format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise TokenFormatError(path, f"format version {manifest.get('version')} is not supported (this is {VERSION})")
    if manifest.get("dtype") not in DTYPES:
        raise TokenFormatError(path, f"unknown dtype {manifest.get('dtype')!r}")
    return manifest


class TokenFiles:
    """A token dataset opened for reading: memory maps of its files, checked against the manifest."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.manifest = m = read_manifest(directory)
        self.dtype = DTYPES[m["dtype"]]
        expected = {TOKENS: m["num_tokens"] * self.dtype.itemsize, OFFSETS: (m["num_documents"] + 1) * 8}
        if m["mask"] is not None:
            expected[MASK] = (m["num_tokens"] + 7) // 8
        for name, size in expected.items():
            path = self.directory / name
            if not path.exists():
                raise TokenFormatError(path, "missing")
            actual = path.stat().st_size
            if actual != size or m["files"][name]["size"] != size:
                raise TokenFormatError(path, f"{actual:,} bytes on disk, the manifest implies {size:,} "
                                             "(truncated or from another run)")
        self._maps: list[mmap.mmap] = []
        self.tokens = self._map(TOKENS, self.dtype)
        self.offsets = self._map(OFFSETS, np.dtype("<u8"))
        self.mask_bits = self._map(MASK, np.dtype("u1")) if m["mask"] is not None else None

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
    """Full check of a token dataset; raises TokenFormatError on the first problem, returns the manifest."""
    files = TokenFiles(directory)
    m = files.manifest
    for name, described in m["files"].items():
        if sha256_file(files.directory / name) != described["sha256"]:
            raise TokenFormatError(files.directory / name, "checksum mismatch: the file is corrupted")
    offsets = files.offsets
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != m["num_tokens"] or np.any(np.diff(offsets.astype(np.int64)) < 0)):
        raise TokenFormatError(files.directory / OFFSETS, "document offsets do not run from 0 to num_tokens in order")
    for start in range(0, m["num_tokens"], 1 << 24):
        top = int(files.tokens[start:start + (1 << 24)].max())
        if top >= m["vocab_size"]:
            raise TokenFormatError(files.directory / TOKENS, f"token id {top} >= vocab_size {m['vocab_size']}")
    if m["mask"] is not None:
        supervised = int(np.unpackbits(files.mask_bits, bitorder="little")[: m["num_tokens"]].sum()) if m["num_tokens"] else 0
        if supervised != m["mask"]["supervised_tokens"]:
            raise TokenFormatError(files.directory / MASK, f"{supervised:,} supervised tokens, manifest says "
                                                           f"{m['mask']['supervised_tokens']:,}")
    return m
