"""Turn what a user typed (files, directories, globs) into an ordered list of input files."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Iterable

from fuelline.io.atomic import is_temp_name

COMPRESSIONS = (".gz", ".zst", ".zstd", ".bz2", ".xz")
LINE_FORMATS = (".jsonl", ".ndjson")
DATA_SUFFIXES = LINE_FORMATS + (".json", ".parquet")

# A directory written by a fuelline stage holds its data as part-* files next to bookkeeping
# (stats.json, _plan.json, _done/, _rejects/); reading the directory means reading the parts.
STAGE_PLAN_FILE = "_plan.json"
STAGE_PART_PREFIX = "part-"
# What every step writes beside its data; never records, so a directory read skips them.
BOOKKEEPING_FILES = {"stats.json", "pipeline.json", "funnel.json"}


def split_suffixes(path: str | os.PathLike) -> tuple[str, str | None]:
    """Return (data format suffix, compression suffix or None), e.g. ('.jsonl', '.zst')."""
    name = Path(path).name.lower()
    compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
    if compression:
        name = name[: -len(compression)]
    fmt = next((s for s in DATA_SUFFIXES if name.endswith(s)), "")
    return fmt, compression


def is_data_file(path: str | os.PathLike) -> bool:
    name = Path(path).name
    if name.startswith((".", "_")) or is_temp_name(name):
        return False
    fmt, compression = split_suffixes(name)
    return bool(fmt) and not (fmt == ".parquet" and compression)


def _files_in_directory(directory: Path) -> list[Path]:
    if (directory / STAGE_PLAN_FILE).exists():
        return sorted(p for p in directory.iterdir() if p.name.startswith(STAGE_PART_PREFIX) and is_data_file(p))
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found.extend(Path(root) / f for f in files if is_data_file(f) and f not in BOOKKEEPING_FILES)
    return sorted(found)


def expand_inputs(sources: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Files for `sources`, in the order given; directories and globs expand in sorted order.

    A file named explicitly must exist and have a supported suffix; a glob or directory that
    matches nothing is an error, so a typo never turns into an empty run.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files: list[Path] = []
    for source in sources:
        text = os.fspath(source)
        path = Path(text)
        if path.is_dir():
            matched = _files_in_directory(path)
        elif glob.has_magic(text):
            matched = []
            for hit in sorted(glob.glob(text, recursive=True)):
                hit_path = Path(hit)
                matched.extend(_files_in_directory(hit_path) if hit_path.is_dir() else [hit_path] if is_data_file(hit_path) else [])
        elif path.exists():
            if not is_data_file(path):
                raise ValueError(
                    f"{path}: unsupported file type; expected one of "
                    f"{', '.join(DATA_SUFFIXES)} (optionally {', '.join(COMPRESSIONS)}, except for parquet)"
                )
            matched = [path]
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
        if not matched:
            raise FileNotFoundError(f"{text}: matched no data files")
        files.extend(matched)
    return files
