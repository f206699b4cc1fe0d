"""The decontaminate stage: drop the training records that hold an item of an evaluation set.

`prepare` reads the evaluation sets (`fuelline.decontaminate.evalsets`) and builds their n-gram
index (`fuelline.decontaminate.index`) once, under `_prepare/index/`; every shard then loads it
and checks its records in batches. What is checked: a document record's text, or a chat record's
user turns (the evaluation sets are prompts; `turns = "all"` checks every turn, reasoning, tool
calls and tool results included: `fuelline.decontaminate.texts`). A record that holds neither is
an error naming FILE:LINE, or with on_error = "skip" dropped under its reason. A record that holds
an item is dropped as `contaminated`, the reject's detail naming
the set, the item and the share of its n-grams found; with `report_only` it is kept and only
counted. Each shard writes what it found (`_prepare/found/part-k.json`, before its marker), and
`summary` adds them up into stats.json's `decontaminate`: per evaluation set, the items found, in
how many training records, with examples. The evaluation files' checksums are part of the
stage's identity: a run against an edited set is not resumed as if it were the same.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from fuelline.decontaminate.evalsets import load_eval_sets, parse_spec, require_file
from fuelline.decontaminate.index import EvalIndex, Rule, build_index
from fuelline.decontaminate.texts import checked_texts
from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.readers import RecordError
from fuelline.pipeline.options import option
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage, StageConfig
from fuelline.records import Drop, Location

REASON = "contaminated"
BATCH = 512  # records checked together: one encode and one numba call each
EXAMPLES = 3  # training record ids kept per item found, and items shown per evaluation set
PREVIEW = 160  # characters of an item's text in the report


@dataclass
class DecontaminateConfig(StageConfig):
    against: list[str] = option(factory=list, required=True, help=(
        "an evaluation set: FILE (JSONL, JSON array, Parquet, compressed) with the field holding its prompts as "
        "FILE:FIELD (a dotted path; a list such as MT-Bench's turns is checked turn by turn) or the name of a "
        "layout (gsm8k, humaneval, mbpp, math, mt-bench, alpacaeval, arena-hard), detected when left out; "
        "NAME=FILE:FIELD names the set"), reads=lambda spec: parse_spec(spec)[1])
    turns: str = option("user", "chat records: which turns are checked (evaluation sets are prompts); all: every "
                                "turn, tool calls' arguments and tool results included", choices=["user", "all"])
    ngram: int = option(8, "n-gram length in tokens (a word, or one Han, kana or hangul character)", min=1)
    threshold: float = option(0.5, "share of an item's n-grams a record must hold for the item to be found",
                              min=0.01, max=1.0)
    min_ngrams: int = option(5, "n-grams an item must have found at least, whatever its length (an item with "
                                "fewer: all of them)", min=1)
    common: int = option(10, "n-grams found in more than this many evaluation items are ignored", min=1)
    report_only: bool = option(False, "keep every record; only report what was found")


def _batches(records: Iterable[tuple[Location, dict]], turns: str,
             ctx: ShardContext) -> Iterator[list[tuple[Location, dict, list[str]]]]:
    """Batches of (location, record, its checked texts); a record that cannot be checked raises a
    RecordError naming FILE:LINE, or under on_error = "skip" is dropped under its reason."""
    iterator = iter(records)
    while batch := list(islice(iterator, BATCH)):
        checked = []
        for location, record in batch:
            texts = checked_texts(record, turns)
            if not isinstance(texts, Drop):
                checked.append((location, record, texts))
            elif ctx.on_error == "skip":
                ctx.drop(record, texts.reason, location, texts.detail)
            else:
                raise RecordError(location.source, location.line, f"{texts.detail} ({texts.reason})")
        yield checked


class DecontaminateStage(Stage):
    name = "decontaminate"
    description = ("Drop the records that hold an item of an evaluation set (n-gram overlap; prompts of chat records), "
                   "and report what was found.")
    Config = DecontaminateConfig
    _workdir: Path | None = None  # set by `prepare`
    _index: EvalIndex | None = None  # loaded once per worker

    def __getstate__(self):
        return {**self.__dict__, "_index": None}  # each worker loads the index from the work directory

    def rule(self) -> Rule:
        c = self.config
        return Rule(c.ngram, c.threshold, c.min_ngrams, c.common)

    def fingerprints(self) -> dict[str, str]:
        """{evaluation set spec: sha256 of its file}: the sets decide what is dropped."""
        found = {}
        for spec in self.config.against:
            _, path, _ = parse_spec(spec)
            require_file(path)
            with open(path, "rb") as f:
                found[spec] = hashlib.file_digest(f, "sha256").hexdigest()
        return found

    def prepare(self, ctx: PrepareContext) -> None:
        self._workdir = ctx.workdir
        if not EvalIndex.intact(ctx.workdir / "index"):
            build_index(load_eval_sets(self.config.against), self.rule()).save(ctx.workdir / "index")

    def _loaded(self) -> EvalIndex:
        if self._index is None:
            self._index = EvalIndex.load(self._workdir / "index")
        return self._index

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        index = self._loaded()
        parts = index.items["parts"]
        found_items: dict[str, list] = {}  # "set/item": [records, first ids]
        set_records: dict[str, int] = defaultdict(int)
        for batch in _batches(records, self.config.turns, ctx):
            for (location, record, _), matches in zip(batch, index.match([texts for _, _, texts in batch])):
                if not matches:
                    yield record
                    continue
                record_id = str(record.get("id") or f"{location.source}:{location.line}")
                items = {}  # the best part of each item found, by share of its n-grams
                for part, count, total in matches:
                    s, i, _ = parts[part]
                    key = f"{s}/{i}"
                    if key not in items or count / total > items[key][0] / items[key][1]:
                        items[key] = (count, total)
                for key in items:
                    entry = found_items.setdefault(key, [0, []])
                    entry[0] += 1
                    if len(entry[1]) < EXAMPLES:
                        entry[1].append(record_id)
                for s in {key.split("/")[0] for key in items}:
                    set_records[s] += 1
                ctx.count("records_with_eval_items")
                if self.config.report_only:
                    yield record
                else:
                    ctx.drop(record, REASON, location, self._detail(index, items))
        write_bytes_atomic(self._workdir / "found" / f"part-{ctx.shard_id:05d}.json",
                           orjson.dumps({"items": found_items, "records": set_records}))

    def _detail(self, index: EvalIndex, items: dict[str, tuple[int, int]]) -> str:
        """The reject's detail: each item found, as SET item N (its line or position in its file) (id ID): K of
        M n-grams."""
        sets, n = index.items["sets"], index.ngram
        said = []
        for key, (count, total) in sorted(items.items(), key=lambda kv: -kv[1][0] / kv[1][1]):
            s, i = map(int, key.split("/"))
            item_id, _, number = sets[s]["texts"][i]
            said.append(f"{sets[s]['name']} item {number}" + (f" (id {item_id})" if item_id is not None else "")
                        + f": {count} of {total} {n}-grams")
        return "; ".join(said)

    def summary(self, workdir: Path, stats: dict) -> dict:
        index_dir = workdir / "index"
        if not (index_dir / "items.json").exists():
            return {}
        described = orjson.loads((index_dir / "items.json").read_bytes())
        totals: dict[str, list] = {}
        records: dict[str, int] = defaultdict(int)
        for path in sorted((workdir / "found").glob("part-*.json")):
            found = orjson.loads(path.read_bytes())
            for key, (count, ids) in found["items"].items():
                entry = totals.setdefault(key, [0, []])
                entry[0] += count
                entry[1].extend(ids[:EXAMPLES - len(entry[1])])
            for s, count in found["records"].items():
                records[s] += count
        return {"decontaminate": decontamination_report(described, totals, records, self.config.report_only)}


def decontamination_report(described: dict, totals: dict[str, list], records: dict[str, int],
                           report_only: bool) -> dict:
    """stats.json's `decontaminate`: the rule, and per evaluation set its items found, the training
    records holding any of them, and the items found in the most records, with their first records."""
    sets = {}
    for s, eval_set in enumerate(described["sets"]):
        mine = sorted(((int(key.split("/")[1]), count, ids) for key, (count, ids) in totals.items()
                       if key.split("/")[0] == str(s)), key=lambda x: (-x[1], x[0]))
        examples = []
        for i, count, ids in mine[:EXAMPLES]:
            item_id, texts, number = eval_set["texts"][i]
            text = " / ".join(texts)
            examples.append({"item": number, "id": item_id, "text": text[:PREVIEW] + ("…" if len(text) > PREVIEW else ""),
                             "records": count, "record_ids": ids})
        sets[eval_set["name"]] = {
            "file": eval_set["file"], "field": eval_set["field"], "items": eval_set["items"],
            "items_found": len(mine), "records": records.get(str(s), 0), "items_blank": eval_set.get("items_blank", 0),
            "parts_too_short": eval_set["parts_too_short"], "parts_only_common": eval_set["parts_only_common"],
            "examples": examples}
    return {"rule": described["rule"], "action": "report only" if report_only else "dropped",
            "common_ngrams_ignored": described["common_ngrams"], "index_ngrams": described["ngrams"], "sets": sets}
