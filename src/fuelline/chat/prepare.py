"""The chat-prepare stage: chat data of any schema → validated chat records, split train / eval.

Each input record is normalized (`fuelline.chat.schemas`), validated, and sent to one of two
outputs by a hash of (seed, id), so the split does not depend on file order or workers:

- `train`: chat records `{"id", "conversations", "tools"?}` with the whole conversation (the
  record contract of `fuelline.records.chat`: tool calls, tool results and reasoning as fields);
- `eval`: eval records `{"id", "turns"}` holding only the user contents, because evaluation
  lets the target and the draft generate the answers.

Ids must be unique, because regeneration and the target cache key their work by id: an id seen
before (in input order, over the whole input: `prepare`) becomes `ID#2`, `ID#3`, …. System turns
are removed unless `keep_system` (regeneration uses the target's own default). The counters and
tables of stats.json (per schema, form, category and outcome) are listed in docs/chat.md.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from fuelline.chat.schemas import SCHEMAS, normalize_record
from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.readers import iter_file_records
from fuelline.pipeline.options import option
from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage, StageConfig
from fuelline.records import Drop, Location, chat, eval_prompts, fallback_id, unit_interval

SCHEMA_COUNTER, FORM_COUNTER, CATEGORY_COUNTER = "schema.", "form.", "category."
TRAILING_COUNTERS = {"user": "trailing_user_turn_removed", "tool": "trailing_tool_results_removed"}
OUTCOMES = ("in", "train", "eval", "dropped")
# Not pack's "split": with the same seed, pack's val split of the train records would be empty.
SPLIT_SALT = "chat-eval"
CATEGORY_FROM_FILE = "@file"  # category_key value: the input file's name, up to its first dot
RENAMED_FILE = "renamed_ids.json"


@dataclass
class ChatPrepareConfig(StageConfig):
    test_size: float = option(0.05, "share of conversations held out as eval prompts", min=0, max=1)
    seed: int = option(42, "decides the split, from a hash of (seed, id)")
    schema: str = option("auto", "input schema (sharegpt: conversations of from/value; openai: messages of "
                         "role/content; alpaca: instruction/input/output; qa: question/answer, query/response or "
                         "prompt/completion), or auto: detected per record", choices=["auto", *SCHEMAS])
    keep_system: bool = option(False, "keep system turns (default: remove them)")
    category_key: str = option("", "record field naming its category (chat, math, code, …), or @file for the input "
                               "file's name: counted per category")


def content_counters(turns: list[dict[str, Any]], tools: list | None) -> list[str]:
    """The `records_with_*` counters a kept conversation adds to."""
    found = {"tools": bool(tools), "tool_calls": any("tool_calls" in t for t in turns),
             "tool_results": any(t["role"] == "tool" for t in turns),
             "reasoning": any("reasoning_content" in t for t in turns)}
    return [f"records_with_{name}" for name, present in found.items() if present]


def _table(counters: dict[str, int], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: n for k, n in counters.items() if k.startswith(prefix)}


def record_id(record: dict[str, Any], location: Location) -> str:
    """The upstream `id` (string or integer), else a hash of the file name and line."""
    upstream = record.get("id")
    if isinstance(upstream, str) and upstream:
        return upstream
    if isinstance(upstream, int) and not isinstance(upstream, bool):
        return str(upstream)
    return fallback_id(location.source, location.line)


def shard_ids(shard: InputShard) -> list[tuple[int, str]]:
    """(line, id) of every readable record of a shard, in order."""
    return [(line, record_id(record, Location(shard.source, line)))
            for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip")]


def renamed_duplicates(per_shard: list[list[tuple[int, str]]]) -> list[dict[int, str]]:
    """Per shard, {line: new id} for every occurrence of an id after its first."""
    seen: dict[str, int] = {}
    renamed: list[dict[int, str]] = []
    for ids in per_shard:
        renamed.append({})
        for line, rid in ids:
            seen[rid] = seen.get(rid, 0) + 1
            if seen[rid] > 1:
                new = f"{rid}#{seen[rid]}"
                while new in seen:  # an upstream id may look like a renamed one already
                    seen[rid] += 1
                    new = f"{rid}#{seen[rid]}"
                seen[new] = 1
                renamed[-1][line] = new
    return renamed


class ChatPrepareStage(Stage):
    name = "chat-prepare"
    description = "Normalize chat data (ShareGPT, OpenAI, Alpaca, Q/A), validate it, split train / eval."
    Config = ChatPrepareConfig
    outputs = ("train", "eval")

    def __init__(self, config: ChatPrepareConfig | None = None):
        super().__init__(config)
        self._renamed: list[dict[int, str]] | None = None

    def prepare(self, ctx: PrepareContext) -> None:
        """Find the ids that repeat over the whole input (one pass over the ids, per shard on the workers)."""
        path = ctx.workdir / RENAMED_FILE
        if path.exists():
            self._renamed = [{int(k): v for k, v in shard.items()} for shard in orjson.loads(path.read_bytes())]
            return
        self._renamed = renamed_duplicates(ctx.map(shard_ids, ctx.shards, f"{self.name}: ids"))
        write_bytes_atomic(path, orjson.dumps([{str(k): v for k, v in shard.items()} for shard in self._renamed]))

    def _category(self, record: dict[str, Any], location: Location) -> str | None:
        key = self.config.category_key
        if not key:
            return None
        if key == CATEGORY_FROM_FILE:
            return Path(location.source).name.split(".")[0]
        value = record.get(key)
        return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else "unknown"

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[tuple[str, dict]]:
        for location, record in records:
            category = self._category(record, location)
            outcome = self._prepare(record, location, ctx, category)
            if category is not None:
                ctx.count(f"{CATEGORY_COUNTER}{category}.in")
                ctx.count(f"{CATEGORY_COUNTER}{category}.{outcome[0] if outcome else 'dropped'}")
            if outcome:
                yield outcome

    def _prepare(self, record: dict, location: Location, ctx: ShardContext,
                 category: str | None) -> tuple[str, dict] | None:
        cfg = self.config
        result = normalize_record(record, cfg.schema)
        if isinstance(result, Drop):
            ctx.drop(record, result.reason, location, result.detail)
            return None
        turns = result.turns
        ctx.count(f"{SCHEMA_COUNTER}{result.schema}")
        for name in sorted(result.forms):
            ctx.count(f"{FORM_COUNTER}{name}")
        for name in content_counters(turns, result.tools):
            ctx.count(name)
        if result.trailing_removed:
            ctx.count(TRAILING_COUNTERS[result.trailing_removed])
        if turns[0]["role"] == "system" and not cfg.keep_system:
            turns = turns[1:]
            ctx.count("system_turn_removed")
        rid = self._renamed[ctx.shard_id].get(location.line) if self._renamed else None
        if rid is not None:
            ctx.count("duplicate_id_renamed")
        else:
            rid = record_id(record, location)
        if unit_interval(cfg.seed, SPLIT_SALT, rid) < cfg.test_size:
            return "eval", eval_prompts(rid, turns)
        return "train", chat(rid, turns, {"category": category} if category is not None else None, result.tools)

    def summary(self, workdir: Path, stats: dict) -> dict:
        """Counters `schema.X`, `form.X` and `category.C.OUTCOME` as `schemas`, `forms` (when any)
        and `categories` tables."""
        schemas, forms = (_table(stats["counters"], prefix) for prefix in (SCHEMA_COUNTER, FORM_COUNTER))
        categories: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
        for key, n in stats["counters"].items():
            if key.startswith(CATEGORY_COUNTER):
                name, outcome = key[len(CATEGORY_COUNTER):].rsplit(".", 1)
                categories[name][outcome] = n
        summary: dict[str, Any] = {"schemas": schemas}
        if forms:
            summary["forms"] = forms
        if categories:
            summary["categories"] = dict(sorted(categories.items()))
        return summary
