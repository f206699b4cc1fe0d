"""Where dropped and unreadable records go: counted per reason, optionally kept in a file."""

from __future__ import annotations

import os
import reprlib
from collections import Counter
from typing import Any

import orjson

from fuelline.io.atomic import CommitOnExit
from fuelline.io.writers import JsonlZstWriter

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 12, 4096, 4096, 100, 100


class Rejects(CommitOnExit):
    """Counts rejected records by reason and, given a path, writes each one to a JSONL.zst file.

    Each line is `{"reason", "source", "line", "detail", "record"}`; `record` holds the parsed
    record, or the raw text when it could not be parsed. A record that cannot be written as JSON
    (nested deeper than orjson writes, a non-string key) is kept as its raw line, if given, else as
    a shortened repr, and `detail` says so: a reject never stops a run. The file is created only
    when the first record is rejected, and committed atomically by `close()`; as a context manager,
    committed when the block ends normally, removed when it raises.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = path
        self.counts: Counter[str] = Counter()
        # The first rejection of each reason, as "SOURCE:LINE: detail": what a terminal shows
        # when a reason dominates, without opening the rejects file.
        self.examples: dict[str, str] = {}
        self._writer: JsonlZstWriter | None = None

    def add(self, reason: str, record: Any, *, source: str | None = None, line: int | None = None,
            detail: str | None = None, raw: bytes | None = None) -> None:
        """Count `record` under `reason` and keep it; `raw` (its line as read) is kept if it cannot be written."""
        self.counts[reason] += 1
        if reason not in self.examples:
            where = f"{source}:{line}: " if source is not None and line is not None else f"{source}: " if source else ""
            self.examples[reason] = f"{where}{detail or reason}"
        if self.path is None:
            return
        if self._writer is None:
            self._writer = JsonlZstWriter(self.path)
        if isinstance(record, (bytes, bytearray)):
            record = bytes(record).decode("utf-8", errors="replace")
        entry = {"reason": reason, "source": source, "line": line, "detail": detail, "record": record}
        try:
            self._writer.write(entry)
        except orjson.JSONEncodeError as e:
            if raw is not None:
                entry["record"], kept = bytes(raw).decode("utf-8", errors="replace"), "its raw line"
            else:
                entry["record"], kept = _SHORT.repr(record), "a shortened repr"
            entry["detail"] = f"{detail + '; ' if detail else ''}record kept as {kept}: it cannot be written as JSON ({e})"
            self._writer.write(entry)

    @property
    def written(self) -> bool:
        return self._writer is not None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
