"""Random access to the records of plain JSONL files: `JsonlIndex(paths)[k]`.

One pass over each file's bytes (read in 8 MiB blocks, numpy per block) finds every line; blank
lines are not records. The result is an int64 array of (start, end) byte offsets, 16 bytes per
record, cached on disk (keyed by the file's absolute path) so the next open costs one small read.

Cache file: a 48-byte header (magic, the data file's size and mtime_ns, the record count, and an
xxh3-128 checksum of those fields and the offsets) followed by the offsets. A cache that does not
match the data file, or is short, corrupted, unreadable or not a regular file, is ignored: the
file is indexed again and the cache replaced atomically, so a bad cache never costs more than a
rescan, and never shortens or shifts the index. A cache that cannot be written leaves the index
whole but makes every later open rescan the file: an `IndexCacheWarning` says why, once per
cache directory and process.

Records are read with `os.pread` on a descriptor opened lazily (so the index pickles cheaply into
DataLoader workers), not through an mmap: a file truncated after indexing then gives a short
read and a clear error naming the file, where an mmap read past the new end kills the process
with SIGBUS. A pread costs ~0.6 µs more than an mmap slice (~10% of `index[k]` on a 500-byte
record). Opening the descriptor checks the file's size and mtime against the index.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import stat
import struct
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson
import xxhash

from fuelline.io import json_exact
from fuelline.io.atomic import atomic_write
from fuelline.io.suffixes import split_suffixes
from fuelline.io.remote import cache_root

SCAN_BLOCK = 8 << 20
CACHE_MAGIC = b"FLJSIDX2"
CACHE_FIELDS = struct.Struct("<8sQqQ")  # magic, data file size, data file mtime_ns, number of records
CACHE_HEADER = struct.Struct("<8sQqQ16s")  # the fields, then xxh3-128 of the fields and the offsets
DECOMPRESS_COMMANDS = {".zst": "zstd -d", ".zstd": "zstd -d", ".gz": "gunzip -k", ".bz2": "bunzip2 -k", ".xz": "unxz -k"}
WHITESPACE = np.zeros(256, dtype=bool)
WHITESPACE[[9, 10, 13, 32]] = True


class FileChangedError(RuntimeError):
    """A data file no longer matches its index (truncated, rewritten or touched since indexing)."""


class IndexCacheWarning(UserWarning):
    """A line index could not be cached: it is whole, but the next open scans the file again."""


_warned_cache_dirs: set[Path] = set()  # a cache directory that cannot be written is said once per process


def scan_line_offsets(path: str | os.PathLike) -> np.ndarray:
    """(start, end) byte offsets of the non-blank lines of a file, as an int64 array [n, 2].

    Per block: newline positions by `flatnonzero`, and a running count of non-whitespace bytes
    sampled at each newline; a line is blank when that count did not move across it. The blocks
    are read, not mapped: a file truncated while it is scanned is an error, not a SIGBUS.
    """
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return np.zeros((0, 2), dtype=np.int64)
        ends_parts, counts_parts = [], []
        carried = 0  # non-whitespace bytes before the current block
        buffer = np.empty(min(SCAN_BLOCK, size), dtype=np.uint8)
        for begin in range(0, size, SCAN_BLOCK):
            block = buffer[:min(SCAN_BLOCK, size - begin)]
            _read_exactly(f, block, path, size, begin)
            newlines = np.flatnonzero(block == 10)
            nonblank = np.cumsum(~WHITESPACE[block], dtype=np.int64)
            ends_parts.append(newlines + begin)
            counts_parts.append(nonblank[newlines] + carried)
            carried += int(nonblank[-1])
    ends = np.concatenate(ends_parts)
    counts = np.concatenate(counts_parts)
    if ends.size == 0 or ends[-1] != size - 1:  # a last line without a trailing newline
        ends = np.append(ends, size)
        counts = np.append(counts, carried)
    starts = np.concatenate(([0], ends[:-1] + 1))
    content = np.diff(counts, prepend=0) > 0
    return np.stack([starts[content], ends[content]], axis=1).astype(np.int64)


def _read_exactly(f, block: np.ndarray, path, size: int, begin: int) -> None:
    view, done = memoryview(block), 0
    while done < len(block):
        got = f.readinto(view[done:])
        if not got:
            raise FileChangedError(f"{path}: file changed while it was being indexed (it ended at byte "
                                   f"{begin + done:,}, was {size:,} bytes); index it again once it is complete")
        done += got


def _cache_path(path: Path, cache_dir: Path) -> Path:
    key = hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:32]
    return cache_dir / f"{key}.idx"


def _checksum(fields: bytes, offsets: np.ndarray) -> bytes:
    digest = xxhash.xxh3_128(fields)
    digest.update(np.ascontiguousarray(offsets, dtype="<i8").reshape(-1).view(np.uint8))
    return digest.digest()


def read_cache(cache: Path, size: int, mtime_ns: int) -> np.ndarray | None:
    """The offsets a cache holds for a data file of this size and mtime, or None when the cache
    is missing, stale, short, corrupted or not a regular file."""
    try:
        if not stat.S_ISREG(os.stat(cache).st_mode):
            return None
        with open(cache, "rb") as f:
            header = f.read(CACHE_HEADER.size)
            if len(header) != CACHE_HEADER.size:
                return None
            magic, cached_size, cached_mtime, n, digest = CACHE_HEADER.unpack(header)
            if (magic, cached_size, cached_mtime) != (CACHE_MAGIC, size, mtime_ns):
                return None
            if os.fstat(f.fileno()).st_size != CACHE_HEADER.size + 16 * n:
                return None
            offsets = np.fromfile(f, dtype="<i8", count=2 * n)
    except (OSError, ValueError):
        return None  # unreadable or damaged: the file is scanned again, and the cache rewritten
    if offsets.size != 2 * n or _checksum(header[:CACHE_FIELDS.size], offsets) != digest:
        return None
    return offsets.reshape(n, 2)


def write_cache(cache: Path, size: int, mtime_ns: int, offsets: np.ndarray) -> None:
    """Replace the cache atomically. When it cannot be written (its path holds something other
    than a regular file, or its directory cannot be written), warn and go on without it: the
    offsets are in memory, and only the next open pays a rescan."""
    if os.path.lexists(cache) and not cache.is_file():
        _warn_not_cached(cache, "its path is taken by something that is not a regular file")
        return
    fields = CACHE_FIELDS.pack(CACHE_MAGIC, size, mtime_ns, len(offsets))
    try:
        with atomic_write(cache) as f:
            f.write(fields + _checksum(fields, offsets))
            f.write(np.ascontiguousarray(offsets, dtype="<i8").tobytes())
    except OSError as e:
        _warn_not_cached(cache, f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e))


def _warn_not_cached(cache: Path, reason: str) -> None:
    if cache.parent in _warned_cache_dirs:
        return
    _warned_cache_dirs.add(cache.parent)
    warnings.warn(f"{cache}: cannot cache a JSONL line index here ({reason}); the index is whole, but each "
                  f"new JsonlIndex of the file scans it again. Pass cache_dir= a writable directory, or set "
                  f"FUELLINE_CACHE_DIR", IndexCacheWarning)


def index_file(path: Path, cache_dir: Path) -> tuple[np.ndarray, int, int]:
    """(offsets, size, mtime_ns) of a data file: from its cache when that is valid, else scanned."""
    before = path.stat()
    cache = _cache_path(path, cache_dir)
    offsets = read_cache(cache, before.st_size, before.st_mtime_ns)
    if offsets is not None:
        return offsets, before.st_size, before.st_mtime_ns
    offsets = scan_line_offsets(path)
    after = path.stat()
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise FileChangedError(f"{path}: file changed while it was being indexed (size {after.st_size:,}, was "
                               f"{before.st_size:,}); index it again once it is complete")
    write_cache(cache, before.st_size, before.st_mtime_ns, offsets)
    return offsets, before.st_size, before.st_mtime_ns


class JsonlIndex:
    """Records of one or more plain .jsonl files, addressable by global position.

    `len(index)` counts records over all files; `index[k]` parses the k-th (negative k counts
    from the end). Compressed files are refused: random access needs the plain bytes. A file
    changed after indexing (another size or mtime when first read, or a short read later) is a
    FileChangedError naming it: open a new JsonlIndex to index it again.
    """

    def __init__(self, paths: str | os.PathLike | Iterable[str | os.PathLike], *,
                 cache_dir: str | os.PathLike | None = None):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else cache_root() / "jsonl-index"
        for p in self.paths:
            _, compression = split_suffixes(p)
            if compression:
                raise ValueError(
                    f"{p}: JsonlIndex needs a plain .jsonl file for random access; decompress it "
                    f"first, for example: {DECOMPRESS_COMMANDS[compression]} {p}"
                )
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        indexed = [index_file(p, self.cache_dir) for p in self.paths]
        self._offsets = [offsets for offsets, _, _ in indexed]
        self._stats = [(size, mtime_ns) for _, size, mtime_ns in indexed]
        self._first = [0, *np.cumsum([len(o) for o in self._offsets]).tolist()]
        self._handles: list[int | None] = [None] * len(self.paths)

    def __len__(self) -> int:
        return self._first[-1]

    def _changed(self, i: int, fd: int) -> FileChangedError | None:
        """The error for file i when it no longer matches its index, else None."""
        now = os.fstat(fd)
        size, mtime_ns = self._stats[i]
        if (now.st_size, now.st_mtime_ns) == (size, mtime_ns):
            return None
        what = f"size {now.st_size:,}, was {size:,}" if now.st_size != size else "same size, modified since"
        return FileChangedError(f"{self.paths[i]}: file changed since it was indexed ({what}): "
                                "re-open the JsonlIndex to re-index it")

    def _fd(self, i: int) -> int:
        fd = self._handles[i]
        if fd is None:
            fd = os.open(self.paths[i], os.O_RDONLY)  # not inherited by child processes (PEP 446)
            if (error := self._changed(i, fd)) is not None:
                os.close(fd)
                raise error
            self._handles[i] = fd
        return fd

    def _locate(self, k: int) -> tuple[int, int, int]:
        """(file number, start byte, end byte) of record k."""
        n = self._first[-1]
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"record {k} out of range for an index of {n} records")
        i = bisect.bisect_right(self._first, k) - 1
        start, end = self._offsets[i][k - self._first[i]].tolist()
        return i, start, end

    def raw(self, k: int) -> bytes:
        i, start, end = self._locate(k)
        fd = self._fd(i)
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise self._changed(i, fd) or FileChangedError(
                f"{self.paths[i]}: file changed since it was indexed (record {k} at byte {start:,} could not be "
                "read whole): re-open the JsonlIndex to re-index it")
        return data

    def __getitem__(self, k: int) -> dict:
        data = self.raw(k)
        try:
            return json_exact.loads(data)
        except orjson.JSONDecodeError as e:
            i, start, _ = self._locate(k)
            if (changed := self._changed(i, self._fd(i))) is not None:
                raise changed from None
            raise ValueError(f"{self.paths[i]}: record {k} at byte {start}: invalid JSON: {e}") from None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"] = [None] * len(self.paths)  # descriptors are reopened in each process
        return state

    def close(self) -> None:
        for fd in self._handles:
            if fd is not None:
                os.close(fd)
        self._handles = [None] * len(self.paths)

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, OSError):  # half-built by a failed __init__, or at interpreter exit: nothing to say
            pass
