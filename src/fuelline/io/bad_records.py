"""What a reader does with a record it cannot read: raise a `RecordError` naming the file and the
line, or skip it, counted under a reason and kept in the rejects file.

The limits below bound what one bad record can cost: a record nested deeper than
MAX_NESTING_DEPTH levels, or a line longer than `max_record_bytes`, is refused (or skipped)
without being built in memory, so a 40 KB file of brackets or a 100 MB line cannot take gigabytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

# Deeper records are refused when read: orjson writes at most 254 levels (fuelline's outputs and
# rejects are written with it), real records nest a few levels, and a JSON array's parser would
# otherwise hold a path per level (quadratic memory: 20,000 levels took 1 GB).
MAX_NESTING_DEPTH = 200
MAX_RECORD_BYTES = 64 << 20  # a longer line is refused without being read into memory whole

OnError = Literal["raise", "skip"]
ON_ERROR = get_args(OnError)  # the choices of every on_error option
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


class RejectSink(Protocol):
    """Where a skipped bad record goes: `fuelline.io.rejects.Rejects`, which writes with
    `fuelline.io.writers`. Named by its one method, so that reading depends on no writer."""

    def add(self, reason: str, record: Any, *, source: str | None = None, line: int | None = None,
            detail: str | None = None) -> None: ...


class BadRecords:
    """Raises or records a bad record, following `on_error`; `local` is the file read for `source`."""

    def __init__(self, source: Path | str, on_error: OnError, rejects: RejectSink | None, local: Path):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.source, self.on_error, self.rejects, self.local = source, on_error, rejects, local

    def bad(self, line: int, reason: str, what: str, raw: Any) -> None:
        if self.on_error == "raise":
            raise RecordError(self.source, line, what)
        if self.rejects is not None:
            self.rejects.add(reason, raw, source=os.fspath(self.source), line=line, detail=what)
