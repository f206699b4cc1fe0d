import re
import unicodedata
from collections import Counter

import orjson
import pytest

from fuelline.chat.from_poetry import (IMAGERY_FILE, KINDS, TEMPLATES, ChatFromPoetryConfig, ChatFromPoetryStage,
                                       chinese_number, shi_form)
from fuelline.chat.imagery import LEXICON, THEMES, ImageryStats, count_imagery, distinctive_imagery, find_imagery
from fuelline.clean.poetry import chinese_numeral
from fuelline.io import read_records
from fuelline.clean.poetry import DYNASTY_NAMES
from fuelline.pipeline.executor import RunOptions, run_stage

GENRE = {"shi": "诗", "ci": "词", "qu": "曲"}


def doc(doc_id, lines, *, title="", author="佚名", dynasty="tang", form="shi", **meta):
    return {"id": doc_id, "text": "\n".join(lines),
            "meta": {"title": title, "author": author, "dynasty": dynasty, "source": "test", "form": form, **meta}}


JINGYESI = doc("jys", ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"], title="静夜思", author="李白")
JINGYESI_TRAD = doc("jys-t", ["床前明月光，疑是地上霜。", "舉頭望明月，低頭思故鄉。"], title="靜夜思", author="李白")
DENGGAO = doc("dg", ["风急天高猿啸哀，渚清沙白鸟飞回。", "无边落木萧萧下，不尽长江滚滚来。",
                     "万里悲秋常作客，百年多病独登台。", "艰难苦恨繁霜鬓，潦倒新停浊酒杯。"], title="登高", author="杜甫")
YUMEIREN = doc("ymr", ["春花秋月何时了，往事知多少。", "小楼昨夜又东风，故国不堪回首月明中。",
                       "雕栏玉砌应犹在，只是朱颜改。", "问君能有几多愁，恰似一江春水向东流。"],
               title="虞美人", author="李煜", dynasty="wudai", form="ci")
JIANGJINJIU = doc("jjj", ["君不见黄河之水天上来，奔流到海不复回。", "君不见高堂明镜悲白发，朝如青丝暮成雪。"],
                  title="将进酒", author="李白")
TIANJINGSHA = doc("tjs", ["枯藤老树昏鸦，小桥流水人家，古道西风瘦马。", "夕阳西下，断肠人在天涯。"],
                  title="天净沙・秋思", author="马致远", dynasty="yuan", form="qu")
HAND = [JINGYESI, JINGYESI_TRAD, DENGGAO, YUMEIREN, JIANGJINJIU, TIANJINGSHA]


def is_han(char):
    return unicodedata.name(char, "").startswith(("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH"))


def expected_form(text):
    """The clause rule, recomputed here from scratch."""
    lengths = [sum(map(is_han, c)) for c in re.split(r"[，。？！；、：,.?!;:\n]", text)]
    lengths = [n for n in lengths if n]
    if len(set(lengths)) != 1 or lengths[0] not in (5, 7):
        return None
    meter = "五言" if lengths[0] == 5 else "七言"
    n = len(lengths)
    return meter + ("绝句" if n == 4 else "律诗" if n == 8 else "排律" if n > 8 and n % 2 == 0 else "诗")


def fitted(records, **config):
    stage = ChatFromPoetryStage(ChatFromPoetryConfig(**config))
    stage.imagery_stats = count_imagery(r["text"] for r in records)
    return stage


def chats(stage, records):
    return [c for r in records for c in stage.chats_for(r)]


def check_facts(chat, record):
    """Every fact the prompt states is true of the record, and the prompt claims no form it lacks."""
    facts, prompt, meta = chat["meta"]["facts"], chat["conversations"][0]["content"], record["meta"]
    assert facts and chat["conversations"][1] == {"role": "assistant", "content": record["text"]}
    for name, value in facts.items():
        if name == "author":
            assert value == meta["author"] != "佚名" and value in prompt
        elif name == "dynasty":
            assert value == DYNASTY_NAMES[meta["dynasty"]] and value in prompt
        elif name == "title":
            assert value == meta["title"] and meta["form"] != "ci" and f"《{value}" in prompt
        elif name == "part":
            assert value == meta["part"] and f"其{chinese_number(value)}》" in prompt
        elif name == "cipai":
            assert value == meta["title"] and meta["form"] == "ci" and f"《{value}》" in prompt
        elif name == "genre":
            assert value == GENRE.get(meta["form"], "诗歌") and value in prompt
        elif name == "form":
            assert value == expected_form(record["text"]) and value in prompt
        elif name == "imagery":
            assert 1 <= len(value) <= 3 and all(w in record["text"] and w in prompt for w in value)
        else:
            pytest.fail(f"unexpected fact {name}")
    named = facts.get("title", "") + facts.get("cipai", "")
    for word in ("绝句", "律诗", "排律", "五言", "七言"):
        if word in prompt and word not in named:
            assert word in facts.get("form", ""), (word, prompt)


@pytest.mark.parametrize("record, form", [(JINGYESI, "五言绝句"), (JINGYESI_TRAD, "五言绝句"), (DENGGAO, "七言律诗"),
                                          (JIANGJINJIU, None)])
def test_form_follows_the_clauses_of_known_poems(record, form):
    assert shi_form(record["text"]) == form == expected_form(record["text"])
    stage = fitted(HAND, prompts_per_poem=99)
    stated = {c["meta"]["facts"].get("form") for c in stage.chats_for(record)} - {None}
    assert stated == ({form} if form else set())


@pytest.mark.parametrize("clauses, length, form", [(12, 5, "五言排律"), (10, 7, "七言排律"), (11, 5, "五言诗"),
                                                   (6, 7, "七言诗"), (2, 5, "五言诗"), (4, 4, None), (8, 6, None)])
def test_form_rule_on_clause_shapes(clauses, length, form):
    text = "\n".join("山" * length + ("，" if k % 2 == 0 else "。") for k in range(clauses))
    assert shi_form(text) == form == expected_form(text)


def test_ci_is_asked_for_by_its_cipai_and_qu_by_its_genre():
    stage = fitted(HAND, prompts_per_poem=99)
    ci = stage.chats_for(YUMEIREN)
    kinds = {c["meta"]["prompt_kind"] for c in ci}
    assert {"cipai", "author_form"} <= kinds and not kinds & {"title", "form", "title_author"}
    assert all(c["meta"]["facts"].get("cipai", "虞美人") == "虞美人" for c in ci)
    assert any("五代" in c["conversations"][0]["content"] for c in ci)
    qu = stage.chats_for(TIANJINGSHA)
    assert {c["meta"]["prompt_kind"] for c in qu} == {"title", "author", "imagery", "title_author"}
    for chat, record in [(c, YUMEIREN) for c in ci] + [(c, TIANJINGSHA) for c in qu]:
        check_facts(chat, record)


def test_facts_are_true_of_every_record_on_real_poems(poems):
    _, docs = poems
    stage = fitted(docs, prompts_per_poem=4)
    out = chats(stage, docs)
    by_id = {d["id"]: d for d in docs}
    for chat in out:
        check_facts(chat, by_id[chat["meta"]["source_id"]])
    kinds = Counter(c["meta"]["prompt_kind"] for c in out)
    assert set(kinds) == set(KINDS) - {"cipai"}  # the first 6,000 poems are Tang shi
    assert any("唐代" in c["conversations"][0]["content"] for c in out)


def test_imagery_prefers_the_longer_entry_and_keeps_the_poems_spelling():
    found = find_imagery(JINGYESI["text"])
    assert found["明月"].count == 2 and "月" not in found and found["故乡"].spelling == "故乡"
    assert find_imagery(JINGYESI_TRAD["text"])["故乡"].spelling == "故鄉"
    assert find_imagery("月落乌啼霜满天，明月楼")["月"].count == 1
    assert find_imagery("楊柳東風")["杨柳"].spelling == "楊柳"
    assert set(find_imagery("梅花落，菊花开，寒蝉鸣")) == {"梅花", "菊花", "寒蝉"}  # not also 梅, 菊, 蝉


def test_imagery_is_ranked_by_distinctiveness_with_deterministic_ties():
    common = ["月"] * 50 + ["孤舟"]
    stats = count_imagery(common + ["霜", "雁"])
    # 明月 is in no counted poem, 孤舟 and 霜 in one each (the longer word first), 月 in 50 of 53
    assert distinctive_imagery("明月照孤舟，月下霜。", stats) == ["明月", "孤舟", "霜"]
    assert distinctive_imagery("月下孤舟，月落，月明", stats) == ["孤舟", "月"]  # 3 x a low idf < 1 x a high one
    assert distinctive_imagery("霜雁", stats) == ["雁", "霜"]  # same df and count: code point order (雁 < 霜)
    assert distinctive_imagery("月月月月明月", ImageryStats(10), limit=3) == ["月"]  # 明月 contains 月: not both


def test_lexicon_is_large_grouped_and_unambiguous():
    assert len(LEXICON) >= 60 and len(THEMES) >= 6
    spellings = [s for e in LEXICON for s in e.spellings]
    assert len(spellings) == len(set(spellings))
    opencc = pytest.importorskip("opencc")
    s2t = opencc.OpenCC("s2t.json")
    missing = [e.word for e in LEXICON if s2t.convert(e.word) not in e.spellings and e.word != "征人"]
    assert not missing, f"traditional spelling not matched: {missing}"


def test_output_is_deterministic_and_the_seed_changes_it(poems):
    _, docs = poems
    docs = docs[:1500]
    first, again = chats(fitted(docs), docs), chats(fitted(docs), docs)
    assert first == again
    other = chats(fitted(docs, seed=1), docs)
    changed = sum(a["conversations"][0] != b["conversations"][0] for a, b in zip(first, other))
    assert changed > len(first) // 2
    kinds_changed = sum(a["meta"]["prompt_kind"] != b["meta"]["prompt_kind"] for a, b in zip(first, other))
    assert kinds_changed > len(first) // 4


def test_prompts_per_poem_are_distinct_and_numbered(poems):
    _, docs = poems
    docs = docs[:1000]
    out = chats(fitted(docs, prompts_per_poem=5), docs)
    per_poem: dict[str, list] = {}
    for chat in out:
        per_poem.setdefault(chat["meta"]["source_id"], []).append(chat)
    assert len(per_poem) == len(docs) and Counter(map(len, per_poem.values()))[5] > 800
    every = fitted(docs, prompts_per_poem=99)
    for record in docs:  # a poem short of 5 has no other prompt to give
        assert len(per_poem[record["id"]]) == min(5, len(every.chats_for(record)))
    for poem_id, group in per_poem.items():
        assert [c["id"] for c in group] == [f"{poem_id}#{k}" for k in range(len(group))]
        assert len({c["conversations"][0]["content"] for c in group}) == len(group)
        kinds = [c["meta"]["prompt_kind"] for c in group]
        assert len(set(kinds[:len(set(kinds))])) == len(set(kinds))  # every kind once before any repeats


def test_missing_facts_give_fewer_prompts_or_none():
    bare = doc("bare", ["君不见黄河之水天上来，奔流到海不复回。"], dynasty=None)
    title_only = doc("t", ["君不见黄河之水天上来，奔流到海不复回。"], title="无题", dynasty=None)
    stage = fitted([bare, title_only], prompts_per_poem=10)
    assert stage.chats_for(bare) == []
    only = stage.chats_for(title_only)
    assert len(only) == len(TEMPLATES["title"]) and {c["meta"]["prompt_kind"] for c in only} == {"title"}
    anonymous = stage.chats_for({**JINGYESI, "meta": {**JINGYESI["meta"], "author": "佚名"}})
    assert anonymous and all("author" not in c["meta"]["facts"] for c in anonymous)


def test_part_numbers_are_named_with_the_title():
    record = doc("p", JINGYESI["text"].split("\n"), title="杂诗", part=12)
    titled = [c for c in fitted([record], prompts_per_poem=99).chats_for(record) if "title" in c["meta"]["facts"]]
    assert titled and all("《杂诗·其十二》" in c["conversations"][0]["content"] for c in titled)
    assert all(chinese_numeral(chinese_number(n)) == n for n in range(1, 1000))


def test_chats_need_the_corpus_statistics():
    with pytest.raises(RuntimeError, match="prepare"):
        ChatFromPoetryStage().chats_for(JINGYESI)


def run(input_path, out, workers):
    return run_stage(ChatFromPoetryStage(ChatFromPoetryConfig(prompts_per_poem=2, seed=3)), [input_path], out,
                     RunOptions(workers=workers, shard_size=1_500, progress=False))


def test_stage_output_is_identical_for_one_and_two_workers(poems, tmp_path):
    path, docs = poems
    bad = [{"id": "no-meta", "text": "床前明月光"}, {"id": "x", "text": 3, "meta": {}}, {"text": "霜", "meta": {}}]
    bare = doc("bare", ["君不见黄河之水天上来，奔流到海不复回。"])  # a poem with nothing to ask for
    source = tmp_path / "in.jsonl"
    source.write_bytes(path.read_bytes() + b"".join(orjson.dumps(r) + b"\n" for r in [*bad, bare]))
    one, two = run(source, tmp_path / "one", 1), run(source, tmp_path / "two", 2)
    parts = sorted(p.name for p in (tmp_path / "one").glob("part-*"))
    assert len(parts) == 5
    assert all((tmp_path / "one" / p).read_bytes() == (tmp_path / "two" / p).read_bytes() for p in parts)
    assert one["records_in"] == len(docs) + 4 and one["dropped"] == {"not_a_poetry_document": 3}
    prompts = {k: v for k, v in one["counters"].items() if k.startswith("prompts_")}
    assert sum(prompts.values()) == one["records_out"] == 2 * len(docs)
    assert one["counters"]["poems_without_prompt"] == 1
    assert one["counters"] == two["counters"] and one["imagery"] == two["imagery"]
    saved = orjson.loads((tmp_path / "one" / "_prepare" / IMAGERY_FILE).read_bytes())
    assert saved["documents"] == one["imagery"]["documents"] == len(docs) + 1
    assert saved["doc_freq"]["月"] == sum("月" in find_imagery(d["text"]) for d in docs)
    expected = (tmp_path / "one" / "part-00001.jsonl.zst").read_bytes()
    (tmp_path / "one" / "_done" / "part-00001.json").unlink()  # as if the run stopped there
    assert run(source, tmp_path / "one", 1)["resumed_shards"] == 4
    assert (tmp_path / "one" / "part-00001.jsonl.zst").read_bytes() == expected  # redone, same bytes
    records = list(read_records(tmp_path / "one"))
    assert records == chats(fitted([*docs, bare], prompts_per_poem=2, seed=3), docs)
