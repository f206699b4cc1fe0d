"""JSONL records from a byte stream, with their line numbers, and the count of a stream's lines.

The stream is read in blocks (`fuelline.io.streams.blocks`) split on b"\\n", and each line is
parsed with orjson straight from bytes; this avoids the per-line text decoding of a
TextIOWrapper and is where the reader's speed comes from (see benchmarks/bench_read.py).
Integers beyond 64 bits, which orjson rounds to floats, are kept exact (`fuelline.io.json_exact`).
"""

from __future__ import annotations

from typing import IO, Any, Iterator

import orjson

from fuelline.io import json_exact
from fuelline.io.bad_records import MAX_NESTING_DEPTH, MAX_RECORD_BYTES, BadRecords
from fuelline.io.streams import blocks

REJECT_HEAD_BYTES = 4 << 10  # what the rejects file keeps of a line over max_record_bytes
TOO_DEEP = f"nested deeper than {MAX_NESTING_DEPTH} levels (the limit for a record)"


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
    for chunk in blocks(stream, head):
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
        return "nesting_too_deep", TOO_DEEP
    return "malformed_json", f"invalid JSON: {message}"


def jsonl_records(stream: IO[bytes], head: bytes, start: int, stop: int | None, report: BadRecords,
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
                report.bad(lineno, "nesting_too_deep", TOO_DEEP, line)
                continue
            yield lineno, record


def count_lines(stream: IO[bytes], head: bytes) -> int:
    """Physical lines of a stream whose first block `head` was read already; a last line without
    a newline counts. Only newlines are counted (about 1 GB/s), nothing parsed."""
    lines, last = 0, b""
    for chunk in blocks(stream, head):
        lines += chunk.count(b"\n")
        last = chunk[-1:]
    return lines + (1 if last and last != b"\n" else 0)
