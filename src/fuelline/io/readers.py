"""Streaming record readers for JSONL, JSON arrays and Parquet, plain or compressed.

Memory stays bounded by one read chunk (JSONL), one parser buffer (JSON arrays, parsed
incrementally by ijson's C backend) or one Parquet row group, whatever the file size.

JSONL is read in 256 KiB blocks split on b"\\n" and parsed with orjson straight from bytes; this
avoids the per-line text decoding of a TextIOWrapper and is where the reader's speed comes from
(see benchmarks/bench_read.py).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Literal

import orjson
import zstandard

from fuelline.io.paths import LINE_FORMATS, expand_inputs, split_suffixes
from fuelline.io.rejects import Rejects

CHUNK_BYTES = 256 << 10  # small blocks stay in cache while split and parsed: ~10% faster than 4 MiB
UTF8_BOM = b"\xef\xbb\xbf"
COMPRESSED_CHUNK_BYTES = 64 << 10  # ~256 KiB once decompressed (zstd on JSONL: ~3-4x)

OnError = Literal["raise", "skip"]
READ_ERROR_REASONS = ("malformed_json", "not_an_object")


class RecordError(ValueError):
    """A record that cannot be read; the message is `FILE:LINE: what is wrong`."""

    def __init__(self, source: str | os.PathLike, line: int | str, what: str):
        self.source, self.line, self.what = os.fspath(source), line, what
        super().__init__(f"{self.source}:{line}: {what}")

    def __reduce__(self):  # travels intact from a worker process to the parent
        return type(self), (self.source, self.line, self.what)


class DamagedInput(ValueError):
    """A compressed file that is not what its suffix says, or that ends early."""


class ZstdFrames:
    """Every zstd frame of a file, decompressed; a file that ends inside a frame is an error.

    zstandard's `stream_reader` returns what it has when the input ends in the middle of a frame,
    so a truncated file would read as a shorter complete one; here the last frame must be whole.
    `read` returns whatever the next compressed block gives (any size, b"" at the end).
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


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open `path` for reading, decompressing by suffix (.gz, .zst, .bz2, .xz)."""
    _, compression = split_suffixes(path)
    if compression == ".gz":
        return gzip.open(path, "rb")
    if compression in (".zst", ".zstd"):
        return ZstdFrames(path)
    if compression == ".bz2":
        return bz2.open(path, "rb")
    if compression == ".xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


class _Reporter:
    """Raises or records a bad record, following `on_error`."""

    def __init__(self, source: Path, on_error: OnError, rejects: Rejects | None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.source, self.on_error, self.rejects = source, on_error, rejects

    def bad(self, line: int, reason: str, what: str, raw: Any) -> None:
        if self.on_error == "raise":
            raise RecordError(self.source, line, what)
        if self.rejects is not None:
            self.rejects.add(reason, raw, source=os.fspath(self.source), line=line, detail=what)


def _jsonl_records(stream: IO[bytes], head: bytes, start: int, stop: int | None,
                   report: _Reporter) -> Iterator[tuple[int, dict]]:
    """(1-based line number, record) for physical lines start..stop-1 (0-based) of a JSONL stream."""
    lineno = 0  # physical lines consumed so far
    pending = head
    if pending.startswith(UTF8_BOM):
        pending = pending[len(UTF8_BOM):]
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if chunk:
            pending += chunk
            # Skipping to `start` only counts newlines; nothing is split or parsed.
            if lineno < start:
                newlines = pending.count(b"\n")
                if lineno + newlines <= start:
                    lineno += newlines
                    pending = pending[pending.rfind(b"\n") + 1:] if newlines else pending
                    continue
        lines = pending.split(b"\n")
        pending = lines.pop() if chunk else b""
        for line in lines:
            lineno += 1
            if lineno <= start:
                continue
            if stop is not None and lineno > stop:
                return
            try:
                record = loads(line)
            except JSONDecodeError as e:
                if line.strip():
                    report.bad(lineno, "malformed_json", f"invalid JSON: {e}", line)
                continue
            if type(record) is not dict:
                report.bad(lineno, "not_an_object", f"expected a JSON object, found {type(record).__name__}", line)
                continue
            yield lineno, record
        if not chunk:
            return


class _Prepended:
    """A stream that first returns `head`, then the rest of `stream` (to peek at a file's start)."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head and n != 0:  # ijson probes with read(0) to learn bytes vs str
            out, self.head = self.head, b""
            return out
        return self.stream.read(n)


def _json_array_records(stream: IO[bytes], head: bytes, start: int, stop: int | None,
                        report: _Reporter) -> Iterator[tuple[int, dict]]:
    """(1-based element number, record) for elements start..stop-1 of a top-level JSON array."""
    import ijson

    index = 0
    try:
        for element in ijson.items(_Prepended(head, stream), "item", use_float=True):
            index += 1
            if index <= start:
                continue
            if stop is not None and index > stop:
                return
            if type(element) is not dict:
                report.bad(index, "not_an_object", f"array element {index} is {type(element).__name__}, not an object", element)
                continue
            yield index, element
    except ijson.JSONError as e:
        # The array's syntax is broken: nothing after this point can be located, so never skip.
        raise RecordError(report.source, f"element {index + 1}", f"invalid JSON array: {e}") from None


def _parquet_records(path: Path, start: int, stop: int | None) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    first_row = 0
    for group in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        group_end = first_row + rows
        if group_end > start and (stop is None or first_row < stop):
            row = first_row
            for batch in pf.iter_batches(batch_size=8192, row_groups=[group]):
                for record in batch.to_pylist():
                    row += 1
                    if row > start and (stop is None or row <= stop):
                        yield row, record
        first_row = group_end


def _first_significant_byte(data: bytes) -> bytes:
    stripped = data.lstrip(UTF8_BOM).lstrip()
    return stripped[:1]


def iter_file_records(path: str | os.PathLike, *, start: int = 0, stop: int | None = None,
                      on_error: OnError = "raise", rejects: Rejects | None = None) -> Iterator[tuple[int, dict]]:
    """(location, record) pairs of one file; location is the 1-based line, array element or row.

    `start`/`stop` select a 0-based, half-open range of lines (JSONL), elements (JSON array) or
    rows (Parquet); the stage runner uses them to split one big file into shards.
    """
    path = Path(path)
    report = _Reporter(path, on_error, rejects)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        yield from _parquet_records(path, start, stop)
        return
    with decompression_errors(path), open_binary(path) as stream:
        head = stream.read(CHUNK_BYTES)
        # A .json file holds either one array or, as often in the wild, one object per line.
        if fmt not in LINE_FORMATS and _first_significant_byte(head) == b"[":
            yield from _json_array_records(stream, head, start, stop, report)
        else:
            yield from _jsonl_records(stream, head, start, stop, report)


def read_records(sources: str | os.PathLike | Iterable[str | os.PathLike], *, on_error: OnError = "raise",
                 rejects: Rejects | None = None) -> Iterator[dict]:
    """Stream the records (dicts) of files, directories or globs, in order.

    A malformed record raises `RecordError` ("FILE:LINE: what is wrong"); with
    `on_error="skip"` it is counted in `rejects.counts` under a reason (`malformed_json`,
    `not_an_object`) and written to the rejects file, if `rejects` has a path.
    """
    for path in expand_inputs(sources):
        for _, record in iter_file_records(path, on_error=on_error, rejects=rejects):
            yield record


def count_units(path: str | os.PathLike) -> int | None:
    """Physical lines (JSONL) or rows (Parquet) of a file, or None for a JSON array.

    Counting lines decompresses the file once but parses nothing (about 1 GB/s); the stage
    runner uses it to cut big files into shards of a fixed number of lines.
    """
    path = Path(path)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with decompression_errors(path), open_binary(path) as stream:
        head = stream.read(CHUNK_BYTES)
        if fmt not in LINE_FORMATS and _first_significant_byte(head) == b"[":
            return None
        lines, last = head.count(b"\n"), head[-1:]
        while chunk := stream.read(CHUNK_BYTES):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
        return lines + (1 if last and last != b"\n" else 0)
