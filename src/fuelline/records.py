"""The records that flow between stages (docs/design.md, "Record contracts").

Records stay plain dicts (they are read and written as JSON at every stage boundary), and this
module owns their shape: how a document, chat or eval record is built, how its stable id is
derived, and the per-record random draws (split, dropout) that must not depend on workers. It
also owns the two small values every stage passes around with a record: where it came from
(`Location`) and why it was dropped (`Drop`), so that a module which builds or filters records
needs nothing from the pipeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import xxhash


@dataclass(frozen=True)
class Location:
    """Where a record came from: its file and 1-based line (or array element, or Parquet row)."""

    source: str
    line: int


@dataclass(frozen=True)
class Drop:
    """Returned by `Stage.apply` to drop a record; `reason` names the rule, as in stats.json."""

    reason: str
    detail: str | None = None


def document(id: str, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`{"id", "text", "meta"}`: the record of the pretraining pipeline."""
    return {"id": id, "text": text, "meta": meta or {}}


def chat(id: str, conversations: list[dict[str, Any]], meta: dict[str, Any] | None = None,
         tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`{"id", "conversations": [turn, …], "tools"?, "meta"?}`: a training conversation.

    Its contract is `fuelline.formats.chat_record`'s, which every step reading chat records checks;
    what of it is trained on is told in docs/design.md ("Record contracts").
    """
    record: dict[str, Any] = {"id": id, "conversations": conversations}
    if tools:
        record["tools"] = tools
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


def record_kind(record: dict) -> str:
    """What kind of record `record` looks like, in words, for a message that says what a command
    found where it expected another kind: "a chat record (conversations)", "an eval record (turns)",
    "a document record (text)", else its keys."""
    if isinstance(record.get("conversations"), list):
        return "a chat record (conversations)"
    if isinstance(record.get("turns"), list):
        return "an eval record (turns)"
    if isinstance(record.get("text"), str):
        return "a document record (text)"
    keys = ", ".join(sorted(map(str, record))[:6]) or "none"
    return f"a record with keys {keys}"


def document_from_raw(record: dict, location: Location, *, text_key: str = "text", id_key: str = "id",
                      meta_keys: list[str] | None = None) -> dict | Drop:
    """A document record from a raw one, or a Drop saying which field is missing or wrong."""
    if text_key not in record:
        return Drop("missing_text", f"no field {text_key!r}")
    text = record[text_key]
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        text = "\n".join(text)
    elif not isinstance(text, str):
        return Drop("bad_text_type", f"{text_key!r} is {type(text).__name__}, not a string or list of strings")
    if not text.strip():
        return Drop("empty_text")
    upstream_id = record.get(id_key)
    doc_id = str(upstream_id) if upstream_id not in (None, "") else fallback_id(location.source, location.line)
    if meta_keys:
        meta = {k: record[k] for k in meta_keys if k in record}
    else:
        meta = {k: v for k, v in record.items() if k not in (text_key, id_key)}
    return document(doc_id, text, meta)
