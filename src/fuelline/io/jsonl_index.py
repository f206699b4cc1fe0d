"""Random access to the records of plain JSONL files: `JsonlIndex(paths)[k]`.

One pass over each file's bytes (numpy, in 8 MiB blocks) finds every line; blank lines are not
records. The result is an int64 array of (start, end) byte offsets, 16 bytes per record, cached
on disk so the next open costs one small read. The cache key is the file's absolute path; the
cache stores the file's size and mtime_ns and is rebuilt when either changes. Records are read
through an mmap that is opened lazily, so the index pickles cheaply into DataLoader workers.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path
from typing import Iterable

import numpy as np
import orjson

from fuelline.io.atomic import atomic_write
from fuelline.io.paths import split_suffixes

SCAN_BLOCK = 8 << 20
CACHE_MAGIC = b"FLJSIDX1"
CACHE_HEADER = struct.Struct("<8sQqQ")  # magic, file size, file mtime_ns, number of records
DECOMPRESS_COMMANDS = {".zst": "zstd -d", ".zstd": "zstd -d", ".gz": "gunzip -k", ".bz2": "bunzip2 -k", ".xz": "unxz -k"}
WHITESPACE = np.zeros(256, dtype=bool)
WHITESPACE[[9, 10, 13, 32]] = True


def default_cache_dir() -> Path:
    env = os.environ.get("FUELLINE_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fuelline"
    return base / "jsonl-index"


def scan_line_offsets(path: str | os.PathLike) -> np.ndarray:
    """(start, end) byte offsets of the non-blank lines of a file, as an int64 array [n, 2].

    Per block: newline positions by `flatnonzero`, and a running count of non-whitespace bytes
    sampled at each newline; a line is blank when that count did not move across it.
    """
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    ends_parts, counts_parts = [], []
    carried = 0  # non-whitespace bytes before the current block
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        data = np.frombuffer(mm, dtype=np.uint8)
        for begin in range(0, size, SCAN_BLOCK):
            block = data[begin:begin + SCAN_BLOCK]
            newlines = np.flatnonzero(block == 10)
            nonblank = np.cumsum(~WHITESPACE[block], dtype=np.int64)
            ends_parts.append(newlines + begin)
            counts_parts.append(nonblank[newlines] + carried)
            carried += int(nonblank[-1])
        del data, block, nonblank
    ends = np.concatenate(ends_parts)
    counts = np.concatenate(counts_parts)
    if ends.size == 0 or ends[-1] != size - 1:  # a last line without a trailing newline
        ends = np.append(ends, size)
        counts = np.append(counts, carried)
    starts = np.concatenate(([0], ends[:-1] + 1))
    content = np.diff(counts, prepend=0) > 0
    return np.stack([starts[content], ends[content]], axis=1).astype(np.int64)


def _cache_path(path: Path, cache_dir: Path) -> Path:
    key = hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:32]
    return cache_dir / f"{key}.idx"


def load_or_build_offsets(path: Path, cache_dir: Path) -> np.ndarray:
    stat = path.stat()
    cache = _cache_path(path, cache_dir)
    try:
        with open(cache, "rb") as f:
            magic, size, mtime_ns, n = CACHE_HEADER.unpack(f.read(CACHE_HEADER.size))
            if (magic, size, mtime_ns) == (CACHE_MAGIC, stat.st_size, stat.st_mtime_ns):
                offsets = np.fromfile(f, dtype="<i8", count=2 * n)
                if offsets.size == 2 * n:
                    return offsets.reshape(n, 2)
    except (FileNotFoundError, struct.error):
        pass
    offsets = scan_line_offsets(path)
    try:
        with atomic_write(cache) as f:
            f.write(CACHE_HEADER.pack(CACHE_MAGIC, stat.st_size, stat.st_mtime_ns, len(offsets)))
            f.write(offsets.astype("<i8").tobytes())
    except OSError:
        pass  # a read-only cache directory only costs a rescan next time
    return offsets


class JsonlIndex:
    """Records of one or more plain .jsonl files, addressable by global position.

    `len(index)` counts records over all files; `index[k]` parses the k-th (negative k counts
    from the end). Compressed files are refused: random access needs the plain bytes.
    """

    def __init__(self, paths: str | os.PathLike | Iterable[str | os.PathLike], *,
                 cache_dir: str | os.PathLike | None = None):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        for p in self.paths:
            _, compression = split_suffixes(p)
            if compression:
                raise ValueError(
                    f"{p}: JsonlIndex needs a plain .jsonl file for random access; decompress it "
                    f"first, for example: {DECOMPRESS_COMMANDS[compression]} {p}"
                )
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        self._sizes = [p.stat().st_size for p in self.paths]
        self._offsets = [load_or_build_offsets(p, self.cache_dir) for p in self.paths]
        self._first = np.cumsum([0] + [len(o) for o in self._offsets], dtype=np.int64)
        self._maps: list[mmap.mmap | None] = [None] * len(self.paths)

    def __len__(self) -> int:
        return int(self._first[-1])

    def _map(self, i: int) -> mmap.mmap:
        mm = self._maps[i]
        if mm is None:
            with open(self.paths[i], "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != self._sizes[i]:
                    raise RuntimeError(
                        f"{self.paths[i]}: file changed since it was indexed ({self._sizes[i]} -> {size} bytes); "
                        "create a new JsonlIndex"
                    )
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[i] = mm
        return mm

    def _locate(self, k: int) -> tuple[int, int, int]:
        """(file number, start byte, end byte) of record k."""
        n = len(self)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"record {k} out of range for an index of {n} records")
        i = int(np.searchsorted(self._first, k, side="right")) - 1
        start, end = self._offsets[i][k - self._first[i]]
        return i, int(start), int(end)

    def raw(self, k: int) -> bytes:
        i, start, end = self._locate(k)
        return self._map(i)[start:end]

    def __getitem__(self, k: int) -> dict:
        try:
            return orjson.loads(self.raw(k))
        except orjson.JSONDecodeError as e:
            i, start, _ = self._locate(k)
            raise ValueError(f"{self.paths[i]}: record {k} at byte {start}: invalid JSON: {e}") from None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self.paths)
        return state

    def close(self) -> None:
        for mm in self._maps:
            if isinstance(mm, mmap.mmap):
                mm.close()
        self._maps = [None] * len(self.paths)
