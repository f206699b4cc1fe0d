import random

from fuelline.clean.text import normalize_text, words
from fuelline.clean.web import WebRules, clean_web_text
from fuelline.pipeline.stage import Drop

RULES = WebRules()
rng = random.Random(3)
VOCAB = ("the of and to with that have be river market winter letter garden station morning "
         "village teacher journey quietly evening").split()
HAN = "山水风月花雪云雨春秋江湖天地日夜人心明清长远归来城市学校工作生活"


def english_page(lines=8):
    return "\n".join(" ".join(rng.choice(VOCAB) for _ in range(12)).capitalize() + "." for _ in range(lines))


def chinese_page(lines=8):
    return "\n".join("".join(rng.choice(HAN) for _ in range(18)) + "。" for _ in range(lines))


def test_words_count_cjk_characters_one_by_one():
    assert words("江南好，风景旧曾谙 and more") == list("江南好，风景旧曾谙") + ["and", "more"]


def test_normalize_text_folds_width_removes_controls_and_collapses_space():
    assert normalize_text("Ｈｅｌｌｏ\u200b  world\x07\r\n\n\n\n  next\tline ") == "Hello world\n\nnext line"


def test_ordinary_pages_in_both_scripts_are_kept():
    for page in (english_page(), chinese_page()):
        text, removed = clean_web_text(page, RULES)
        assert text == page and removed == 0


def test_c4_line_rules_remove_menu_and_script_lines():
    body = english_page()
    text, removed = clean_web_text(body + "\nMenu\nPlease enable JavaScript to view this page.", RULES)
    assert (text, removed) == (body, 2)


def test_document_rules_name_their_reason():
    repeated = "\n".join(["Buy cheap watches with the best price and the fastest delivery today."] * 8)
    assert clean_web_text(repeated, RULES)[0] == Drop("duplicate_lines")
    assert clean_web_text("Short page.\nOnly two lines.", RULES)[0] == Drop("char_count")
    assert clean_web_text(english_page() + "\nLorem ipsum dolor sit amet.", RULES)[0] == Drop("lorem_ipsum")
    no_stop_words = "\n".join(" ".join(rng.choice(["river", "market", "winter", "letter"]) for _ in range(12)) + "."
                              for _ in range(7))
    assert clean_web_text(no_stop_words, RULES)[0] == Drop("stop_words")


def test_web_profile_strips_boilerplate_by_default(tmp_path):
    import orjson

    from fuelline.clean.stage import CleanConfig, CleanStage
    from fuelline.io import read_records
    from fuelline.pipeline.executor import RunOptions, run_stage

    footer = "© 2026 Example Media. All rights reserved."
    source = tmp_path / "pages.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": str(i), "text": english_page() + "\n" + footer}) + b"\n"
                                for i in range(60)))
    options = RunOptions(workers=2, shard_size=20, progress=False)
    run_stage(CleanStage(CleanConfig(profile="web")), source, tmp_path / "on", options)
    run_stage(CleanStage(CleanConfig(profile="web", boilerplate=False)), source, tmp_path / "off", options)
    on, off = list(read_records(tmp_path / "on")), list(read_records(tmp_path / "off"))
    assert len(on) == len(off) == 60
    assert all(footer in d["text"] for d in off)  # the C4 line rules alone keep it: it ends in "."
    assert not any(footer in d["text"] for d in on)
    assert [d["text"] + "\n" + footer for d in on] == [d["text"] for d in off]
