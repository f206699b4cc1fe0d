import random
import shutil
from collections import Counter

import orjson
import pytest

from fuelline.clean import boilerplate
from fuelline.clean.boilerplate import (BoilerplateConfig, BoilerplateStage, edge_width,
                                        explain_boilerplate, format_explanation, keyed_lines,
                                        short_text_score, template_similarity)
from fuelline.io import RecordError, read_records
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.pipeline.shards import plan_shards
from fuelline.pipeline.stage import PrepareContext

SEED = 20261130
DOCS, EMPTY_PAGES = 2000, 20
FREQUENT = {"en": ["market", "river"], "zh": ["城市", "河流"]}
EN_VOCAB = ("people city water time year day world school family story light road house music garden "
            "morning evening friend teacher winter summer village mountain forest harbor bridge train "
            "window paper letter doctor farmer painter bakery station island valley weather festival "
            "quiet bright early late small large old young warm cold green blue slow fast").split()
EN_GLUE = "the a of to and in with on for from near under after before".split()
ZH_CHARS = "我们他们今天明年学校家庭故事光路房子音乐花园早晚朋友老师冬夏村庄山林港口桥火车窗纸信医生农民画家面包站岛谷天气节日安静明亮早迟小大旧新暖冷绿蓝慢快"
POPULAR = {  # content repeated in ~3% of documents, mid-text: must survive
    "en": ["The market fell today.",
           "Traders at the river market said the morning was slow and the harbor bridge was quiet again."],
    "zh": ["城市的河流在春天变得很美。", "老师说城市里的河流和山林都是我们共同的家园，应该好好保护。"],
}
NAV = {"en": ["Home | News | Sports | Contact", "Home | World | Business | Tech | About", "Home » News » Local"],
       "zh": ["首页 | 新闻 | 体育 | 财经", "首页 > 新闻中心 > 国内", "首页 · 资讯 · 视频 · 关于我们"]}
LINKS = {"en": ["Contact us · Privacy Policy · Terms of Use", "About | Careers | Advertise | Privacy", "Back to top"],
         "zh": ["关于我们 | 联系我们 | 隐私政策", "返回顶部", "网站地图 · 免责声明 · 广告服务"]}
COPYRIGHT = {"en": ["© {year} Example Media. All rights reserved.", "Copyright © {year} Daily River Post",
                    "© {year} The Market Journal, all rights reserved"],
             "zh": ["版权所有 © {year} 某某网", "Copyright © {year} 城市日报 版权所有", "© {year} 河流新闻网 京ICP备{year}0101号"]}


def content_line(rng: random.Random, lang: str) -> str:
    if lang == "en":
        words = [rng.choice(EN_VOCAB if i % 2 else EN_GLUE) for i in range(rng.randint(8, 15))]
        if rng.random() < 0.6:
            words.insert(rng.randrange(len(words)), rng.choice(FREQUENT["en"]))
        return " ".join(words).capitalize() + "."
    chars = [rng.choice(ZH_CHARS) for _ in range(rng.randint(9, 18))]
    if rng.random() < 0.6:
        chars.insert(rng.randrange(len(chars)), rng.choice(FREQUENT["zh"]))
    return "".join(chars) + "。"


def make_document(rng: random.Random, lang: str) -> list[tuple[str, str]]:
    """(line, kind) pairs; kind is "injected", "popular" or "content"."""
    body = [(content_line(rng, lang), "content") for _ in range(rng.randint(6, 24))]
    for popular in POPULAR[lang]:
        if rng.random() < 0.03:
            body.insert(rng.randint(2, len(body) - 2), (popular, "popular"))
    year = rng.randint(2019, 2026)
    head = [(rng.choice(NAV[lang]), "injected")] if rng.random() < 0.8 else []
    foot = [(rng.choice(LINKS[lang]), "injected")] if rng.random() < 0.5 else []
    if rng.random() < 0.8:
        foot.append((rng.choice(COPYRIGHT[lang]).format(year=year), "injected"))
    return head + body + foot


def make_corpus(seed: int = SEED) -> dict[str, list[tuple[str, str]]]:
    rng = random.Random(seed)
    docs = {}
    for i in range(DOCS):
        docs[f"doc{i:05d}"] = make_document(rng, rng.choice(["en", "zh"]))
    for i in range(EMPTY_PAGES):  # a page with nothing but its template
        lang = rng.choice(["en", "zh"])
        docs[f"empty{i:03d}"] = [(NAV[lang][0], "injected"), (COPYRIGHT[lang][0].format(year=2026), "injected")]
    return docs


def write_jsonl(path, docs: dict[str, list[tuple[str, str]]]) -> None:
    path.write_bytes(b"".join(
        orjson.dumps({"id": doc_id, "text": "\n".join(line for line, _ in lines), "meta": {"n": len(lines)}}) + b"\n"
        for doc_id, lines in docs.items()))


def removed_flags(original: list[str], kept: list[str]) -> list[bool]:
    """For each original line, whether it is missing from `kept` (the stage only deletes lines)."""
    flags, j = [], 0
    for line in original:
        if j < len(kept) and kept[j] == line:
            flags.append(False)
            j += 1
        else:
            flags.append(True)
    assert j == len(kept), "the output is not the input with some lines deleted"
    return flags


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("boilerplate") / "web.jsonl"
    docs = make_corpus()
    write_jsonl(path, docs)
    return path, docs


@pytest.fixture(scope="module")
def stage_run(corpus, tmp_path_factory):
    path, _ = corpus
    out = tmp_path_factory.mktemp("boilerplate-run") / "out"
    stats = run_stage(BoilerplateStage(), [path], out, RunOptions(workers=2, shard_size=500, progress=False))
    return out, stats


def test_the_stage_removes_the_template_lines_and_keeps_frequent_content(corpus, stage_run):
    _, docs = corpus
    out, stats = stage_run
    outputs = {r["id"]: r for r in read_records(out)}
    occurrences = Counter()  # (injected?, removed?) over line occurrences
    removed_content = []
    for doc_id, lines in docs.items():
        kept = outputs[doc_id]["text"].split("\n") if doc_id in outputs else []
        for (line, kind), removed in zip(lines, removed_flags([line for line, _ in lines], kept)):
            occurrences[kind == "injected", removed] += 1
            if removed and kind != "injected":
                removed_content.append(line)
    precision = occurrences[True, True] / (occurrences[True, True] + occurrences[False, True])
    recall = occurrences[True, True] / (occurrences[True, True] + occurrences[True, False])
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)
    assert not [line for line in removed_content if any(w in line.lower() for ws in FREQUENT.values() for w in ws)]
    assert stats["records_in"] == len(docs)
    assert stats["dropped"] == {"empty_after_boilerplate": EMPTY_PAGES}
    assert stats["counters"]["lines_in"] == sum(len(lines) for lines in docs.values())
    assert stats["counters"]["boilerplate_lines_removed"] == occurrences[True, True] + occurrences[False, True]
    sample = next(r for r in outputs.values() if r["meta"].get("boilerplate_lines_removed"))
    assert sample["meta"]["n"] - sample["meta"]["boilerplate_lines_removed"] == len(sample["text"].split("\n"))


def test_a_resumed_run_reads_the_cached_counts_and_writes_the_same_bytes(corpus, stage_run, tmp_path, monkeypatch):
    path, _ = corpus
    out, first = stage_run
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "_done" / "part-00001.json").unlink()  # shard 1 must be redone, after prepare
    (again / "part-00001.jsonl.zst").unlink()

    def no_recount(*args, **kwargs):
        raise AssertionError("the line counts were recomputed instead of read from _prepare/")

    monkeypatch.setattr(boilerplate, "count_corpus", no_recount)
    second = run_stage(BoilerplateStage(), [path], again, RunOptions(workers=2, shard_size=500, progress=False))
    assert second["resumed_shards"] == first["shards"] - 1
    for part in sorted(out.glob("part-*")):
        assert (again / part.name).read_bytes() == part.read_bytes(), part.name
    assert {k: second[k] for k in ("records_out", "dropped", "counters")} == \
           {k: first[k] for k in ("records_out", "dropped", "counters")}


def test_spilling_to_disk_gives_the_same_counts_as_counting_in_memory(corpus, tmp_path, monkeypatch):
    _, docs = corpus
    texts = ["\n".join(line for line, _ in lines) for lines in list(docs.values())[:400]]
    config = BoilerplateConfig(min_doc_freq=3)
    source = tmp_path / "docs.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))

    def count(workdir, shard_size):
        ctx = PrepareContext([source], plan_shards([source], shard_size), workdir,
                             lambda fn, items, desc: list(map(fn, items)))
        return ctx, boilerplate.count_corpus(ctx, boilerplate.shard_texts, config)

    _, in_memory = count(tmp_path / "large", len(texts))  # one shard, one buffer, one merge
    # The stage's way at scale: 11 shards, each spilling many tables, merged per range of hash partitions.
    spills, real_spill = [], boilerplate.LineCounter._spill
    monkeypatch.setattr(boilerplate, "BUFFER_ENTRIES", 7)
    monkeypatch.setattr(boilerplate, "STAGED_ENTRIES", 5)
    monkeypatch.setattr(boilerplate.LineCounter, "_spill", lambda self: spills.append(1) or real_spill(self))
    merges, real_merge = [], boilerplate.merge_line_counts
    monkeypatch.setattr(boilerplate, "merge_line_counts", lambda task, **kw: merges.append(task) or real_merge(task, **kw))
    monkeypatch.setattr(boilerplate, "ROWS_PER_TASK", 200)
    ctx, spilled = count(tmp_path / "tasks", 37)
    assert len(ctx.shards) == 11 and len(spills) > 100 and len(merges) > 5
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == []  # the tasks' files are removed

    docs_per_line, edges_per_line = Counter(), Counter()
    for text in texts:  # the same counts, by brute force
        keyed = keyed_lines(text, config.max_line_chars)
        width = edge_width(len(keyed), config.edge_fraction)
        edge = {h for i, (_, _, h) in enumerate(keyed) if i < width or i >= len(keyed) - width}
        docs_per_line.update({h for _, _, h in keyed})
        edges_per_line.update(edge)
    expected = sorted(h for h, n in docs_per_line.items() if n >= config.min_doc_freq)
    for table in (in_memory, spilled):
        assert table.num_docs == len(texts)
        assert table.hashes.tolist() == expected
        assert table.doc_counts.tolist() == [docs_per_line[h] for h in expected]
        assert table.edge_counts.tolist() == [edges_per_line[h] for h in expected]


def test_explain_ranks_the_injected_lines_first(corpus):
    path, docs = corpus
    injected = {line for lines in docs.values() for line, kind in lines if kind == "injected"}
    normalized = {keyed_lines(line, 300)[0][1] for line in injected}
    rows = explain_boilerplate([path], top=len(normalized) + 4)
    head, tail = rows[:len(normalized)], rows[len(normalized):]
    assert {r["line"] for r in head} <= injected
    assert {keyed_lines(r["line"], 300)[0][1] for r in head} == normalized
    assert all(r["removed"] for r in head) and not any(r["removed"] for r in tail)
    assert {r["line"] for r in tail} == {line for lines in POPULAR.values() for line in lines}
    cfg = BoilerplateConfig()
    for r in rows:
        features = [r["doc_freq"], r["pos_consistency"], r["template_similarity"], r["short_text_score"]]
        assert all(0 <= f <= 1 for f in features)
        assert r["score"] == pytest.approx(sum(w * f for w, f in zip([cfg.alpha, cfg.beta, cfg.gamma, cfg.delta], features)))
        assert r["docs"] >= cfg.min_doc_freq
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)
    table = format_explanation(rows)
    assert len(table.splitlines()) == len(rows) + 2
    assert any(line.endswith("首页 | 新闻 | 体育 | 财经") for line in table.splitlines())


def test_lines_are_normalized_before_counting():
    keyed = keyed_lines("© 2025 Example  Media\n\n   © 2026 EXAMPLE Media \nＨｏｍｅ｜News\nhome|news", 300)
    assert [i for i, _, _ in keyed] == [0, 2, 3, 4]
    assert keyed[0][2] == keyed[1][2] and keyed[2][2] == keyed[3][2] and keyed[0][2] != keyed[2][2]
    assert keyed_lines("x" * 301, 300)[0][2] is None


@pytest.mark.parametrize("lines, width", [(1, 0), (2, 0), (3, 1), (10, 1), (20, 1), (21, 2), (60, 3), (100, 5)])
def test_edge_width(lines, width):
    assert edge_width(lines, 0.05) == width


def test_short_and_template_scores():
    assert short_text_score("首页", 16, 80) == 1
    assert short_text_score("城" * 40, 16, 80) == 0  # 80 columns
    assert 0 < short_text_score("x" * 40, 16, 80) < 1
    assert template_similarity("home | news | sports") == 1
    assert template_similarity("版权所有 © 0000 某某网") == 1
    assert template_similarity("the river runs to the sea near the market") == 0


def test_options_and_records_are_checked(tmp_path):
    with pytest.raises(ValueError, match="edge_fraction"):
        BoilerplateConfig(edge_fraction=0.7)
    with pytest.raises(ValueError, match="min_doc_freq"):
        BoilerplateConfig(min_doc_freq=1)
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"paragraphs": ["a"]}\n')
    with pytest.raises(RecordError, match=r"raw.jsonl:1: no string field \"text\""):
        explain_boilerplate([raw])
