"""`fuelline demo`: a small, deterministic, messy corpus and the pipeline run over it.

The corpus mixes the formats a real one arrives in (JSONL.gz, a JSON array, Parquet) and the
dirt the pipeline must survive: exact and near duplicates, boilerplate lines, blank and
malformed lines, empty texts. It is generated from a fixed seed, so every run shows the same
numbers.
"""

from __future__ import annotations

import gzip
import random
import tempfile
from pathlib import Path
from typing import Callable

import orjson

from fuelline.io.atomic import atomic_write

DEMO_PIPELINE = """\
# The demo pipeline: every stage fuelline has so far.
[defaults]
on_error = "skip"      # malformed lines are counted and kept in _rejects/, not fatal
shard_size = 500

[[stage]]
use = "ingest"
text_key = "text"
min_chars = 20
"""

WORDS = ("river mountain lantern harbor winter orchard silver meadow thunder quiet window bridge "
         "candle market garden forest letter morning shadow valley").split()
HAN = "山水风月花雪云雨春秋江湖天地日夜人心明清长远归来"
BOILERPLATE = ["Home | News | About | Contact", "© 2026 Example Press. All rights reserved.", "首页 | 新闻 | 关于我们"]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."


def _han_line(rng: random.Random) -> str:
    return "".join(rng.choice(HAN) for _ in range(rng.choice((5, 7)))) + rng.choice("，。")


def _article(rng: random.Random) -> str:
    body = [" ".join(_sentence(rng) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(2, 6))]
    return "\n".join([BOILERPLATE[0], *body, BOILERPLATE[1]])


def _near_copy(text: str, rng: random.Random) -> str:
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = rng.choice(WORDS)
    return " ".join(words)


def generate_corpus(directory: Path, seed: int = 0, articles: int = 1200, poems: int = 400) -> list[Path]:
    """Write the demo corpus into `directory`; return its files."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    news = [{"id": f"news-{i}", "text": _article(rng), "url": f"https://example.org/{i}"} for i in range(articles)]
    news += [dict(doc, id=f"{doc['id']}-copy") for doc in rng.sample(news, articles // 10)]
    news += [dict(doc, id=f"{doc['id']}-near", text=_near_copy(doc["text"], rng)) for doc in rng.sample(news, articles // 10)]
    news += [{"id": "news-empty", "text": "   "}, {"id": "news-short", "text": "Too short."}]
    rng.shuffle(news)
    lines = [orjson.dumps(doc) for doc in news]
    lines.insert(len(lines) // 2, b'{"id": "broken", "text": "an unterminated')
    lines.insert(len(lines) // 3, b"")
    news_path = directory / "news.jsonl.gz"
    with atomic_write(news_path) as f:
        f.write(gzip.compress(b"\n".join(lines) + b"\n", mtime=0))

    poem_records = [{"title": f"无题 {i}", "text": "\n".join(_han_line(rng) for _ in range(4)), "author": "佚名"}
                    for i in range(poems)]
    poems_path = directory / "poems.json"
    with atomic_write(poems_path) as f:
        f.write(orjson.dumps(poem_records, option=orjson.OPT_INDENT_2))

    import pyarrow as pa
    import pyarrow.parquet as pq

    forum = [{"id": f"post-{i}", "text": "\n".join(_sentence(rng) for _ in range(rng.randint(1, 4))) + "\n" + BOILERPLATE[2],
              "board": rng.choice(["travel", "books", "food"])} for i in range(articles // 2)]
    forum_path = directory / "forum.parquet"
    with atomic_write(forum_path) as f:
        pq.write_table(pa.Table.from_pylist(forum), f)
    return [news_path, poems_path, forum_path]


def run_demo(directory: str | None, *, workers: int | None = None,
             report: Callable[[list[dict]], None] = print) -> Path:
    """Generate the corpus and run the demo pipeline; return the run directory."""
    from fuelline.pipeline.config import load_pipeline, run_pipeline

    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="fuelline-demo-"))
    corpus = base / "corpus"
    files = generate_corpus(corpus)
    pipeline_file = base / "pipeline.toml"
    pipeline_file.write_text(DEMO_PIPELINE, encoding="utf-8")
    run_dir = base / "run"
    print(f"corpus: {', '.join(str(p) for p in files)}")
    print(f"pipeline: {pipeline_file}\nrun: {run_dir}\n")
    # The corpus was just rewritten, so an earlier demo run in the same place is redone.
    all_stats = run_pipeline(load_pipeline(pipeline_file), run_dir, input=[str(corpus)], workers=workers, restart=True)
    report(all_stats)
    last = sorted(p for p in run_dir.iterdir() if p.is_dir())[-1]
    print(f"\nread the result:\n  python -c \"from fuelline.io import read_records; "
          f"print(next(read_records('{last}')))\"")
    return run_dir
