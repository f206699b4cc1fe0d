"""Where dropped and unreadable records go: counted per reason, optionally kept in a file."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from fuelline.io.writers import JsonlZstWriter


class Rejects:
    """Counts rejected records by reason and, given a path, writes each one to a JSONL.zst file.

    Each line is `{"reason", "source", "line", "detail", "record"}`; `record` holds the parsed
    record, or the raw text when it could not be parsed. The file is created only when the
    first record is rejected, and committed atomically by `close()`.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = path
        self.counts: Counter[str] = Counter()
        self._writer: JsonlZstWriter | None = None

    def add(self, reason: str, record: Any, *, source: str | None = None, line: int | None = None,
            detail: str | None = None) -> None:
        self.counts[reason] += 1
        if self.path is None:
            return
        if self._writer is None:
            self._writer = JsonlZstWriter(self.path)
        if isinstance(record, (bytes, bytearray)):
            record = bytes(record).decode("utf-8", errors="replace")
        self._writer.write({"reason": reason, "source": source, "line": line, "detail": detail, "record": record})

    @property
    def written(self) -> bool:
        return self._writer is not None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
