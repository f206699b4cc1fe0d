"""What a data file's name says: its format and its compression (`a.jsonl.zst`: JSONL, zstd)."""

from __future__ import annotations

import os
from pathlib import Path

COMPRESSIONS = (".gz", ".zst", ".zstd", ".bz2", ".xz")
LINE_FORMATS = (".jsonl", ".ndjson")
DATA_SUFFIXES = LINE_FORMATS + (".json", ".parquet")


def split_suffixes(path: str | os.PathLike) -> tuple[str, str | None]:
    """Return (data format suffix, compression suffix or None), e.g. ('.jsonl', '.zst')."""
    name = Path(path).name.lower()
    compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
    if compression:
        name = name[: -len(compression)]
    fmt = next((s for s in DATA_SUFFIXES if name.endswith(s)), "")
    return fmt, compression
