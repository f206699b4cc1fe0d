"""What every file of an export (`fuelline.cache.export`) must hold, and the check a rerun makes against it.

The journal `fuelline_export_files.jsonl` has a line per sample, appended as each file is
renamed into place (so a line never names a file that is not whole):
`{"sample": 7, "record_id": "…", "bytes": 1234, "xxh3": "…", "check": "…"}` (a target may add a
field of its own: the Arrow layout of speculators keeps the loss mask there), or `{"sample": 7,
"record_id": "…", "skipped": REASON, "check": "…"}` for a sample left out (`--nonfinite skip`);
the record id (fuelline caches) is the one read with the sample, its record checksummed, and
`record_ids.txt` is made from these lines, never from shard bytes read unchecked. `check` is the xxh3 of the
line without it: a torn last line (a kill while appending) or a damaged one is dropped, and the
file it named is written again (the bytes of a file depend only on the cache and the options, so
rewriting one changes nothing). A later line for a sample replaces an earlier one. When the
export finishes the journal is rewritten sorted by sample, atomically, and is then the export's
list of files.

Every run of an export, finished or not, checks every file against it (`check_files`) and lists
the rest of OUT's data files (`strays`), since a trainer's walker reads every file it takes under
OUT (SpecForge's every `.ckpt` and `.ckpt.gz`, speculators' every name ending in `pt`). A stray is
removed only when the export wrote it (`fuelline.cache.export`); a user's `notes.pt` refuses the run.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path

import orjson

from fuelline.formats.target_cache import checksum, checksum_of
from fuelline.io.atomic import is_temp_name

JOURNAL = "fuelline_export_files.jsonl"
READ_BLOCK = 16 << 20
PROBLEMS = ("missing", "short", "size", "changed", "unjournaled")  # what `check_files` finds, in the order said


def digest(data) -> str:
    return f"{checksum(data):016x}"


def journal_line(entry: dict) -> bytes:
    """One journal line: `entry` (sample first) and its check."""
    body = orjson.dumps(entry)
    return orjson.dumps({**entry, "check": digest(body)}) + b"\n"


def read_journal(output: Path) -> tuple[dict[int, dict], bool]:
    """(the last whole line of each sample, without its check, torn or damaged lines left out;
    whether the journal is exactly those lines in sample order, as a finished export leaves it).
    No journal: nothing recorded (an export made before there was one, or a new one)."""
    try:
        data = (output / JOURNAL).read_bytes()
    except FileNotFoundError:
        return {}, False
    entries = {}
    for raw in data.split(b"\n"):  # a torn last line has no newline: it is the last piece, and unparsable
        if (entry := _parsed(raw)) is not None:
            entries[entry["sample"]] = entry
    return entries, data == b"".join(journal_line(entries[i]) for i in sorted(entries))


def _parsed(raw: bytes) -> dict | None:
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("check"), str):
        return None
    check = entry.pop("check")
    if check != digest(orjson.dumps(entry)) or type(entry.get("sample")) is not int:
        return None
    return entry


def journal_bytes(entries: dict[int, dict], count: int) -> bytes:
    """The finished journal: a line for each of samples 0 … count - 1, in order."""
    return b"".join(journal_line(entries[i]) for i in range(count))


def check_files(paths: dict[int, Path], entries: dict[int, dict], *, verify: bool,
                workers: int) -> dict[str, list[int]]:
    """The samples whose file must be written, by why: `missing`, `short` (fewer bytes than
    journaled), `size` (more), `changed` (other bytes), `unjournaled` (a file the journal does
    not name, or no line at all). `paths`: where each sample's file is; skipped samples
    (journaled as such) are not checked here, their file is a stray. Something else than a
    regular file in a file's place is refused: it is not the export's to delete."""
    found: dict[str, list[int]] = defaultdict(list)
    to_hash = []
    for sample, path in paths.items():
        entry = entries.get(sample)
        if entry is not None and "skipped" in entry:
            continue
        try:
            info = path.lstat()
        except FileNotFoundError:
            found["unjournaled" if entry is None else "missing"].append(sample)
            continue
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file where the export's file of sample {sample} goes (a "
                             "directory or a link?); move it away and run the same command again")
        size = info.st_size
        if entry is None or type(entry.get("bytes")) is not int:
            found["unjournaled"].append(sample)
        elif size != entry["bytes"]:
            found["short" if size < entry["bytes"] else "size"].append(sample)
        elif verify:
            to_hash.append(sample)
    with ThreadPoolExecutor(max(workers, 1), thread_name_prefix="export-check") as pool:
        for sample, actual in zip(to_hash, pool.map(lambda s: file_digest(paths[s]), to_hash)):
            if actual != entries[sample]["xxh3"]:
                found["changed"].append(sample)
    return {kind: sorted(found[kind]) for kind in PROBLEMS if kind in found}


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return f"{checksum_of(iter(lambda: f.read(READ_BLOCK), b'')):016x}"


def strays(output: Path, expected: set[Path], is_data_file: Callable[[Path], bool]) -> list[Path]:
    """Every file under `output` (at any depth) that `is_data_file` calls the export's (what the
    trainer's walker would take, what lies in the export's own folders) and that is not in `expected`;
    not the temp files of a killed run's writes, which every run removes (`remove_temp_files`)."""
    found = []
    for folder, _, names in os.walk(output):
        found += [Path(folder) / name for name in names if not is_temp_name(name)
                  and is_data_file(Path(folder) / name) and Path(folder) / name not in expected]
    return sorted(found)
