"""Poetry instruction data: a chat record per prompt, whose user turn asks for the poem it answers.

From one cleaned poem (`{"id", "text", "meta": {"title", "author", "dynasty", "form", …}}`) the
stage writes up to `prompts_per_poem` chat records

    {"id": "POEM_ID#k", "conversations": [{"role": "user", "content": PROMPT},
                                          {"role": "assistant", "content": POEM_TEXT}],
     "meta": {"source_id": POEM_ID, "prompt_kind": KIND, "facts": {what PROMPT states}}}

so SFT learns to write poems from the same master data that pretraining reads. A prompt states
only facts that are true of its record; a fact that cannot be established is not used:

- genre (`genre`): 诗 / 词 / 曲 from `meta.form` (shi / ci / qu), 诗歌 otherwise.
- title (`title`, with `part`): `meta.title` as the record holds it, 《帝京篇十首·其一》 when the
  record has `meta.part`. Not for ci, whose title is its tune.
- 词牌 (`cipai`): the title of a ci (`meta.form == "ci"`), as the record holds it.
- author (`author`): `meta.author`, unless it is missing or 佚名 (and the other unknown names).
- dynasty (`dynasty`): the name `DYNASTY_NAMES` gives `meta.dynasty` (tang → 唐), said "唐代";
  an unknown code is not named.
- form (`form`), shi only, from the clauses: the text is split at ，。？！；、： (and at line
  ends and their ASCII twins) and each clause's Han characters are counted. All clauses of 5
  → 五言, all of 7 → 七言; then 4 clauses → 绝句, 8 → 律诗, an even number above 8 → 排律, any
  other number → 诗 (五言诗, 七言诗). Mixed lengths, or uniform lengths other than 5 and 7,
  name no form: the poem is a 诗 and the genre says so. These are shapes; tones and rhymes
  are not checked, so 七言律诗 means "eight clauses of seven characters".
- imagery (`imagery`): 1 to 3 words of the lexicon in `imagery.py`, spelled as in the poem,
  the most distinctive by TF-IDF over the whole input (counted in `prepare`).

Prompt kinds and their phrasings: `TEMPLATES` (docs/chat.md has the counts on the whole corpus).
A phrasing is usable when the poem has every fact it names. Prompt k of a poem is chosen by
`unit_interval(seed, …k…, poem id)`: first a kind not used yet by this poem (any kind once all
are used), then one of its unused phrasings; prompts are distinct, and a poem with fewer usable
phrasings than asked yields fewer records.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from fuelline.chat.imagery import ImageryStats, count_imagery, distinctive_imagery, lexicon_fingerprint
from fuelline.clean.poetry import CLAUSE_SPLIT, DYNASTY_NAMES, UNKNOWN_AUTHOR_FORMS
from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.readers import iter_file_records
from fuelline.pipeline.options import option
from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage, StageConfig
from fuelline.records import Location, chat, unit_interval
from fuelline.text import han_count

GENRES = {"shi": "诗", "ci": "词", "qu": "曲"}
OTHER_GENRE = "诗歌"
METERS = {5: "五言", 7: "七言"}
IMAGERY_FILE = "imagery_doc_freq.json"
DROP_REASON = "not_a_poetry_document"

TEMPLATES: dict[str, tuple[str, ...]] = {
    "title": ("以《{title}》为题，写一首{genre}。", "请写一首题为《{title}》的{genre}。",
              "题目：《{title}》。请据此作{genre}一首。", "请为《{title}》这个题目写一首{genre}。"),
    "author": ("模仿{author}的风格，写一首{genre}。", "请用{author}的口吻写一首{genre}。",
               "请以{dynasty}{author}的笔法，创作一首{genre}。", "假如你是{dynasty}的{author}，请写一首{genre}。"),
    "form": ("写一首{form}。", "请创作一首{form}。", "作{form}一首。", "请写一首{dynasty}风格的{form}。"),
    "cipai": ("以《{cipai}》为词牌，填一首{genre}。", "请按词牌《{cipai}》填{genre}一首。",
              "调寄《{cipai}》，写一首{genre}。", "请填一首{dynasty}风格的《{cipai}》。"),
    "imagery": ("以{imagery}为意象，写一首{genre}。", "请写一首{genre}，要用到{imagery}的意象。",
                "围绕{imagery}这样的意象，创作一首{genre}。", "请用上{imagery}，写一首{genre}。"),
    "title_author": ("以《{title}》为题，模仿{author}的风格写一首{genre}。",
                     "请以{author}的口吻，写一首题为《{title}》的{genre}。",
                     "{author}有一首{genre}，题为《{title}》，请写出全文。", "请写出{dynasty}{author}的《{title}》。"),
    "author_form": ("模仿{author}的风格，写一首{form}。", "请以{dynasty}{author}的笔法，创作一首{form}。",
                    "仿{author}，以《{cipai}》为词牌填一首{genre}。", "请用{author}的风格填一首《{cipai}》。"),
    "imagery_form": ("写一首{form}，以{imagery}为意象。", "请创作一首{form}，诗中要写到{imagery}。",
                     "以《{cipai}》为词牌填一首{genre}，词中要写到{imagery}。", "请填一首《{cipai}》，用上{imagery}的意象。"),
}
KINDS = tuple(TEMPLATES)


@functools.lru_cache(maxsize=None)
def placeholders(template: str) -> frozenset[str]:
    return frozenset(name for _, name, _, _ in string.Formatter().parse(template) if name)


@dataclass
class ChatFromPoetryConfig(StageConfig):
    prompts_per_poem: int = option(2, "chat records per poem (fewer when a poem has too few facts)", min=1)
    seed: int = option(0, "seed of the prompt choices (the same seed gives the same records)")


def shi_form(text: str) -> str | None:
    """五言绝句, 七言律诗, 五言排律, 七言诗, … from the clause lengths, or None (see the module doc)."""
    lengths = [n for n in (han_count(clause) for clause in CLAUSE_SPLIT.split(text)) if n]
    if not lengths or len(set(lengths)) != 1 or lengths[0] not in METERS:
        return None
    count = len(lengths)
    shape = {4: "绝句", 8: "律诗"}.get(count) or ("排律" if count > 8 and count % 2 == 0 else "诗")
    return METERS[lengths[0]] + shape


def chinese_number(n: int) -> str:
    """一 … 九百九十九 (十二, 二十, 一百零五, 一百一十); other numbers in Arabic digits."""
    digits = "零一二三四五六七八九"
    if not 0 < n < 1000:
        return str(n)
    hundreds, tens, ones = n // 100, n // 10 % 10, n % 10
    text = digits[hundreds] + "百" if hundreds else ""
    if tens:
        text += ("" if tens == 1 and not hundreds else digits[tens]) + "十"
    elif hundreds and ones:
        text += "零"
    return text + (digits[ones] if ones else "")


def _string(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def document_problem(record: Any) -> str | None:
    """Why `record` is not a cleaned poetry document, or None."""
    if not isinstance(record, dict):
        return f"expected an object, found {type(record).__name__}"
    for key, kind in (("id", str), ("text", str), ("meta", dict)):
        if not isinstance(record.get(key), kind):
            return f"missing {kind.__name__} {key!r}" if key not in record else \
                f"{key!r} must be a {kind.__name__}, found {type(record[key]).__name__}"
    if not record["text"].strip():
        return "'text' is empty"
    return None


def poem_facts(record: dict, imagery: list[str]) -> dict[str, Any]:
    """Every fact a prompt may state about `record` (a valid poetry document)."""
    meta, form = record["meta"], record["meta"].get("form")
    facts: dict[str, Any] = {"genre": GENRES.get(form, OTHER_GENRE)}
    title, author = _string(meta.get("title")), _string(meta.get("author"))
    if title and form == "ci":
        facts["cipai"] = title
    elif title:
        facts["title"] = title
        if isinstance(meta.get("part"), int) and not isinstance(meta["part"], bool):
            facts["part"] = meta["part"]
    if author and author not in UNKNOWN_AUTHOR_FORMS:
        facts["author"] = author
    if isinstance(meta.get("dynasty"), str) and meta["dynasty"] in DYNASTY_NAMES:
        facts["dynasty"] = DYNASTY_NAMES[meta["dynasty"]]
    if form == "shi" and (shape := shi_form(record["text"])):
        facts["form"] = shape
    if imagery:
        facts["imagery"] = imagery
    return facts


def _display(facts: dict[str, Any]) -> dict[str, str]:
    """The strings the placeholders of a template are replaced with."""
    shown = {k: v for k, v in facts.items() if isinstance(v, str)}
    if "title" in facts and "part" in facts:
        shown["title"] = f"{facts['title']}·其{chinese_number(facts['part'])}"
    if "dynasty" in facts:
        shown["dynasty"] = facts["dynasty"] + ("代" if len(facts["dynasty"]) == 1 else "")
    if "imagery" in facts:
        shown["imagery"] = "、".join(facts["imagery"])
    return shown


def choose_prompts(facts: dict[str, Any], count: int, seed: int, key: str) -> list[tuple[str, str, dict]]:
    """Up to `count` distinct (kind, prompt, stated facts), chosen by hash of (seed, key, k)."""
    usable = {kind: [t for t in TEMPLATES[kind] if placeholders(t) <= facts.keys()] for kind in KINDS}
    shown = _display(facts)
    chosen: list[tuple[str, str, dict]] = []
    used_kinds: set[str] = set()
    attempt = 0
    while len(chosen) < count and any(usable.values()):
        kinds = [kind for kind in KINDS if usable[kind]]
        kinds = [k for k in kinds if k not in used_kinds] or kinds
        kind = kinds[int(unit_interval(seed, f"kind:{attempt}", key) * len(kinds))]
        template = usable[kind].pop(int(unit_interval(seed, f"template:{attempt}", key) * len(usable[kind])))
        attempt += 1
        prompt = template.format(**shown)
        if any(prompt == p for _, p, _ in chosen):
            continue
        stated = {name: facts[name] for name in sorted(placeholders(template))}
        if "title" in stated and "part" in facts:
            stated["part"] = facts["part"]
        chosen.append((kind, prompt, stated))
        used_kinds.add(kind)
    return chosen


def count_shard_imagery(shard: InputShard) -> ImageryStats:
    """Document frequency of the imagery lexicon over one input shard's poetry documents."""
    records = iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip")
    return count_imagery(record["text"] for _, record in records if document_problem(record) is None)


class ChatFromPoetryStage(Stage):
    name = "chat-from-poetry"
    description = "Turn cleaned poems into chat records: prompts from title, author, dynasty, form and imagery."
    Config = ChatFromPoetryConfig

    def __init__(self, config: ChatFromPoetryConfig | None = None):
        super().__init__(config)
        self.imagery_stats: ImageryStats | None = None

    def prepare(self, ctx: PrepareContext) -> None:
        """Count each imagery entry's document frequency over the whole input, once per output."""
        path = ctx.workdir / IMAGERY_FILE
        if path.exists():
            saved = orjson.loads(path.read_bytes())
            if saved.get("lexicon") == lexicon_fingerprint():
                self.imagery_stats = ImageryStats.from_json(saved)
                return
        parts = ctx.map(count_shard_imagery, ctx.shards, f"{self.name}: imagery")
        self.imagery_stats = functools.reduce(ImageryStats.merge, parts, ImageryStats())
        write_bytes_atomic(path, orjson.dumps(self.imagery_stats.to_json(), option=orjson.OPT_INDENT_2) + b"\n")

    def summary(self, workdir: Path, stats: dict[str, Any]) -> dict[str, Any]:
        """The imagery counts behind the choices: poems counted, the ten most frequent entries."""
        path = workdir / IMAGERY_FILE
        if not path.exists():
            return {}
        saved = orjson.loads(path.read_bytes())
        frequent = sorted(saved["doc_freq"].items(), key=lambda item: (-item[1], item[0]))[:10]
        return {"imagery": {"documents": saved["documents"], "most_frequent": dict(frequent)}}

    def chats_for(self, record: dict) -> list[dict]:
        """The chat records of one poetry document (see the module doc)."""
        if self.imagery_stats is None:
            raise RuntimeError(f"{self.name}: no imagery statistics; run prepare() (run_stage does) "
                               "or set imagery_stats = count_imagery(texts) first")
        seed, poem_id = self.config.seed, record["id"]
        found = distinctive_imagery(record["text"], self.imagery_stats, limit=3)
        wanted = 1 + int(unit_interval(seed, "imagery", poem_id) * len(found)) if found else 0
        facts = poem_facts(record, found[:wanted])
        return [chat(f"{poem_id}#{k}", [{"role": "user", "content": prompt},
                                         {"role": "assistant", "content": record["text"]}],
                     {"source_id": poem_id, "prompt_kind": kind, "facts": stated})
                for k, (kind, prompt, stated) in enumerate(
                    choose_prompts(facts, self.config.prompts_per_poem, seed, poem_id))]

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        for location, record in records:
            problem = document_problem(record)
            if problem is not None:
                ctx.drop(record, DROP_REASON, location, problem)
                continue
            chats = self.chats_for(record)
            if not chats:
                ctx.count("poems_without_prompt")
            for made in chats:
                ctx.count(f"prompts_{made['meta']['prompt_kind']}")
                yield made
