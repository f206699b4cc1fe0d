"""Record writers: JSONL compressed with zstd (the default) and Parquet, both atomic.

A writer is used as a context manager: leaving the block normally commits the file under its
final name, an exception deletes the temp file, and a full disk is a `DiskFull` naming the file
(`fuelline.io.atomic`). Output bytes depend only on the records written (zstd level and Parquet
options are fixed), which makes stage output reproducible.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zstandard

from fuelline.io import json_exact
from fuelline.io.atomic import AtomicFile, CommitOnExit, atomic_write, reraise_naming

ZSTD_LEVEL = 3


class RecordWriter(CommitOnExit):
    """Base: counts records, commits on `close()`, removes the temp file on `abort()`."""

    suffix = ""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.count = 0
        self._target = AtomicFile(self.path)

    def write(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        """Flush whatever the format buffers into the temp file."""

    def close(self) -> None:
        """Commit the file; if that fails (a full disk), the temp file is removed and the error raised."""
        self._target.commit(self._finish)

    def abort(self) -> None:
        self._target.abort()


class JsonlZstWriter(RecordWriter):
    suffix = ".jsonl.zst"

    def __init__(self, path: str | os.PathLike, level: int = ZSTD_LEVEL):
        super().__init__(path)
        self._stream = zstandard.ZstdCompressor(level=level).stream_writer(self._target.file, closefd=False)

    def write(self, record: dict[str, Any]) -> None:
        line = json_exact.dumps(record) + b"\n"  # a record orjson cannot write raises here, before any byte is written
        try:
            self._stream.write(line)
        except OSError as e:
            reraise_naming(e, self.path)
        self.count += 1

    def _finish(self) -> None:
        self._stream.flush(zstandard.FLUSH_FRAME)


class ParquetWriter(RecordWriter):
    """Buffers one shard and writes it as one table, so the schema covers every record's keys."""

    suffix = ".parquet"

    def __init__(self, path: str | os.PathLike, row_group_size: int = 65536):
        super().__init__(path)
        self._records: list[dict[str, Any]] = []
        self._row_group_size = row_group_size

    def write(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        self.count += 1

    def _finish(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(self._records)
        except OverflowError:  # Parquet's integers are 64 bits; JSONL keeps any (fuelline.io.json_exact)
            raise ValueError(f"{self.path}: a record holds an integer beyond 64 bits, which Parquet cannot store; "
                             "write --format jsonl.zst, which keeps it exactly") from None
        pq.write_table(table, self._target.file, row_group_size=self._row_group_size, compression="zstd")
        self._records = []


OUTPUT_FORMATS: dict[str, type[RecordWriter]] = {"jsonl.zst": JsonlZstWriter, "parquet": ParquetWriter}


def open_writer(path_without_suffix: str | os.PathLike, output_format: str = "jsonl.zst") -> RecordWriter:
    """A writer for `output_format`; the format's suffix is appended to the given path."""
    try:
        cls = OUTPUT_FORMATS[output_format]
    except KeyError:
        raise ValueError(f"unknown output format {output_format!r}; choose one of {sorted(OUTPUT_FORMATS)}") from None
    return cls(f"{os.fspath(path_without_suffix)}{cls.suffix}")


def write_jsonl_file(sources, path: str | os.PathLike) -> int:
    """Concatenate the records of `sources` (files, directories) into one plain JSONL file, atomically.

    For tools that expect a single `.jsonl`; returns the number of records written. A step's
    output of no records (an eval split of `--test-size 0`) is copied as an empty file.
    """
    from fuelline.io.readers import read_records

    count = 0
    with atomic_write(path) as f:
        for record in read_records(sources, empty_ok=True):
            f.write(json_exact.dumps(record) + b"\n")
            count += 1
    return count
