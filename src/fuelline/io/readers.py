"""Streaming record readers for JSONL, JSON arrays and Parquet, plain or compressed: the entry
points every stage reads through.

`iter_file_records` picks the reader by the file's suffix and first byte: Parquet by row group,
a `.json` file that starts with `[` as one JSON array (`fuelline.io.json_array`), anything else
as JSONL (`fuelline.io.jsonl_reader`); the bytes come decompressed from `fuelline.io.streams`,
and bad records follow `fuelline.io.bad_records`. Memory stays bounded whatever the file size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

from fuelline.io.bad_records import MAX_RECORD_BYTES, READ_ERROR_REASONS, BadRecords, OnError, RecordError, RejectSink
from fuelline.io.json_array import json_array_records
from fuelline.io.jsonl_reader import count_lines, jsonl_records
from fuelline.io.paths import expand_inputs
from fuelline.io.suffixes import LINE_FORMATS, split_suffixes
from fuelline.io.remote import is_url, local_copy
from fuelline.io.streams import decompression_errors, head_without_bom, open_binary

# The reader's public names, those defined in fuelline.io.bad_records included: stages import them from here.
__all__ = ["MAX_RECORD_BYTES", "READ_ERROR_REASONS", "RecordError", "count_units", "iter_file_records", "read_records"]


def _located(path: str | os.PathLike) -> tuple[Path | str, Path]:
    """(what messages name, the local file to open): a URL's local copy is fetched through the cache."""
    if is_url(path):
        return path, local_copy(path)
    path = Path(path)
    return path, path


def _parquet_records(path: Path, start: int, stop: int | None) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    group_end = 0
    for group in range(pf.metadata.num_row_groups):
        row, group_end = group_end, group_end + pf.metadata.row_group(group).num_rows
        if group_end <= start or (stop is not None and row >= stop):
            continue  # a row group outside the range is never decoded
        for batch in pf.iter_batches(batch_size=8192, row_groups=[group]):
            for record in batch.to_pylist():
                row += 1
                if row > start and (stop is None or row <= stop):
                    yield row, record


def iter_file_records(path: str | os.PathLike, *, start: int = 0, stop: int | None = None,
                      on_error: OnError = "raise", rejects: RejectSink | None = None,
                      max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict]]:
    """(location, record) pairs of one file; location is the 1-based line, array element or row.

    `start`/`stop` select a 0-based, half-open range of lines (JSONL), elements (JSON array) or
    rows (Parquet); the stage runner uses them to split one big file into shards. `path` may be a
    URL: its local copy (`fuelline.io.remote.local_copy`) is read, the URL named.
    """
    if max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be at least 1, not {max_record_bytes}")
    path, local = _located(path)
    report = BadRecords(path, on_error, rejects, local)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        yield from _parquet_records(local, start, stop)
        return
    with decompression_errors(path), open_binary(local) as stream:
        head = head_without_bom(stream)
        # A .json file holds either one array or, as often in the wild, one object per line.
        if fmt not in LINE_FORMATS and head.lstrip()[:1] == b"[":
            yield from json_array_records(stream, head, start, stop, report, max_record_bytes)
        else:
            yield from jsonl_records(stream, head, start, stop, report, max_record_bytes)


def read_records(sources: str | os.PathLike | Iterable[str | os.PathLike], *, on_error: OnError = "raise",
                 rejects: RejectSink | None = None, max_record_bytes: int = MAX_RECORD_BYTES,
                 empty_ok: bool = False) -> Iterator[dict]:
    """Stream the records (dicts) of files, directories or globs, in order.

    A malformed record raises `RecordError` ("FILE:LINE: what is wrong"); with `on_error="skip"`
    it is counted in `rejects.counts` under one of READ_ERROR_REASONS and written to the rejects
    file, if `rejects` has a path. `empty_ok`: as `expand_inputs`'.
    """
    for path in expand_inputs(sources, empty_ok=empty_ok):
        for _, record in iter_file_records(path, on_error=on_error, rejects=rejects,
                                           max_record_bytes=max_record_bytes):
            yield record


def count_units(path: str | os.PathLike) -> int | None:
    """Physical lines (JSONL) or rows (Parquet) of a file (a URL: of its local copy), or None for a
    JSON array; the stage runner cuts big files into shards of a fixed number of lines by it."""
    path, local = _located(path)
    fmt, _ = split_suffixes(path)
    if fmt == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(local).metadata.num_rows
    with decompression_errors(path), open_binary(local) as stream:
        head = head_without_bom(stream)
        if fmt not in LINE_FORMATS and head.lstrip()[:1] == b"[":
            return None
        return count_lines(stream, head)
