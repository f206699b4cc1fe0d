"""Evaluation sets as local files: `[NAME=]FILE[:FIELD]`, read by the readers every stage uses.

A file is JSONL, a JSON array or Parquet, plain or compressed (`fuelline.io.readers`); nothing is
downloaded. FIELD says where an item's text is: a key, a dotted path into nested objects
(`input.prompt`), or a list, each string of which is a *part* checked on its own (MT-Bench's
`turns`: a training record holding only the first turn still holds the item). A chat turn
`{"role", "content"}` in such a list is its content (Arena-Hard's `turns`). FIELD may also be the
name of a common layout (`LAYOUTS`: `test.jsonl:gsm8k`), and without FIELD the first record's keys
decide among the layouts' fields, in the order of `DETECTED`. The set is called NAME, else the
layout's name, else the file's name without its suffixes. NAME ends at the first "=" and FIELD
starts after the last ":", but a path holding either is read as meant: of the readings of a spec,
the one whose file exists is taken, and two that both exist are refused, naming both.

An item whose field is blank (empty, or only spaces and characters that render as nothing) has no
part: it cannot be checked, and the report counts it (`items_blank`); a set whose items are all
blank is refused, since the field named is not where its prompts are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuelline.io.suffixes import split_suffixes
from fuelline.io.readers import RecordError, iter_file_records
from fuelline.text import without_invisible

# The fields of the common evaluation sets, as their files come (the first that a record has is used).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("question",),
    "humaneval": ("prompt",),
    "mbpp": ("text", "prompt"),  # the original release; the sanitized one says "prompt"
    "math": ("problem",),  # MATH and MATH-500
    "mt-bench": ("turns",),
    "alpacaeval": ("instruction",),
    "arena-hard": ("turns", "prompt"),  # v0.1: turns [{"content"}]; v2.0: prompt
}
DETECTED = ("turns", "question", "problem", "instruction", "prompt", "text")
ID_KEYS = ("id", "task_id", "question_id", "unique_id", "uid", "idx")


@dataclass(frozen=True)
class EvalItem:
    number: int  # 1-based position in its file
    id: str | None  # the item's own id (task_id, question_id, …), if it has one
    parts: tuple[str, ...]  # the texts checked: one, or one per string of a list field; none when blank


@dataclass(frozen=True)
class EvalSet:
    name: str
    path: str
    field: str
    items: tuple[EvalItem, ...]


SPEC = "[NAME=]FILE[:FIELD]"


def _readings(spec: str) -> list[tuple[str | None, str, str | None]]:
    """Every (name, file, field) `spec` may mean, the grammar's own (a name and a field split off) last."""
    names = [(None, spec)]
    if "=" in spec:
        name, _, rest = spec.partition("=")
        names.append((name or None, rest))
    readings = []
    for name, rest in names:
        readings.append((name, rest, None))
        if ":" in rest:
            path, _, field = rest.rpartition(":")
            readings.append((name, path, field or None))
    return readings


def _said(reading: tuple[str | None, str, str | None]) -> str:
    name, path, field = reading
    return f"the file {path}" + (f", field {field}" if field else "") + (f", as the set {name}" if name else "")


def parse_spec(spec: str) -> tuple[str | None, str, str | None]:
    """(name, file, field) of `[NAME=]FILE[:FIELD]` (see the module doc): the reading whose file exists,
    else the grammar's; a ValueError when two readings' files exist."""
    readings = _readings(spec)
    files = [r for r in readings if os.path.isfile(r[1])]
    if len(files) > 1:
        raise ValueError(f"--against {spec} is ambiguous ({SPEC}): it may be " + " or ".join(map(_said, files))
                         + "; name the set to read a file whose path holds '=' (NAME=FILE[:FIELD]), or write the "
                           "path another way (./FILE)")
    return (files or [r for r in readings if os.path.exists(r[1])] or readings[-1:])[0]


def require_file(path: str) -> None:
    """An evaluation set is a local file: nothing is downloaded."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"evaluation set {path}: a directory; --against takes one file (FILE[:FIELD]), "
                                "once per set")
    if not Path(path).is_file():
        raise FileNotFoundError(f"evaluation set {path}: no such file (--against {SPEC}: NAME ends at the first '=', "
                                "FIELD starts after the last ':'; nothing is downloaded)")


def _set_name(path: str) -> str:
    fmt, compression = split_suffixes(path)
    base = os.path.basename(path)
    return base[: len(base) - len(fmt) - len(compression or "")] or base


def _leaf_texts(value: Any) -> list[str] | None:
    """The strings of a field's value: a string, a list of them (or of chat turns), else None."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return [value["content"]]
    if isinstance(value, list):
        found = [_leaf_texts(v) for v in value]
        return None if any(f is None for f in found) else [t for f in found for t in f]
    return None


def field_value(record: dict, field: str) -> tuple[bool, Any]:
    """(found, value) of a dotted path; a list on the way is walked element by element."""
    value: Any = record
    for key in field.split("."):
        if isinstance(value, list):
            values = [v.get(key) if isinstance(v, dict) else None for v in value]
            if not any(key in v for v in value if isinstance(v, dict)):
                return False, None
            value = values
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            return False, None
    return True, value


def _detect(path: str, record: dict, candidates: tuple[str, ...], layout: str | None) -> str:
    for field in candidates:
        if field_value(record, field)[0]:
            return field
    keys = ", ".join(sorted(map(str, record))[:12]) or "none"
    known = f"the {layout} layout's fields ({', '.join(candidates)})" if layout else \
        "the fields of the known layouts (" + ", ".join(f"{k}: {', '.join(v)}" for k, v in LAYOUTS.items()) + ")"
    raise ValueError(f"{path}: its first record has none of {known}; its keys: {keys}. Name the field that "
                     f"holds the prompt: --against {path}:FIELD (a dotted path for nested fields)")


def _item_id(record: dict) -> str | None:
    for key in ID_KEYS:
        if isinstance(record.get(key), (str, int)) and not isinstance(record.get(key), bool):
            return str(record[key])
    return None


def load_eval_set(spec: str) -> EvalSet:
    """The items of one evaluation set; a missing file, a missing field or a field that holds no
    text is a ValueError naming the file (and line)."""
    name, path, field = parse_spec(spec)
    require_file(path)
    layout = field if field in LAYOUTS else None
    candidates = LAYOUTS[layout] if layout else (field,) if field else DETECTED
    items, chosen = [], None
    for line, record in iter_file_records(path):
        if not isinstance(record, dict):
            raise RecordError(path, line, f"an evaluation item is a JSON object, not {type(record).__name__}")
        if chosen is None:
            chosen = candidates[0] if field and not layout else _detect(path, record, candidates, layout)
        found, value = field_value(record, chosen)
        if not found:
            keys = ", ".join(sorted(map(str, record))[:12]) or "none"
            raise RecordError(path, line, f"no field {chosen!r} (its keys: {keys}); --against {path}:FIELD names "
                                          "the field that holds the prompt")
        texts = _leaf_texts(value)
        if texts is None:
            raise RecordError(path, line, f"field {chosen!r} holds {type(value).__name__}, not text: a string, or a "
                                          "list of strings or of chat turns {\"content\"}")
        items.append(EvalItem(line, _item_id(record), tuple(t for t in texts if without_invisible(t).strip())))
    if not items:
        raise ValueError(f"evaluation set {path}: no items")
    if not any(item.parts for item in items):
        raise ValueError(f"evaluation set {path}: field {chosen!r} is blank in all {len(items):,} items, nothing to "
                         f"check; --against {path}:FIELD names the field that holds the prompt")
    return EvalSet(name or layout or _set_name(path), path, chosen, tuple(items))


def load_eval_sets(specs: list[str]) -> list[EvalSet]:
    """Every set of `--against`, each named once (two files of one name: give NAME=FILE)."""
    sets = [load_eval_set(spec) for spec in specs]
    names = [s.name for s in sets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two evaluation sets are called {', '.join(twice)}: name them, e.g. --against "
                         f"gsm8k=PATH --against math=PATH")
    return sets
