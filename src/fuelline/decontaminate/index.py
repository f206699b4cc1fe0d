"""The evaluation n-grams as a compact hashed set, and the rule that says an item is in a record.

Built once per run from the evaluation sets (`build_index`), saved as one .npz and a JSON of the
items, and loaded by every worker; its size is the evaluation sets' (8 bytes of key and 4 of
position per table slot, at most half full, plus 4 bytes per (n-gram, part) pair: 2.1 MB for
1,333 prompts in benchmarks/bench_decontaminate.py), whatever the size of the training data.

The rule. Each *part* of an item (its text, or one turn of a list field) has its distinct
n-grams, less those that occur in more than `common` evaluation items ("write a python function
to find the", "how many dollars does she"): they say nothing of which item a record holds. A part
is found in a training record when the record holds at least `threshold` of its n-grams and at
least `min_ngrams` of them; a part with fewer n-grams than that must have all of them found (and
one with none, shorter than n tokens, is not checked: it is counted as too short). An item is
found when one of its parts is. Only distinct n-grams count, on both sides, so a record that
repeats one phrase does not find an item with it.

Matching a record is one probe of the table per n-gram of the record, then one counter per
part that shares an n-gram with it (`_match_kernel`).
"""

from __future__ import annotations

import io
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import orjson
from numba import njit

from fuelline.decontaminate.evalsets import EvalSet
from fuelline.decontaminate.ngrams import ngram_hashes
from fuelline.io.atomic import write_bytes_atomic

ARRAYS = ("table_keys", "table_slots", "part_offsets", "part_ids", "required", "totals")


@dataclass
class Rule:
    ngram: int
    threshold: float
    min_ngrams: int
    common: int

    def required(self, totals: np.ndarray) -> np.ndarray:
        """N-grams a part must have found, from its number of (not common) n-grams."""
        share = np.ceil(self.threshold * totals - 1e-9).astype(np.int64)
        return np.minimum(totals, np.maximum(share, self.min_ngrams)).astype(np.int32)


@njit(cache=True)
def _fill_table(keys, table_keys, table_slots):
    mask = np.uint64(table_keys.shape[0] - 1)
    for i in range(keys.shape[0]):
        slot = keys[i] & mask
        while table_slots[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        table_keys[slot] = keys[i]
        table_slots[slot] = i


@njit(cache=True)
def _match_kernel(hashes, offsets, table_keys, table_slots, part_offsets, part_ids, required,
                  seen, counts, stamp, found_docs, found_parts, found_counts):
    """For each record (its n-grams at hashes[offsets[d]:offsets[d + 1]]), the parts it holds."""
    mask = np.uint64(table_keys.shape[0] - 1)
    touched = np.empty(part_ids.shape[0] + 1, dtype=np.int64)
    found = 0
    for d in range(offsets.shape[0] - 1):
        stamp += 1
        touched_count = 0
        for k in range(offsets[d], offsets[d + 1]):
            h = hashes[k]
            slot = h & mask
            while table_slots[slot] >= 0 and table_keys[slot] != h:
                slot = (slot + np.uint64(1)) & mask
            key = table_slots[slot]
            if key < 0 or seen[key] == stamp:  # not an evaluation n-gram, or counted for this record
                continue
            seen[key] = stamp
            for j in range(part_offsets[key], part_offsets[key + 1]):
                part = part_ids[j]
                if counts[part, 1] != stamp:
                    counts[part, 0], counts[part, 1] = 0, stamp
                    touched[touched_count] = part
                    touched_count += 1
                counts[part, 0] += 1
        for t in range(touched_count):
            part = touched[t]
            if counts[part, 0] >= required[part]:
                if found == found_docs.shape[0]:
                    return found, stamp, True  # out of room: the caller grows the arrays and asks again
                found_docs[found], found_parts[found], found_counts[found] = d, part, counts[part, 0]
                found += 1
    return found, stamp, False


class EvalIndex:
    """The n-grams of every part of every item, and which parts each one belongs to."""

    def __init__(self, arrays: dict[str, np.ndarray], items: dict):
        self.arrays, self.items = arrays, items  # items: {"rule", "sets": [...], "parts": [[set, item, turn], …]}
        self.ngram = items["rule"]["ngram"]
        self._seen = self._counts = None
        self._stamp = 0

    def match(self, texts: Sequence[str | Sequence[str]]) -> list[list[tuple[int, int, int]]]:
        """Per text, the (part, n-grams found, n-grams of the part) of every part it holds. A text may be a
        list of texts, their n-grams counted together (`fuelline.decontaminate.texts`), none spanning two."""
        segments, ends = [], [0]
        for text in texts:
            if isinstance(text, str):
                segments.append(text)
            else:
                segments.extend(text)
            ends.append(len(segments))
        hashes, offsets = ngram_hashes(segments, self.ngram)
        offsets = offsets[np.array(ends, dtype=np.int64)]
        a = self.arrays
        if self._seen is None:  # per process: the stamps make clearing them per record unnecessary
            self._seen = np.zeros(len(a["part_offsets"]) - 1, dtype=np.int64)
            self._counts = np.zeros((len(a["required"]), 2), dtype=np.int64)
        room = max(64, len(texts))
        while True:
            docs, parts, counts = (np.empty(room, dtype=np.int64) for _ in range(3))
            found, self._stamp, full = _match_kernel(hashes, offsets, a["table_keys"], a["table_slots"],
                                                     a["part_offsets"], a["part_ids"], a["required"], self._seen,
                                                     self._counts, self._stamp, docs, parts, counts)
            if not full:
                break
            room *= 4
        result: list[list[tuple[int, int, int]]] = [[] for _ in texts]
        for d, part, count in zip(docs[:found].tolist(), parts[:found].tolist(), counts[:found].tolist()):
            result[d].append((part, count, int(a["totals"][part])))
        return result

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(directory / "items.json", orjson.dumps(self.items))
        buffer = io.BytesIO()
        np.savez(buffer, **self.arrays)
        write_bytes_atomic(directory / "ngrams.npz", buffer.getvalue())

    @classmethod
    def load(cls, directory: Path) -> "EvalIndex":
        with np.load(directory / "ngrams.npz") as data:
            arrays = {name: data[name] for name in ARRAYS}
        return cls(arrays, orjson.loads((directory / "items.json").read_bytes()))

    @classmethod
    def intact(cls, directory: Path) -> bool:
        """Whether a saved index reads back whole (every array, its CRC checked, and the items): a damaged
        one is built again, never trusted; the same sets and rule give the same bytes."""
        try:
            index = cls.load(directory)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
            return False
        return isinstance(index.items.get("parts"), list) and len(index.items["parts"]) == len(index.arrays["totals"])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _unique_pairs(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (first, second) pairs, sorted by first then second."""
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    keep = np.ones(len(first), dtype=bool)
    keep[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    return first[keep], second[keep]


def build_index(sets: list[EvalSet], rule: Rule) -> EvalIndex:
    """The index of `sets` under `rule` (see the module docstring)."""
    parts, texts = [], []
    for s, eval_set in enumerate(sets):
        for i, item in enumerate(eval_set.items):
            for turn, text in enumerate(item.parts):
                parts.append((s, i, turn))
                texts.append(text)
    hashes, offsets = ngram_hashes(texts, rule.ngram)
    part_of = np.repeat(np.arange(len(texts), dtype=np.int64), np.diff(offsets))
    item_of_part = np.array([s * (1 << 32) + i for s, i, _ in parts], dtype=np.int64)
    keys, part_ids = _unique_pairs(hashes, part_of)
    # An n-gram is common when more than `common` distinct items hold it.
    item_hashes, _ = _unique_pairs(keys, item_of_part[part_ids])
    unique, items_per_key = np.unique(item_hashes, return_counts=True)
    common = unique[items_per_key > rule.common]
    kept = ~np.isin(keys, common)
    keys, part_ids = keys[kept], part_ids[kept]
    table_keys, key_starts = np.unique(keys, return_index=True)
    part_offsets = np.append(key_starts, len(keys)).astype(np.int64)
    size = 1 << max(4, math.ceil(math.log2(2 * len(table_keys) + 1)))
    slots_keys, slots = np.zeros(size, dtype=np.uint64), np.full(size, -1, dtype=np.int32)
    _fill_table(table_keys, slots_keys, slots)
    totals = np.bincount(part_ids, minlength=len(texts)).astype(np.int32)
    arrays = {"table_keys": slots_keys, "table_slots": slots, "part_offsets": part_offsets,
              "part_ids": part_ids.astype(np.int32), "required": rule.required(totals), "totals": totals}
    raw = np.diff(offsets)
    described = []
    for s, eval_set in enumerate(sets):
        mine = np.array([p for p, (ps, _, _) in enumerate(parts) if ps == s], dtype=np.int64)
        described.append({"name": eval_set.name, "file": eval_set.path, "field": eval_set.field,
                          "items": len(eval_set.items),
                          "items_blank": sum(not item.parts for item in eval_set.items),
                          "parts_too_short": int((raw[mine] == 0).sum()) if len(mine) else 0,
                          "parts_only_common": int(((raw[mine] > 0) & (totals[mine] == 0)).sum()) if len(mine) else 0,
                          "texts": [[item.id, list(item.parts), item.number] for item in eval_set.items]})
    items = {"rule": vars(rule), "sets": described, "parts": parts, "common_ngrams": int(len(common)),
             "ngrams": int(len(table_keys))}
    return EvalIndex(arrays, items)
