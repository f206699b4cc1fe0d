"""A file's bytes, decompressed by its suffix (.gz, .zst, .bz2, .xz) and read in blocks.

Every reader of records starts here. A compressed file that is not what its suffix says, or
that ends early, is a `DamagedInput` naming the file.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from contextlib import contextmanager
from typing import IO, Iterator

import zstandard

from fuelline.io.suffixes import split_suffixes

CHUNK_BYTES = 256 << 10  # small blocks stay in cache while split and parsed: ~10% faster than 4 MiB
UTF8_BOM = b"\xef\xbb\xbf"
COMPRESSED_CHUNK_BYTES = 64 << 10  # ~256 KiB once decompressed (zstd on JSONL: ~3-4x)


class DamagedInput(ValueError):
    """A compressed file that is not what its suffix says, or that ends early."""


class ZstdFrames:
    """Every zstd frame of a file, decompressed; a file that ends inside a frame is an error.

    zstandard's `stream_reader` returns what it has when the input ends in the middle of a frame,
    so a truncated file would read as a shorter complete one. `read` returns whatever the next
    compressed block gives (any size, b"" at the end).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self._raw = open(path, "rb")
        self._context = zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._in_frame = False

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        while chunk := self._raw.read(COMPRESSED_CHUNK_BYTES):
            out = []
            while chunk:
                self._in_frame = True
                out.append(self._frame.decompress(chunk))
                chunk = b""
                if self._frame.eof:  # a frame ended: whatever follows starts the next one
                    chunk, self._in_frame = self._frame.unused_data, False
                    self._frame = self._context.decompressobj()
            if data := b"".join(out):
                return data
        if self._in_frame:
            raise EOFError("the last zstd frame is incomplete")
        return b""

    def close(self) -> None:
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_damage(error: BaseException) -> bool:
    """Whether a decompressor raised `error` because of its data (bz2 says so only in its message)."""
    if isinstance(error, (zstandard.ZstdError, gzip.BadGzipFile, lzma.LZMAError, EOFError)):
        return True
    return type(error) is OSError and "Invalid data stream" in str(error)


@contextmanager
def decompression_errors(path: str | os.PathLike):
    """Turn what a decompressor raises into a `DamagedInput` naming the file and what to check."""
    _, compression = split_suffixes(path)
    try:
        yield
    except (zstandard.ZstdError, lzma.LZMAError, EOFError, OSError) as e:
        if compression is None or not _is_damage(e):
            raise  # not a decompression problem (a plain file, a missing file, a disk error)
        if isinstance(e, EOFError):
            raise DamagedInput(f"{path}: ends early: truncated? ({e})") from None
        raise DamagedInput(f"{path}: cannot be read as {compression} ({e}); is the file name's suffix right, "
                           "or is the file damaged?") from None


OPENERS = {".gz": gzip.open, ".zst": ZstdFrames, ".zstd": ZstdFrames, ".bz2": bz2.open, ".xz": lzma.open}


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open `path` for reading, decompressing by suffix (`OPENERS`; each reads bytes by default)."""
    _, compression = split_suffixes(path)
    return OPENERS[compression](path) if compression in OPENERS else open(path, "rb")


def blocks(stream: IO[bytes], head: bytes = b"") -> Iterator[bytes]:
    """`head` (what was read already), then the rest of `stream` in blocks of CHUNK_BYTES."""
    if head:
        yield head
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


def head_without_bom(stream: IO[bytes]) -> bytes:
    """The first block of a file, without the UTF-8 byte order mark some editors write first."""
    head = stream.read(CHUNK_BYTES)
    while head and len(head) < len(UTF8_BOM) and UTF8_BOM.startswith(head) and (more := stream.read(CHUNK_BYTES)):
        head += more  # a first block shorter than a BOM (tiny blocks in tests)
    return head.removeprefix(UTF8_BOM)
