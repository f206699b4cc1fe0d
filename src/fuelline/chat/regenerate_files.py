"""The files of a regeneration, and what a resumed run reads back from them.

A run may be killed at any moment and resumed many times, so what it has done is read from its
output alone, by id (the step's own rules, beside the resume contract of `fuelline.pipeline.workdir`).

Output, one line per input id, ever: the input record with its assistant turns replaced and
`meta.regenerated` (the answers' model, options and finish reasons: docs/chat.md lists its
fields). Lines are appended whole, in the order answers arrive, and flushed; the file is fsynced
every second and at the end. A resumed run reads the ids already written (a torn last line, from
a kill mid-write, is cut off first) and skips exactly those, so nothing is done twice or missed
whatever order results came in. A conversation whose request failed for good goes to the errors
file (`OUT.errors`, never a data suffix, so it is not read as records) with the reason; the
decisions made without a request and `drop_truncated`'s are final (`FINAL_REASONS`), failures are
retried by a resumed run, which first removes them from the errors file.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import orjson

from fuelline.chat.regenerate_config import NOTHING, STALE_TOOL_RESULTS
from fuelline.io import json_exact
from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.stage_layout import STATS_FILE

RECORDS_FILE = "regenerated.jsonl"
ERRORS_SUFFIX = ".errors"  # the errors file beside the records: never a data suffix
FINAL_REASONS = {"truncated", NOTHING, STALE_TOOL_RESULTS}  # decisions a resumed run keeps; others are retried
FSYNC_EVERY_S = 1.0


@dataclass(frozen=True)
class OutputPaths:
    records: Path
    errors: Path
    stats: Path

    @classmethod
    def of(cls, output: str | os.PathLike) -> OutputPaths:
        """`OUT.jsonl` (with OUT.jsonl.errors and OUT.stats.json), or a directory holding all three."""
        output = Path(output)
        if output.suffix == ".jsonl":
            return cls(output, output.with_name(output.name + ERRORS_SUFFIX), output.with_suffix(".stats.json"))
        return cls(output / RECORDS_FILE, output / f"{RECORDS_FILE}{ERRORS_SUFFIX}", output / STATS_FILE)


def _records(path: Path) -> Iterator[dict]:
    """The records of a file this step appends to; a torn last line is cut off first."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(data))
            os.fsync(f.fileno())
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ValueError(f"{path}:{number}: not a JSON line in the middle of the file: it was changed by "
                             "something else than fuelline; repair or remove it") from None


@dataclass
class Earlier:
    """What earlier runs left: ids written and dropped for good, and the counts of what was written."""

    written: set[str] = field(default_factory=set)
    dropped: dict[str, str] = field(default_factory=dict)  # id → reason, of the decisions a resume keeps
    finish_reasons: Counter = field(default_factory=Counter)
    truncated_kept: int = 0


def earlier_runs(paths: OutputPaths) -> Earlier:
    """What earlier runs left. Errors that are not final are removed from the errors file (atomically):
    this run retries them, and lists them again if they fail again."""
    earlier = Earlier()
    for record in _records(paths.records):
        earlier.written.add(record["id"])
        regenerated = record.get("meta", {}).get("regenerated", {})
        reasons = regenerated.get("finish_reasons", [])
        earlier.finish_reasons.update(reasons)
        earlier.truncated_kept += "length" in reasons
    final = [r for r in _records(paths.errors) if r.get("reason") in FINAL_REASONS]
    earlier.dropped = {r["id"]: r["reason"] for r in final}
    if paths.errors.exists():
        write_bytes_atomic(paths.errors, b"".join(orjson.dumps(r) + b"\n" for r in final))
    return earlier


class Appender:
    """Whole lines appended and flushed; fsynced at most every second, and on close."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "ab")
        self.count = 0
        self._synced = time.monotonic()

    def write(self, record: dict) -> None:
        self.file.write(json_exact.dumps(record) + b"\n")
        self.file.flush()
        self.count += 1
        if time.monotonic() - self._synced > FSYNC_EVERY_S:
            os.fsync(self.file.fileno())
            self._synced = time.monotonic()

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def begun(paths: OutputPaths) -> bool:
    """Whether an earlier run wrote answers or errors here."""
    return any(p.exists() and p.stat().st_size for p in (paths.records, paths.errors))
