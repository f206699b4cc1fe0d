"""`fuelline demo`: a small, deterministic, messy poetry corpus and the whole pipeline over it.

The corpus is shaped like the real chinese-poetry collection and carries its kinds of dirt:
exact and near duplicates, a boilerplate line at the end of many poems, missing-character
marks, placeholders, variant notes, numbered titles, dynasty-prefixed and unknown authors,
empty poems, a malformed line and a malformed record. It is generated from a fixed seed, so
every run shows the same funnel.
"""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path
from typing import Callable

import orjson
import zstandard

from fuelline.io.atomic import write_bytes_atomic

DEMO_PIPELINE = """\
# The demo pipeline: the poetry pipeline of configs/poetry.toml, with a vocabulary sized for
# a corpus of a few thousand poems.
[defaults]
on_error = "skip"

[[step]]
use = "clean"
profile = "poetry"
convert = "t2s"

[[step]]
use = "boilerplate"

[[step]]
use = "dedup"

[[step]]
use = "tokenizer"
vocab_size = 1024

[[step]]
use = "pack"
template = "poetry"
metadata_dropout = 0.25
val_fraction = 0.05

[[step]]
use = "report"
"""

HAN = ("山水风月花雪云雨春秋江湖天地日夜人心明清长远归来青白红绿高低东西南北千万"
       "一孤寒暖深浅新旧古今朝暮烟霞松竹梅柳舟桥楼台城野林泉石鸟雁马客君")
AUTHORS = ["李白", "杜甫", "王维", "（唐）孟浩然", "苏轼", "佚名", "不詳", "白居易", "李清照"]
BOILERPLATE = "诗词网 · 古诗文大全"


def _clause(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(HAN) for _ in range(length))


def _shi(rng: random.Random) -> list[str]:
    n = rng.choice((5, 7))
    return [f"{_clause(rng, n)}，{_clause(rng, n)}。" for _ in range(rng.choice((2, 4)))]


def _ci(rng: random.Random) -> list[str]:
    return [f"{_clause(rng, rng.randint(3, 7))}，{_clause(rng, rng.randint(4, 9))}。" for _ in range(rng.randint(3, 6))]


def _poem(rng: random.Random, i: int) -> dict:
    form = "quantangshi" if rng.random() < 0.6 else "quansongci"
    paragraphs = _shi(rng) if form == "quantangshi" else _ci(rng)
    title = _clause(rng, rng.randint(2, 4)) + (f" 其{'一二三'[i % 3]}" if rng.random() < 0.2 else "")
    if form == "quansongci" and rng.random() < 0.5:
        paragraphs.append(BOILERPLATE)  # a site's footer, at the end of half the ci
    return {"title": title, "author": rng.choice(AUTHORS), "paragraphs": paragraphs, "source": form,
            "dynasty": "tang" if form == "quantangshi" else "song", "id": f"demo-{i}"}


# The dirt put into a poem's first line: (where, characters replaced, mark); no mark: a variant
# note on a random character. A fifth kind, "empty", leaves the poem without lines.
DIRT = {"missing": (2, 1, "□"), "circle": (1, 1, "○"), "composed": (1, 1, "{𥫗/戢}"), "note": (3, 0, None)}


def _dirty(poem: dict, rng: random.Random) -> dict:
    kind = rng.choice([*DIRT, "empty"])
    if kind == "empty":
        return {**poem, "paragraphs": []}
    at, replaced, mark = DIRT[kind]
    first, *rest = poem["paragraphs"]
    mark = mark or f"（一作「{rng.choice(HAN)}」）"
    return {**poem, "paragraphs": [first[:at] + mark + first[at + replaced:], *rest]}


def generate_corpus(directory: Path, seed: int = 0, poems: int = 3000) -> tuple[Path, bool]:
    """Write the demo corpus (one JSONL.zst file) into `directory`; return its path and whether
    its bytes changed (a file already holding the same corpus is left as it is)."""
    rng = random.Random(seed)
    records = [_poem(rng, i) for i in range(poems)]
    records += [dict(rng.choice(records), id=f"copy-{i}") for i in range(poems // 10)]  # exact copies
    for i in range(poems // 20):  # near copies: one character changed
        original = rng.choice(records[:poems])
        lines = list(original["paragraphs"])
        lines[-1] = rng.choice(HAN) + lines[-1][1:]
        records.append({**original, "paragraphs": lines, "id": f"near-{i}"})
    records += [_dirty(rng.choice(records[:poems]), rng) | {"id": f"dirty-{i}"} for i in range(poems // 15)]
    rng.shuffle(records)
    lines = [orjson.dumps(r) for r in records]
    lines.insert(len(lines) // 2, b'{"title": "broken", "paragraphs": ["unterminated')  # a malformed line
    lines.insert(len(lines) // 3, orjson.dumps({"title": "no lines", "source": "quantangshi"}))  # a bad record
    path = directory / "poems.jsonl.zst"
    data = zstandard.ZstdCompressor(level=3).compress(b"\n".join(lines) + b"\n")
    if path.is_file() and path.read_bytes() == data:
        return path, False
    write_bytes_atomic(path, data)
    return path, True


def run_demo(directory: str | None, *, workers: int | None = None, progress: bool = True,
             report: Callable[[list[dict], Path], None] = lambda stats, run_dir: print(stats)) -> Path:
    """Generate the corpus and run the demo pipeline; return the run directory.

    `report(stats, run_dir)` shows the steps' stats (the CLI's summary lines)."""
    from fuelline.pipeline.config import load_pipeline, run_pipeline
    from fuelline.pipeline.workdir import StepOutputMismatch
    from fuelline.report.funnel import format_funnel, load_funnel

    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="fuelline-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    corpus, corpus_changed = generate_corpus(base / "corpus")
    pipeline_file = base / "pipeline.toml"
    pipeline_changed = not pipeline_file.is_file() or pipeline_file.read_text(encoding="utf-8") != DEMO_PIPELINE
    if pipeline_changed:
        write_bytes_atomic(pipeline_file, DEMO_PIPELINE.encode())
    run_dir = base / "run"
    print(f"corpus: {corpus}\npipeline: {pipeline_file}\nrun: {run_dir}\n")
    # The same corpus and pipeline as an earlier demo in the same place: its steps resume (a
    # finished run is found again at once); anything else is redone from the start.
    run = functools.partial(run_pipeline, load_pipeline(pipeline_file), run_dir, input=[str(corpus)], workers=workers,
                            progress=progress)
    try:
        all_stats = run(restart=corpus_changed or pipeline_changed)
    except StepOutputMismatch:  # an earlier demo of other options (another fuelline version): redo it
        all_stats = run(restart=True)
    report(all_stats, run_dir)
    print("\n" + format_funnel(load_funnel(run_dir)))
    packed = next(p for p in sorted(run_dir.iterdir()) if p.name.endswith("-pack"))
    print(f"\nload it for training (the loader needs torch: pip install -e \".[torch]\"):\n"
          f"  from fuelline.loader import TokenDataset, make_loader\n"
          f"  loader = make_loader(TokenDataset('{packed / 'train'}', seq_len=128), batch_size=8)\n"
          f"  batch = next(iter(loader))   # input_ids and labels (-100 on the metadata prefix)")
    return run_dir
