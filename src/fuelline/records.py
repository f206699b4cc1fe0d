"""The records that flow between stages (see DESIGN.md, "Stage contract").

Records stay plain dicts (they are read and written as JSON at every stage boundary), and this
module owns their shape: how a document, chat or eval record is built, how its stable id is
derived, and the per-record random draws (split, dropout) that must not depend on workers.
"""

from __future__ import annotations

import os
from typing import Any

import xxhash


def document(id: str, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`{"id", "text", "meta"}`: the record of the pretraining pipeline."""
    return {"id": id, "text": text, "meta": meta or {}}


def chat(id: str, conversations: list[dict[str, str]], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`{"id", "conversations": [{"role", "content"}, …]}`: a training conversation."""
    record: dict[str, Any] = {"id": id, "conversations": conversations}
    if meta:
        record["meta"] = meta
    return record


def user_turns(conversations: list[dict[str, str]]) -> list[str]:
    return [t["content"] for t in conversations if t["role"] == "user"]


def eval_prompts(id: str, conversations: list[dict[str, str]]) -> dict[str, Any]:
    """`{"id", "turns"}`: only the user contents, because evaluation lets the models answer."""
    return {"id": id, "turns": user_turns(conversations)}


def unit_interval(seed: int, salt: str, key: str) -> float:
    """A deterministic number in [0, 1) for (seed, salt, key): the same whatever the workers."""
    return xxhash.xxh3_64_intdigest(f"{seed}:{salt}:{key}".encode()) / 2.0**64


def fallback_id(source: str, line: int) -> str:
    """Stable id of a record without an upstream id: a 128-bit hash of its file name and line.

    Only the file's name is hashed, not its directory, so ids survive moving the corpus.
    """
    return xxhash.xxh3_128_hexdigest(f"{os.path.basename(source)}:{line}".encode())

