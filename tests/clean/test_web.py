import random

import orjson

from fuelline.clean.stage import CleanConfig, CleanStage
from fuelline.clean.web import WebRules, clean_web_text
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.records import Drop
from fuelline.text import normalize_text, words

RULES = WebRules()
rng = random.Random(3)
VOCAB = ["the", "of", "and", "to", "with", "that", "have", "be", "river", "market", "winter", "letter", "garden",
         "station", "morning", "village", "teacher", "journey", "quietly", "evening"]
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


def run_clean(tmp_path, pages: dict[str, str], **config) -> tuple[dict[str, str], dict]:
    """Run the clean stage on `pages` (id → text); (id → text kept, run stats)."""
    source = tmp_path / "pages.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": i, "text": text}) + b"\n" for i, text in pages.items()))
    out = tmp_path / "".join(["out", *(f"-{k}={v}" for k, v in config.items())])
    stats = run_stage(CleanStage(CleanConfig(profile="web", **config)), source, out,
                      RunOptions(workers=2, shard_size=20, progress=False))
    return {d["id"]: d["text"] for d in read_records(out)}, stats


def test_web_profile_strips_boilerplate_by_default(tmp_path):
    footer = "© 2026 Example Media. All rights reserved."
    pages = {str(i): english_page() + "\n" + footer for i in range(60)}
    on, _ = run_clean(tmp_path, pages)
    off, _ = run_clean(tmp_path, pages, boilerplate=False)
    assert len(on) == len(off) == 60
    assert all(footer in text for text in off.values())  # the C4 line rules alone keep it: it ends in "."
    assert not any(footer in text for text in on.values())
    assert {doc_id: text + "\n" + footer for doc_id, text in on.items()} == off


EN_SENTENCES = [
    "The tokenizer splits every document into pieces before the model sees it.",
    "We trained the small model on a single machine over the long weekend.",
    "Most of the errors came from pages that had been converted twice.",
    "After the upgrade, the cluster finished the same job in half the time.",
    "Please read the installation guide before you open an issue.",
    "Our team spent a month cleaning the data and it paid off.",
    "The benchmark numbers below were measured with the default settings.",
    "You can download the checkpoints and the evaluation scripts from the release page.",
    "This chapter explains how the attention layers share their memory.",
    "In practice, a larger batch only helps when the learning rate is tuned.",
    "The translation keeps the meaning of the original text as closely as possible.",
    "Several readers asked why the second experiment was left out of the paper.",
    "Long documents are split at paragraph boundaries to keep each piece readable.",
    "Thanks to everyone who reported bugs and sent patches this year.",
    "The old parser was slow, so we rewrote it with a streaming design.",
    "Each section ends with a short summary and a list of further reading.",
]
ZH_SENTENCES = [
    "分词器会在模型读取之前把每篇文档切成小片段。",
    "我们在周末用一台机器训练了这个小模型。",
    "大部分错误都来自被重复转换过两次的网页。",
    "升级之后，集群用一半的时间就完成了同样的任务。",
    "提交问题之前，请先阅读安装指南。",
    "团队花了一个月清洗数据，结果证明非常值得。",
    "下面的测试结果都是在默认设置下得到的。",
    "模型权重和评测脚本都可以在发布页面下载。",
    "这一章介绍注意力层如何共享显存。",
    "实际上，只有调好学习率，更大的批次才有帮助。",
    "译文尽可能贴近原文的意思，同时保持通顺。",
    "有几位读者问，为什么论文里没有第二个实验。",
    "长文档会在段落边界处切开，让每一段都容易阅读。",
    "感谢今年所有报告问题和提交补丁的朋友。",
    "旧的解析器太慢，所以我们改成了流式设计。",
    "每一节最后都有简短的总结和延伸阅读。",
]
HEADER = "欢迎访问 Example 技术博客 | Welcome to the Example tech blog!"
FOOTER = "Copyright © 2026 Example Corp. 版权所有。"
SHORT_WORDS = ("So we go up to it and do as we can.\nHe is at the bus and I am in my car.\n"  # mean length < 3
               "It was a big day for me and for all of us.\nIf you see an ox, do not go near it.\n"
               "We sat by the sea and ate a fig or two.\nIs it new or old? No one can say yet.\n"
               "Go on, try it out, it is fun to do so now.")


def test_mixed_chinese_english_pages_are_kept_and_lose_their_template_lines(tmp_path):
    mixed_rng = random.Random(16)
    bodies = {}
    for i in range(8):  # each line of English followed by a line of Chinese
        pairs = zip(mixed_rng.sample(EN_SENTENCES, 3), mixed_rng.sample(ZH_SENTENCES, 3))
        bodies[f"mixed{i}"] = "\n".join(line for pair in pairs for line in pair)
    pages = {doc_id: f"{HEADER}\n{body}\n{FOOTER}" for doc_id, body in bodies.items()}
    pages["chinese"] = chinese = chinese_page()
    pages["short_words"] = SHORT_WORDS

    kept, stats = run_clean(tmp_path, pages)
    assert stats["dropped"] == {"mean_word_length": 1}
    assert kept == {doc_id: normalize_text(text) for doc_id, text in {**bodies, "chinese": chinese}.items()}
    without_boilerplate, _ = run_clean(tmp_path, pages, boilerplate=False)  # the C4 line rules kept them
    assert without_boilerplate == {doc_id: normalize_text(text) for doc_id, text in pages.items()
                                   if doc_id != "short_words"}


def test_the_english_of_a_page_is_judged_when_it_is_a_fair_share_of_the_words():
    terms = ("我们使用 PyTorch 和 CUDA 在 GPU 上训练 Transformer 模型，并用 DeepSpeed 节省显存。\n"
             "首先安装 Python 3.11，然后通过 pip 安装依赖，再用 nvidia-smi 检查 GPU 状态。\n"
             "如果显存不够，可以减小 batch size 或者开启 gradient checkpointing。\n"
             "在 Linux 服务器上，我们推荐用 conda 或 venv 管理虚拟环境。")  # ~20% spaced words, no stop words
    assert clean_web_text(terms, RULES)[0] == normalize_text(terms)
    spam = "\n".join(  # English without stop words, in turn with Chinese
        line for pair in zip(["Cheap watches, luxury bags, designer shoes, discount prices, huge savings, order today.",
                              "Free shipping worldwide, secure payment, fast delivery, easy returns, guaranteed quality.",
                              "Best deals online: watches, bags, shoes, jackets, sunglasses, perfume, jewelry, belts!"],
                             ZH_SENTENCES) for line in pair)
    assert clean_web_text(spam, RULES)[0] == Drop("stop_words")
