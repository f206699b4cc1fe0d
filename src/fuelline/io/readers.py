"""Streaming record readers for JSONL, JSON arrays and Parquet, plain or compressed.

Memory stays bounded by one read chunk (JSONL), one parser buffer (JSON arrays, parsed
incrementally by ijson's C backend) or one Parquet row group, whatever the file size.

JSONL is read in 256 KiB blocks split on b"\\n" and parsed with orjson straight from bytes; this
avoids the per-line text decoding of a TextIOWrapper and is where the reader's speed comes from
(see benchmarks/bench_read.py). Integers beyond 64 bits, which orjson rounds to floats, are kept
exact (`fuelline.io.json_exact`).

Bad corpora stay bounded too: a record nested deeper than MAX_NESTING_DEPTH levels, or a line
longer than `max_record_bytes`, is refused (or counted, with on_error="skip") without being built
in memory, so a 40 KB file of brackets or a 100 MB line cannot take gigabytes.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Literal, Protocol

import orjson
import zstandard

from fuelline.io import json_exact
from fuelline.io.json_escapes import SurrogateGuard
from fuelline.io.paths import LINE_FORMATS, expand_inputs, split_suffixes
from fuelline.io.remote import is_url, local_copy

CHUNK_BYTES = 256 << 10  # small blocks stay in cache while split and parsed: ~10% faster than 4 MiB
UTF8_BOM = b"\xef\xbb\xbf"
COMPRESSED_CHUNK_BYTES = 64 << 10  # ~256 KiB once decompressed (zstd on JSONL: ~3-4x)

# Deeper records are refused when read: orjson writes at most 254 levels (fuelline's outputs and
# rejects are written with it), real records nest a few levels, and a JSON array's parser would
# otherwise hold a path per level (quadratic memory: 20,000 levels took 1 GB).
MAX_NESTING_DEPTH = 200
MAX_RECORD_BYTES = 64 << 20  # a longer line is refused without being read into memory whole
REJECT_HEAD_BYTES = 4 << 10  # what the rejects file keeps of a line over max_record_bytes

OnError = Literal["raise", "skip"]
# Reasons of records the reader could not turn into a dict: counted as read (records_in) and dropped.
READ_ERROR_REASONS = ("malformed_json", "not_an_object", "invalid_utf8", "nesting_too_deep", "record_too_large",
                      "truncated_json_array")


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


def _located(path: str | os.PathLike) -> tuple[Path | str, Path]:
    """(what messages name, the local file to open): a URL's local copy is fetched through the cache."""
    if is_url(path):
        return path, local_copy(path)
    path = Path(path)
    return path, path


class RejectSink(Protocol):
    """Where a skipped bad record goes: `fuelline.io.rejects.Rejects`, which writes with
    `fuelline.io.writers`. Named by its one method, so that reading depends on no writer."""

    def add(self, reason: str, record: Any, *, source: str | None = None, line: int | None = None,
            detail: str | None = None) -> None: ...


class _Reporter:
    """Raises or records a bad record, following `on_error`; `local` is the file read for `source`."""

    def __init__(self, source: Path | str, on_error: OnError, rejects: RejectSink | None, local: Path | None = None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.source, self.on_error, self.rejects = source, on_error, rejects
        self.local = local if local is not None else Path(source)

    def bad(self, line: int, reason: str, what: str, raw: Any) -> None:
        if self.on_error == "raise":
            raise RecordError(self.source, line, what)
        if self.rejects is not None:
            self.rejects.add(reason, raw, source=os.fspath(self.source), line=line, detail=what)


class _LongLine:
    """A line over the size limit, read past rather than kept: its length and its first bytes."""

    __slots__ = ("head", "size")

    def __init__(self, head: bytes, size: int):
        self.head, self.size = head[:REJECT_HEAD_BYTES], size  # a slice of bytes is a copy: the line is let go

    def extend(self, data: bytes) -> None:
        """Count `data`, the next bytes of the line, keeping them while the head is short."""
        self.size += len(data)
        if len(self.head) < REJECT_HEAD_BYTES:
            self.head += data[:REJECT_HEAD_BYTES - len(self.head)]


def _chunks(stream: IO[bytes], head: bytes) -> Iterator[bytes]:
    if head:
        yield head
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


def _split_long_lines(first: int, lines: list[bytes], limit: int) -> Iterator[tuple[int, list[bytes] | _LongLine]]:
    """`lines` (the first numbered `first`) in runs, with each line over `limit` bytes on its own."""
    run: list[bytes] = []
    for lineno, line in enumerate(lines, first):
        if len(line) <= limit:
            run.append(line)
            continue
        if run:
            yield lineno - len(run), run
            run = []
        yield lineno, _LongLine(line, len(line))
    if run:
        yield first + len(lines) - len(run), run


def _first_bytes(pieces: list[bytes], n: int) -> bytes:
    out, total = [], 0
    for piece in pieces:
        if total >= n:
            break
        out.append(piece[:n - total])
        total += len(out[-1])
    return b"".join(out)


def _line_blocks(stream: IO[bytes], head: bytes, start: int, limit: int
                 ) -> Iterator[tuple[int, list[bytes] | _LongLine]]:
    """(number of the first line, lines) per block read, for the physical lines after `start`.

    A line longer than `limit` bytes comes alone as a `_LongLine`: its bytes past the limit are
    read and dropped, never joined, so memory stays within `limit` plus one block. A line split
    over many blocks is joined once (`+=` per block would copy it quadratically).
    """
    lineno = 0  # physical lines consumed so far
    pieces: list[bytes] = []  # the unfinished line, over one or more blocks
    size = 0
    long: _LongLine | None = None  # the line being read past
    for chunk in _chunks(stream, head):
        if long is not None:
            end = chunk.find(b"\n")
            if end < 0:
                long.extend(chunk)
                continue
            long.extend(chunk[:end])
            lineno += 1
            if lineno > start:
                yield lineno, long
            long, chunk = None, chunk[end + 1:]
        counted = False
        if lineno < start:  # skipping to `start` only counts newlines; nothing is split or parsed
            newlines = chunk.count(b"\n")
            if lineno + newlines <= start:
                counted = True
                if newlines:
                    lineno += newlines
                    pieces, size = [], 0
                    chunk = chunk[chunk.rfind(b"\n") + 1:]
        if counted or b"\n" not in chunk:
            if chunk:
                pieces.append(chunk)
                size += len(chunk)
        else:
            data = b"".join([*pieces, chunk]) if pieces else chunk
            lines = data.split(b"\n")
            tail = lines.pop()
            first = lineno + 1
            lineno += len(lines)
            if first <= start:
                del lines[:start - first + 1]
                first = start + 1
            if len(data) > limit:  # rare: look for long lines only where one may be
                yield from _split_long_lines(first, lines, limit)
            elif lines:
                yield first, lines
            pieces, size = ([tail], len(tail)) if tail else ([], 0)
        if size > limit:
            long, pieces, size = _LongLine(_first_bytes(pieces, REJECT_HEAD_BYTES), size), [], 0
    if long is not None or size:
        lineno += 1
        if lineno > start:
            yield lineno, long if long is not None else [b"".join(pieces)]


def _deeper_than(record: dict, limit: int) -> bool:
    """Whether `record` nests more than `limit` levels of objects and arrays (itself the first)."""
    stack: list[tuple[Any, int]] = [(record, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for child in value.values() if type(value) is dict else value:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def _invalid_line(line: bytes, error: orjson.JSONDecodeError) -> tuple[str, str]:
    """(reason, what is wrong) for a line orjson could not parse."""
    message = str(error)
    if "not valid UTF-8" in message:  # orjson says "surrogates not allowed … column 1" whatever the fault
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            return "invalid_utf8", (f"invalid UTF-8 at byte {e.start} of the line (0-based offset): "
                                    f"{line[e.start:e.end]!r} ({e.reason})")
    if "depth limit exceeded" in message:  # orjson's own limit, 1024 levels
        return "nesting_too_deep", f"nested deeper than {MAX_NESTING_DEPTH} levels (the limit for a record)"
    return "malformed_json", f"invalid JSON: {message}"


def _jsonl_records(stream: IO[bytes], head: bytes, start: int, stop: int | None, report: _Reporter,
                   max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict]]:
    """(1-based line number, record) for physical lines start..stop-1 (0-based) of a JSONL stream."""
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    # A record deeper than the limit has more opening brackets than that, and twice as many bytes.
    deep_line_bytes = 2 * MAX_NESTING_DEPTH
    for first, lines in _line_blocks(stream, head, start, max_record_bytes):
        if stop is not None and first > stop:
            return
        if type(lines) is _LongLine:
            report.bad(first, "record_too_large",  # the rejects keep the line's first REJECT_HEAD_BYTES
                       f"the line is {lines.size:,} bytes, over the limit of {max_record_bytes:,} (max_record_bytes)",
                       lines.head)
            continue
        lineno = first - 1
        exact = json_exact.may_round(b"\n".join(lines))  # integers beyond 64 bits are read exactly
        for line in lines:
            lineno += 1
            if stop is not None and lineno > stop:
                return
            try:
                record = json_exact.loads(line) if exact else loads(line)
            except JSONDecodeError as e:
                if line.strip():
                    report.bad(lineno, *_invalid_line(line, e), line)
                continue
            if type(record) is not dict:
                report.bad(lineno, "not_an_object", f"expected a JSON object, found {type(record).__name__}", line)
                continue
            if (len(line) > deep_line_bytes and line.count(b"{") + line.count(b"[") > MAX_NESTING_DEPTH
                    and _deeper_than(record, MAX_NESTING_DEPTH)):
                report.bad(lineno, "nesting_too_deep",
                           f"nested deeper than {MAX_NESTING_DEPTH} levels (the limit for a record)", line)
                continue
            yield lineno, record


def _first_invalid_utf8(path: Path) -> tuple[int, bytes, str] | None:
    """(byte offset, bad bytes, why) of the first invalid UTF-8 in a file's (decompressed) data."""
    offset, pending = 0, b""
    with open_binary(path) as stream:
        for chunk in _chunks(stream, b""):
            data = pending + chunk
            try:
                _, used = codecs.utf_8_decode(data, "strict", False)
            except UnicodeDecodeError as e:
                return offset + e.start, data[e.start:e.end], e.reason
            offset, pending = offset + used, data[used:]
    if pending:
        return offset, pending, "unexpected end of data"
    return None


def _array_error(path: Path, index: int, error: Exception) -> tuple[str, str]:
    """(reason, what is wrong) for a JSON array whose parser stopped inside element `index`."""
    message = str(error)
    if "premature EOF" in message:
        return "truncated_json_array", (f"the JSON array ends inside element {index}: truncated? "
                                        f"(the {index - 1:,} elements before it are read)")
    if "UTF8" in message or "UTF-8" in message:
        found = _first_invalid_utf8(path)
        if found is not None:
            offset, bad, why = found
            return "invalid_utf8", (f"invalid UTF-8 at byte {offset} of the file (0-based offset, after decompression): "
                                    f"{bad!r} ({why}); nothing after it can be read")
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return "malformed_json", f"invalid JSON array: {first_line}; nothing after it can be read"


_CLOSE = {"start_map": "end_map", "start_array": "end_array"}


def _json_array_records(stream: IO[bytes], head: bytes, start: int, stop: int | None, report: _Reporter,
                        max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict]]:
    """(1-based element number, record) for elements start..stop-1 of a top-level JSON array.

    ijson's C parser gives the events; elements are built by its C builder, fed here so the depth
    and size of each element are known before it is built. An element nested deeper than
    MAX_NESTING_DEPTH, or with more than `max_record_bytes` of strings, is cut short where that is
    seen (the builder's open containers are closed for it, and the rest of the element is read
    past), then reported instead of yielded. Memory stays that of one element within the limits.
    """
    import ijson

    backend = ijson.get_backend(ijson.backend_name)
    built = ijson.sendable_list()
    send = backend.parse_basecoro(backend.items_basecoro(built, "item")).send
    index = 0  # elements completed
    depth = 0  # containers open in the input, the top-level array included
    opened: list[str] = []  # containers open in what the builder was given
    skip_to = None  # depth at which the element being read past ends
    bad: tuple[str, str] | None = None  # why the element being read is refused
    size = 0  # bytes of strings and keys in the element being read
    last = ""  # the last event given to the builder
    lone_escapes: dict[int, str] = {}  # element number: its first lone surrogate escape

    def lone_escape(escape: str) -> None:
        lone_escapes.setdefault(index + 1, escape)

    guarded = SurrogateGuard(head, stream, lone_escape)
    try:
        for event, value in backend.basic_parse(guarded, use_float=True):
            if event == "map_key" or event == "string":  # the most frequent events first
                if skip_to is not None:
                    continue
                size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
                if size > max_record_bytes:
                    bad = ("record_too_large",
                           f"array element {index + 1} holds more than {max_record_bytes:,} bytes of text (max_record_bytes)")
            elif event == "start_map" or event == "start_array":
                depth += 1
                if skip_to is not None:
                    continue
                if depth - 1 > MAX_NESTING_DEPTH:
                    bad = ("nesting_too_deep",
                           f"array element {index + 1} is nested deeper than {MAX_NESTING_DEPTH} levels (the limit for a record)")
                else:
                    opened.append(event)
            elif event == "end_map" or event == "end_array":
                depth -= 1
                if skip_to is not None:
                    if depth == skip_to:
                        skip_to = None
                    continue
                opened.pop()
            elif skip_to is not None:
                continue
            if bad is not None and skip_to is None:
                # Close what the builder has open, so it ends the element; read past the rest of it.
                if last == "map_key" or len(opened) == 1:
                    send(("null", None))
                for kind in reversed(opened[1:]):
                    send((_CLOSE[kind], None))
                del opened[1:]
                if depth > 1:
                    skip_to = 1
            else:
                send((event, value))
                last = event
            if built:
                element = built.pop()
                index += 1
                size, last = 0, ""
                refused, bad = bad, None
                if index in lone_escapes:
                    refused = ("malformed_json", f"array element {index} holds the lone surrogate escape "
                               f"{lone_escapes.pop(index)} (half of a UTF-16 pair encodes no character)")
                if index <= start:
                    continue
                if stop is not None and index > stop:
                    return
                if refused is not None:
                    report.bad(index, *refused, None)
                elif type(element) is not dict:
                    report.bad(index, "not_an_object", f"array element {index} is {type(element).__name__}, not an object",
                               element)
                else:
                    yield index, element
    except ijson.JSONError as e:
        # The array's syntax is broken: nothing after this point can be located. With on_error="skip"
        # the elements before it stay read and the break counts as one unreadable record.
        reason, what = _array_error(report.local, index + 1, e)
        if report.on_error == "raise":
            raise RecordError(report.source, f"element {index + 1}", what) from None
        if index + 1 > start:
            report.bad(index + 1, reason, what, None)


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


def _head_without_bom(stream: IO[bytes]) -> bytes:
    """The first block of a file, without the UTF-8 byte order mark some editors write first."""
    head = stream.read(CHUNK_BYTES)
    while head and len(head) < len(UTF8_BOM) and UTF8_BOM.startswith(head) and (more := stream.read(CHUNK_BYTES)):
        head += more  # a first block shorter than a BOM (tiny blocks in tests)
    return head.removeprefix(UTF8_BOM)


def iter_file_records(path: str | os.PathLike, *, start: int = 0, stop: int | None = None,
                      on_error: OnError = "raise", rejects: RejectSink | None = None,
                      max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict]]:
    """(location, record) pairs of one file; location is the 1-based line, array element or row.

    `start`/`stop` select a 0-based, half-open range of lines (JSONL), elements (JSON array) or
    rows (Parquet); the stage runner uses them to split one big file into shards. A JSONL line
    longer than `max_record_bytes` (a JSON array element with more text than that) is refused as
    `record_too_large`, a record nested deeper than MAX_NESTING_DEPTH as `nesting_too_deep`.
    `path` may be a URL: its local copy (`fuelline.io.remote.local_copy`) is read, the URL named.
    """
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1, not {max_record_bytes}")
    path, local = _located(path)
    report = _Reporter(path, on_error, rejects, local)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        yield from _parquet_records(local, start, stop)
        return
    with decompression_errors(path), open_binary(local) as stream:
        head = _head_without_bom(stream)
        # A .json file holds either one array or, as often in the wild, one object per line.
        if fmt not in LINE_FORMATS and head.lstrip()[:1] == b"[":
            yield from _json_array_records(stream, head, start, stop, report, max_record_bytes)
        else:
            yield from _jsonl_records(stream, head, start, stop, report, max_record_bytes)


def read_records(sources: str | os.PathLike | Iterable[str | os.PathLike], *, on_error: OnError = "raise",
                 rejects: RejectSink | None = None, max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[dict]:
    """Stream the records (dicts) of files, directories or globs, in order.

    A malformed record raises `RecordError` ("FILE:LINE: what is wrong"); with
    `on_error="skip"` it is counted in `rejects.counts` under a reason (one of
    READ_ERROR_REASONS: `malformed_json`, `not_an_object`, `invalid_utf8`, `nesting_too_deep`,
    `record_too_large`, `truncated_json_array`) and written to the rejects file, if `rejects`
    has a path.
    """
    for path in expand_inputs(sources):
        for _, record in iter_file_records(path, on_error=on_error, rejects=rejects,
                                           max_record_bytes=max_record_bytes):
            yield record


def count_units(path: str | os.PathLike) -> int | None:
    """Physical lines (JSONL) or rows (Parquet) of a file, or None for a JSON array.

    Counting lines decompresses the file once but parses nothing (about 1 GB/s); the stage
    runner uses it to cut big files into shards of a fixed number of lines. A URL is counted in its local copy.
    """
    path, local = _located(path)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(local).metadata.num_rows
    with decompression_errors(path), open_binary(local) as stream:
        head = _head_without_bom(stream)
        if fmt not in LINE_FORMATS and head.lstrip()[:1] == b"[":
            return None
        lines, last = head.count(b"\n"), head[-1:]
        while chunk := stream.read(CHUNK_BYTES):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
        return lines + (1 if last and last != b"\n" else 0)
