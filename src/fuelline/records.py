"""The records that flow between stages (see DESIGN.md, "Stage contract").

Records stay plain dicts (they are read and written as JSON at every stage boundary), and this
module owns their shape: how a document record is built, and how its stable id is
derived.
"""

from __future__ import annotations

import os
from typing import Any

import xxhash


def document(id: str, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`{"id", "text", "meta"}`: the record of the pretraining pipeline."""
    return {"id": id, "text": text, "meta": meta or {}}


def fallback_id(source: str, line: int) -> str:
    """Stable id of a record without an upstream id: a 128-bit hash of its file name and line.

    Only the file's name is hashed, not its directory, so ids survive moving the corpus.
    """
    return xxhash.xxh3_128_hexdigest(f"{os.path.basename(source)}:{line}".encode())

