"""The boilerplate stage: remove lines that a site stamps on many pages in template positions.

Navigation bars, footers, copyright notices and repeated headers are whole lines that recur,
verbatim or with another year, across documents. Each distinct line gets four features in [0, 1]:

    doc_freq             documents holding the line, on a log scale: 0 at `min_doc_freq`
                         documents, 1 from `saturation` of the corpus on (1%: 4,000 of 400k)
    pos_consistency      share of those documents in which it sits in the first or last
                         `edge_fraction` of the non-blank lines (see `edge_width`)
    template_similarity  separators and template words, see `template_similarity`
    short_text_score     1 up to `short_width` display columns, 0 from `long_width` on (a CJK
                         character is two columns, so a 7-character poem line is 14)

and is removed when alpha·doc_freq + beta·pos_consistency + gamma·template_similarity +
delta·short_text_score > threshold and at least `min_doc_freq` documents hold it. Lines are
counted whole, once per document, after normalization (`keyed_lines`), so a frequent word in
varied lines is never removed.

Counting in bounded memory, as tasks (how they run and what they measured: docs/boilerplate.md).
No line and no dict of distinct lines is kept: each line becomes a 64-bit xxh3 hash, buffered
with an is-edge flag (`BUFFER_ENTRIES`, 36 MiB) and spilled as (hash, docs, edges) rows of 24
bytes by hash partition (`LineCounter`); merging tasks sum a range of partitions each
(`count_corpus`). 1e9 line occurrences, mostly distinct, spill ~24 GB per pass and a merging task
holds ~8 M lines. Two of 1e9 distinct lines share a 64-bit hash with probability ~3%, and then
only merge their counts.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import re
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import orjson
import xxhash

from fuelline.io.atomic import atomic_write, run_once
from fuelline.io.paths import expand_inputs
from fuelline.io.readers import RecordError, iter_file_records
from fuelline.io.spill import (PARTITIONS, group_ranges, hash_partition, map_saved, read_spill, saved_once,
                               spill_counts, write_spill)
from fuelline.pipeline.options import option
from fuelline.pipeline.shards import InputShard, describe_inputs, plan_shards
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage, StageConfig
from fuelline.records import Location

BUFFER_ENTRIES = 1 << 22  # (hash, is_edge) pairs held before a spill
STAGED_ENTRIES = 1 << 16  # Python ints gathered before one copy into the buffer (~3 MB)
CACHE_NAME, CACHE_VERSION = "boilerplate-lines.npz", 1
ROWS_PER_TASK = 8_000_000  # distinct lines (24 B) a merging task holds
EXPLAIN_SHARD_SIZE = 50_000

_DIGIT = re.compile(r"\d")
# Scored on the normalized line, where NFKC has already turned ｜ and ： into | and :.
_SEPARATORS = re.compile(r"[|·•»«›‹>→:《]")
_STRONG_MARKS = re.compile(r"©|\(c\)|all rights reserved|copyright|版权所有|版權所有|icp备|back to top|返回顶部")
_NAV_WORDS = re.compile(
    r"\b(?:home|news|contact|about us|privacy|terms|login|log in|sign in|sign up|subscribe|"
    r"share|menu|next|previous|read more|sitemap)\b"
    r"|首页|首頁|登录|注册|联系我们|关于我们|隐私|上一篇|下一篇|更多|导航|网站地图|免责声明")


@dataclass
class BoilerplateConfig(StageConfig):
    """Options of the boilerplate stage; defaults chosen so that both signals are needed.

    Frequency alone never removes a line: a quote in 1% of documents, mid-text, short and
    without template marks scores 0.35 + 0.05 = 0.40 ≤ 0.5. A frequent line is removed with one
    more piece of evidence: at an edge, 0.35 + 0.30 = 0.65; a footer link bar in the middle,
    0.35 + 0.30 (+ up to 0.05 if short) ≥ 0.65. A duplicated poem's first couplet (20 of 400k
    documents: doc_freq 0.2) scores 0.07 + 0.30 + 0.05 = 0.42 and stays. Every margin is ≥ 0.08.
    """

    alpha: float = option(0.35, "weight of doc_freq (share of documents, log scale)", min=0)
    beta: float = option(0.30, "weight of pos_consistency (share at the document's edges)", min=0)
    gamma: float = option(0.30, "weight of template_similarity (separators, ©, 首页, …)", min=0)
    delta: float = option(0.05, "weight of short_text_score (1 for short lines)", min=0)
    threshold: float = option(0.5, "remove a line whose weighted score is above this")
    min_doc_freq: int = option(5, "a line in fewer documents is never removed (a line must recur)", min=2)
    edge_fraction: float = option(0.05, "share of lines at each end counted as edge", min=0, max=0.5)
    saturation: float = option(0.01, "share of documents from which doc_freq is 1 (above 0)", max=1)
    short_width: int = option(16, "short_text_score is 1 up to this many columns", min=1)
    long_width: int = option(80, "short_text_score is 0 from this many columns on", min=2)
    max_line_chars: int = option(300, "longer lines are content: never counted nor removed", min=1)

    def __post_init__(self):
        super().__post_init__()
        if self.saturation <= 0:  # above 0: beyond what `option(min=)` says
            raise ValueError(f"saturation must be above 0, found {self.saturation}")
        if not self.short_width < self.long_width:
            raise ValueError(f"short_width must be below long_width, found {self.short_width}, {self.long_width}")


# --- lines and their text features ---------------------------------------------------------

def keyed_lines(text: str, max_chars: int) -> list[tuple[int, str, int | None]]:
    """(index in text.split("\\n"), normalized line, hash) of every non-blank line of `text`.

    The hash is None for a line longer than `max_chars`: it still takes a position (it is
    content) but is neither counted nor removed. The whole text is normalized at once, which
    gives the same lines as normalizing each: no NFKC mapping creates or removes a "\\n". NFKC is
    two thirds of the cost (~2.4 µs a line of classical poetry, where "，" becomes ",").
    """
    folded = _DIGIT.sub("0", unicodedata.normalize("NFKC", text).lower())
    keyed = []
    for index, line in enumerate(folded.split("\n")):
        norm = " ".join(line.split())
        if norm:
            digest = xxhash.xxh3_64_intdigest(norm.encode()) if len(norm) <= max_chars else None
            keyed.append((index, norm, digest))
    return keyed


def edge_width(lines: int, edge_fraction: float) -> int:
    """Lines counted as edge at each end of a document of `lines` non-blank lines.

    ceil(edge_fraction · lines), at least 1: with 0.05, the first and last line up to 20 lines,
    two at each end up to 40, five at 100. A document of one or two lines has no body to tell
    edges from, so none (0).
    """
    if lines < 3 or edge_fraction == 0:
        return 0
    return max(1, math.ceil(edge_fraction * lines - 1e-9))  # 0.05 × 60 is 3.0000000000000004


def display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def short_text_score(norm: str, short_width: int, long_width: int) -> float:
    """1 up to `short_width` display columns, falling linearly to 0 at `long_width`."""
    width = display_width(norm)
    return min(1.0, max(0.0, (long_width - width) / (long_width - short_width)))


def template_similarity(norm: str) -> float:
    """0.25 a separator, 0.5 a distinct navigation word, 1 a copyright mark; capped at 1.

    "home | news | sports" scores 1 (two separators, two words); a content line with one colon
    0.25; "版权所有 © 0000 某某网" 1.
    """
    score = 0.25 * len(_SEPARATORS.findall(norm))
    score += 0.5 * len(set(_NAV_WORDS.findall(norm)))
    score += 1.0 * len(set(_STRONG_MARKS.findall(norm)))
    return min(1.0, score)


# --- the counting pass ---------------------------------------------------------------------

@dataclass
class LineTable:
    """Lines held by at least `min_doc_freq` documents: sorted hashes and their counts."""

    hashes: np.ndarray  # uint64, ascending
    doc_counts: np.ndarray  # int64: documents holding the line
    edge_counts: np.ndarray  # int64: of those, documents where it sits at an edge
    num_docs: int


def _reduce(hashes: np.ndarray, docs: np.ndarray | None, edges: np.ndarray):
    """Sort by hash and sum per distinct hash; `docs` None counts one document per entry."""
    order = np.argsort(hashes)
    ordered = hashes[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    if docs is None:
        doc_sums = np.diff(np.append(starts, len(ordered)))
    else:
        doc_sums = np.add.reduceat(docs[order], starts, dtype=np.int64)
    return ordered[starts], doc_sums, np.add.reduceat(edges[order], starts, dtype=np.int64)


class LineCounter:
    """Counts one shard's lines, per distinct line hash its documents and edge documents, in a fixed
    buffer; a full buffer is reduced and written as a spill table (`fuelline.io.spill`)."""

    def __init__(self, prefix: Path):
        self.prefix = prefix
        self.hashes = np.empty(BUFFER_ENTRIES, np.uint64)
        self.edges = np.empty(BUFFER_ENTRIES, np.uint8)
        self.filled = self.num_docs = 0
        self.tables: list[str] = []
        self.staged_hashes: list[int] = []
        self.staged_edges: list[int] = []

    def add_document(self, keyed: list[tuple[int, str, int | None]], edge_fraction: float) -> None:
        self.num_docs += 1
        width = edge_width(len(keyed), edge_fraction)
        hashes = [h for _, _, h in keyed]
        seen = dict.fromkeys(hashes, 0)  # once per document; 1 if any copy sits at an edge
        for h in hashes[:width] + hashes[len(hashes) - width:]:
            seen[h] = 1
        seen.pop(None, None)
        self.staged_hashes.extend(seen)
        self.staged_edges.extend(seen.values())
        if len(self.staged_hashes) >= STAGED_ENTRIES:
            self._flush_staged()

    def _flush_staged(self) -> None:
        hashes = np.array(self.staged_hashes, dtype=np.uint64)
        edges = np.array(self.staged_edges, dtype=np.uint8)
        self.staged_hashes.clear()
        self.staged_edges.clear()
        start = 0
        while start < len(hashes):
            take = min(len(self.hashes) - self.filled, len(hashes) - start)
            self.hashes[self.filled:self.filled + take] = hashes[start:start + take]
            self.edges[self.filled:self.filled + take] = edges[start:start + take]
            self.filled += take
            start += take
            if self.filled == len(self.hashes):
                self._spill()

    def _spill(self) -> None:
        hashes, docs, edges = _reduce(self.hashes[:self.filled], None, self.edges[:self.filled])
        table = self.prefix.with_name(f"{self.prefix.name}-{len(self.tables):04d}")
        write_spill(table, hash_partition(hashes), PARTITIONS, {"hash": hashes, "docs": docs, "edges": edges})
        self.tables.append(table.name)
        self.filled = 0

    def finish(self) -> list[str]:
        """The names of the shard's spill tables (none for a shard without lines)."""
        self._flush_staged()
        if self.filled:
            self._spill()
        return self.tables


def count_shard_lines(shard: InputShard, texts: Callable[[InputShard], Iterable[str]], config: BoilerplateConfig,
                      workdir: Path) -> dict:
    """Counting, for one shard: every distinct line's documents and edge documents (all of them:
    a line in one document of each of many shards recurs). Returns its documents and its tables."""
    prefix = workdir / "lines" / shard.part_name

    def work() -> dict:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        counter = LineCounter(prefix)
        for text in texts(shard):
            counter.add_document(keyed_lines(text, config.max_line_chars), config.edge_fraction)
        return {"tables": counter.finish(), "documents": counter.num_docs}

    return run_once(prefix.with_suffix(".json"), work)


def merge_line_counts(task: tuple[int, int, int], prefixes: list[Path], min_doc_freq: int, directory: Path) -> dict:
    """The shards' counts of the lines in hash partitions [lo, hi), summed; those of at least
    `min_doc_freq` documents kept, sorted by hash."""
    i, lo, hi = task

    def work() -> tuple[np.ndarray, dict]:
        rows = read_spill(prefixes, lo, hi, ("hash", "docs", "edges"))
        hashes, docs, edges = _reduce(rows["hash"], rows["docs"], rows["edges"])
        frequent = docs >= min_doc_freq
        columns = np.stack([hashes[frequent].view(np.int64), docs[frequent], edges[frequent]])
        return columns, {"lines": int(frequent.sum())}

    return saved_once(directory, i, work)


def count_corpus(ctx: PrepareContext, texts: Callable[[InputShard], Iterable[str]], config: BoilerplateConfig
                 ) -> LineTable:
    """The line table of the texts `texts(shard)` yields for every shard, as tasks on the stage's
    executor: a count per shard, then a merge per range of hash partitions (~ROWS_PER_TASK lines),
    so no process holds every distinct line. The same table as one counter over all the texts."""
    counted = ctx.map(functools.partial(count_shard_lines, texts=texts, config=config, workdir=ctx.workdir),
                      ctx.shards, "boilerplate: counting lines")
    prefixes = [ctx.workdir / "lines" / table for shard in counted for table in shard["tables"]]
    counts = spill_counts(prefixes) if prefixes else np.zeros(PARTITIONS, np.int64)
    _, columns = map_saved(ctx.map, functools.partial(merge_line_counts, prefixes=prefixes,
                                                      min_doc_freq=config.min_doc_freq),
                           group_ranges(counts, ROWS_PER_TASK), ctx.workdir / "merged", "boilerplate: merging counts",
                           np.empty((3, 0), dtype=np.int64), axis=1)
    for name in ("lines", "merged"):
        if (ctx.workdir / name).exists():  # scratch of this run; one that cannot be removed is said
            shutil.rmtree(ctx.workdir / name)
    return LineTable(columns[0].view(np.uint64).copy(), columns[1].copy(), columns[2].copy(),
                     num_docs=sum(shard["documents"] for shard in counted))


def shard_texts(shard: InputShard) -> Iterator[str]:
    """The "text" of every document record of a shard; unreadable lines are left to the shards to report."""
    for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip"):
        text = record.get("text")
        if not isinstance(text, str):
            raise RecordError(shard.source, line, 'no string field "text": the boilerplate stage reads '
                                                  "document records (run ingest first)")
        yield text


# --- the stage -----------------------------------------------------------------------------

class BoilerplateStage(Stage):
    name = "boilerplate"
    description = "Remove nav, footer and © lines that recur across documents."
    Config = BoilerplateConfig
    table: LineTable | None = None  # set by `prepare`
    shards: tuple[InputShard, ...] = ()  # what `explain` reads again
    _index: dict[int, int] | None = None  # hash → row of the table, built per process

    def __getstate__(self):
        return {**self.__dict__, "_index": None}  # workers rebuild it; the arrays travel compactly

    def prepare(self, ctx: PrepareContext) -> None:
        """Count every line of the corpus once; a resumed run reads the counts from `workdir`."""
        self.count(ctx, shard_texts)

    def count(self, ctx: PrepareContext, texts: Callable[[InputShard], Iterable[str]]) -> None:
        """`prepare` over the texts `texts(shard)` yields: for a stage that cleans text before this one."""
        self.shards = tuple(ctx.shards)
        self._index = None
        cfg = self.config
        key = orjson.dumps({"version": CACHE_VERSION, "min_doc_freq": cfg.min_doc_freq,
                            "edge_fraction": cfg.edge_fraction, "max_line_chars": cfg.max_line_chars,
                            "inputs": describe_inputs(ctx.files)}).decode()
        cache = ctx.workdir / CACHE_NAME
        if cache.exists():
            with np.load(cache) as saved:
                if str(saved["key"]) == key:
                    self.table = LineTable(saved["hashes"], saved["doc_counts"], saved["edge_counts"],
                                           int(saved["num_docs"]))
                    return
        self.table = count_corpus(ctx, texts, cfg)
        with atomic_write(cache) as f:
            np.savez(f, key=np.array(key), hashes=self.table.hashes, doc_counts=self.table.doc_counts,
                     edge_counts=self.table.edge_counts, num_docs=np.array(self.table.num_docs))

    def _lookup(self) -> dict[int, int]:
        if self.table is None:
            raise RuntimeError("the boilerplate stage has no line counts: run prepare() first")
        if self._index is None:
            self._index = dict(zip(self.table.hashes.tolist(), range(len(self.table.hashes))))
        return self._index

    def features(self, row: int, norm: str) -> dict[str, float]:
        """The four features of table row `row`, whose normalized text is `norm`."""
        cfg, table = self.config, self.table
        docs = int(table.doc_counts[row])
        full = max(cfg.saturation * table.num_docs, 2 * cfg.min_doc_freq)
        return {
            "doc_freq": min(1.0, max(0.0, math.log(docs / cfg.min_doc_freq) / math.log(full / cfg.min_doc_freq))),
            "pos_consistency": int(table.edge_counts[row]) / docs,
            "template_similarity": template_similarity(norm),
            "short_text_score": short_text_score(norm, cfg.short_width, cfg.long_width),
        }

    def score(self, features: dict[str, float]) -> float:
        cfg = self.config
        return (cfg.alpha * features["doc_freq"] + cfg.beta * features["pos_consistency"]
                + cfg.gamma * features["template_similarity"] + cfg.delta * features["short_text_score"])

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        index, cfg = self._lookup(), self.config
        verdicts: dict[int, bool] = {}  # per shard: every candidate is scored once
        for location, record in records:
            keyed = keyed_lines(record["text"], cfg.max_line_chars)
            removed = set()
            for position, norm, digest in keyed:
                row = index.get(digest)
                if row is None:
                    continue
                if digest not in verdicts:
                    verdicts[digest] = self.score(self.features(row, norm)) > cfg.threshold
                if verdicts[digest]:
                    removed.add(position)
            ctx.count("lines_in", len(keyed))
            if not removed:
                yield record
                continue
            ctx.count("boilerplate_lines_removed", len(removed))
            text = "\n".join(line for i, line in enumerate(record["text"].split("\n")) if i not in removed)
            if not text.strip():
                ctx.drop(record, "empty_after_boilerplate", location)
                continue
            meta = {**(record.get("meta") or {}), "boilerplate_lines_removed": len(removed)}
            yield {**record, "text": text, "meta": meta}

    @classmethod
    def explain_report(cls, inputs, config: BoilerplateConfig, top: int = 30) -> str:
        """The text table `fuelline boilerplate --explain` prints."""
        return format_explanation(explain_boilerplate(inputs, config, top))

    def explain(self, top: int = 30) -> list[dict]:
        """The `top` candidate lines by score, with their features and an example as written.

        A second pass over the corpus scores each candidate at its first occurrence and keeps
        a heap of `top` rows: memory is the candidate table plus `top` examples.
        """
        index = self._lookup()
        best: list[tuple[float, int, int, dict]] = []
        seen: set[int] = set()
        for text in itertools.chain.from_iterable(map(shard_texts, self.shards)):
            if len(seen) == len(index):
                break
            originals = text.split("\n")
            for position, norm, digest in keyed_lines(text, self.config.max_line_chars):
                row = index.get(digest)
                if row is None or digest in seen:
                    continue
                seen.add(digest)
                features = self.features(row, norm)
                score = self.score(features)
                entry = {"line": originals[position].strip(), "score": score, **features,
                         "docs": int(self.table.doc_counts[row]), "removed": score > self.config.threshold}
                heapq.heappush(best, (score, entry["docs"], digest, entry))
                if len(best) > top:
                    heapq.heappop(best)
        return [entry for *_, entry in sorted(best, reverse=True)]


def explain_boilerplate(inputs, config: BoilerplateConfig | None = None, top: int = 30) -> list[dict]:
    """Count the lines of `inputs` (files, directories, globs) and explain the `top` candidates."""
    stage = BoilerplateStage(config)
    files = expand_inputs(inputs)
    with tempfile.TemporaryDirectory(prefix="fuelline-boilerplate-") as workdir:
        in_process = lambda fn, items, desc: [fn(item) for item in items]  # noqa: E731
        stage.count(PrepareContext(files, plan_shards(files, EXPLAIN_SHARD_SIZE), Path(workdir), in_process),
                    shard_texts)
    return stage.explain(top)


def _fit(text: str, width: int) -> str:
    """`text` cut and padded to `width` display columns."""
    out, used = [], 0
    for c in text:
        w = display_width(c)
        if used + w > width:
            break
        out.append(c)
        used += w
    return "".join(out) + " " * (width - used)


def format_explanation(rows: list[dict], line_width: int = 60) -> str:
    """A text table of `explain` rows, one line each, CJK-aligned."""
    header = f"{'score':>5} {'docs':>7} {'freq':>4} {'pos':>4} {'tmpl':>4} {'short':>5} {'rm':>2}  line"
    out = [header, "-" * (len(header) - 4 + line_width)]
    for r in rows:
        out.append(f"{r['score']:5.2f} {r['docs']:7d} {r['doc_freq']:4.2f} {r['pos_consistency']:4.2f} "
                   f"{r['template_similarity']:4.2f} {r['short_text_score']:5.2f} {'x' if r['removed'] else '':>2}  "
                   f"{_fit(r['line'], line_width).rstrip()}")
    return "\n".join(out)
