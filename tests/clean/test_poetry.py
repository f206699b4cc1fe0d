import re

import orjson
import pytest

from fuelline.clean.poetry import UNKNOWN_AUTHOR, chinese_numeral, clean_poem, normalize_author, split_title
from fuelline.clean.stage import CleanConfig, CleanStage
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.records import Drop

from ..conftest import shared_file

SHI = ["秦川雄帝宅，函谷壯皇居。", "綺殿千尋起，離宮百雉餘。"]


def poem(**fields):
    return {"title": "帝京篇", "author": "李世民", "paragraphs": SHI, "source": "quantangshi", "dynasty": "tang", **fields}


@pytest.mark.parametrize("title, expected", [
    ("帝京篇十首 一", ("帝京篇十首", 1)), ("菩萨蛮 其二", ("菩萨蛮", 2)), ("雜詩 其十二", ("雜詩", 12)),
    ("其二十", ("", 20)), ("春曉", ("春曉", None)), ("十一", ("十一", None)),
])
def test_part_numbers_move_from_title_to_meta(title, expected):
    assert split_title(title) == expected


def test_chinese_numerals():
    assert [chinese_numeral(t) for t in ["一", "十", "十二", "二十", "九十九", "一百二十三", "甲"]] == [
        1, 10, 12, 20, 99, 123, None]


@pytest.mark.parametrize("raw, expected", [
    ("（唐）孟浩然", "孟浩然"), ("(宋)蘇軾", "蘇軾"), ("不詳", UNKNOWN_AUTHOR), ("无名氏", UNKNOWN_AUTHOR),
    ("佚名", UNKNOWN_AUTHOR), (None, UNKNOWN_AUTHOR), ("李白", "李白"),
])
def test_authors_are_normalized(raw, expected):
    assert normalize_author(raw) == expected


def test_variant_notes_and_footnotes_are_removed_from_text():
    doc, notes = clean_poem(poem(paragraphs=["秦川雄帝宅（一作「宮」），函谷壯皇居。", "綺殿千尋起，離宮百雉餘。",
                                             "〖1〗按：此詩見《文苑英華》。"]))
    assert doc["text"] == "秦川雄帝宅，函谷壯皇居。\n綺殿千尋起，離宮百雉餘。"
    assert notes == 2


@pytest.mark.parametrize("paragraphs, reason", [
    (["秦川雄帝□，函谷壯皇居。"], "missing_character"),
    (["秦川雄帝○，函谷壯皇居。"], "placeholder_circle"),
    (["秦川雄{𥫗/戢}宅，函谷壯皇居。"], "composed_character"),
    (["秦川雄帝\ue000，函谷壯皇居。"], "private_use_character"),
    ([], "empty_poem"), (["", "。"], "empty_poem"),
    (["秦川雄帝宅函谷壯皇居綺殿，千尋起。"], "shi_clause_length"),
    (["秦川雄帝宅。"], "shi_too_few_clauses"),
])
def test_dirt_and_form_rules_name_their_reason(paragraphs, reason):
    result, _ = clean_poem(poem(paragraphs=paragraphs))
    assert isinstance(result, Drop) and result.reason == reason


def test_ci_is_not_judged_by_the_shi_rule():
    ci = ["近清明。", "翠禽枝上消魂。", "可惜一片清歌，都付与黄昏。"]  # clauses of 3, 6, 6, 5 characters
    doc, _ = clean_poem(poem(paragraphs=ci, source="songci_300"))
    assert doc["meta"]["form"] == "ci"
    shi, _ = clean_poem(poem(paragraphs=ci))
    assert shi == Drop("shi_clause_length")


@pytest.mark.parametrize("record, detail", [
    ({"title": "x", "source": "quantangshi"}, "missing 'paragraphs'"),
    ({"paragraphs": "秦川雄帝宅", "source": "quantangshi"}, "'paragraphs' must be a list of strings"),
    ({"paragraphs": SHI, "author": 3}, "'author' must be a string, found int"),
])
def test_malformed_records_are_dropped_with_detail(record, detail):
    result, _ = clean_poem(record)
    assert result == Drop("malformed_record", detail)


def test_bad_records_never_stop_a_skip_run_and_are_reported_with_file_and_line(tmp_path):
    source = tmp_path / "poems.jsonl"
    good = orjson.dumps(poem())
    source.write_bytes(b"\n".join([
        good, b'{"title": "no lines", "source": "quantangshi"}', good, b'{"paragraphs": 5}',
        b'{"title": "\xff\xfe invalid utf-8", "paragraphs": []}', b"{truncated", good,
    ]) + b"\n")
    stats = run_stage(CleanStage(), source, tmp_path / "out", RunOptions(workers=1, on_error="skip", progress=False))
    assert stats["records_in"] == 7 and stats["records_out"] == 3
    assert stats["dropped"] == {"malformed_record": 2, "malformed_json": 1, "invalid_utf8": 1}
    rejects = {r["line"]: r for r in read_records(tmp_path / "out" / "_rejects")}
    assert sorted(rejects) == [2, 4, 5, 6]
    assert rejects[2]["detail"] == "missing 'paragraphs'" and rejects[2]["source"] == str(source)
    assert "utf-8" in rejects[5]["detail"].lower()
    ids = [d["id"] for d in read_records(tmp_path / "out")]
    assert len(set(ids)) == 3  # no upstream id: a stable id from file name and line


def test_traditional_to_simplified_conversion_is_applied_to_text_and_metadata(tmp_path):
    source = tmp_path / "p.jsonl"
    source.write_bytes(orjson.dumps(poem(title="帝京篇 其一")) + b"\n")
    run_stage(CleanStage(CleanConfig(convert="t2s")), source, tmp_path / "out", RunOptions(workers=1, progress=False))
    (doc,) = read_records(tmp_path / "out")
    assert doc["text"] == "秦川雄帝宅，函谷壮皇居。\n绮殿千寻起，离宫百雉余。"
    assert (doc["meta"]["title"], doc["meta"]["part"]) == ("帝京篇", 1)


@pytest.mark.slow
def test_full_real_corpus(tmp_path):
    source = shared_file("chinese-poetry.jsonl.zst")
    stats = run_stage(CleanStage(), source, tmp_path / "out", RunOptions(workers=2, progress=False))
    assert stats["records_in"] == 398_631
    assert stats["records_in"] == stats["records_out"] + sum(stats["dropped"].values())
    assert stats["dropped"]["missing_character"] >= 5_000  # the corpus README counts 5,272 texts with □
    numbered = re.compile(r"其[一二三四五六七八九十百]+$|\s[一二三四五六七八九十百]+$")
    forms = {"ci": 0, "qu": 0}
    for doc in read_records(tmp_path / "out"):
        assert "□" not in doc["text"]
        assert not numbered.search(doc["meta"]["title"]), doc["meta"]["title"]
        if doc["meta"]["form"] in forms:
            forms[doc["meta"]["form"]] += 1
    # ci: 21,053 + 280 + 498 + 45 + 258 raw records; qu: 11,057. Most must survive their own rules.
    assert forms["ci"] >= 0.9 * 22_134 and forms["qu"] >= 0.9 * 11_057
    assert stats["counters"]["kept_ci"] == forms["ci"]
