"""The draft vocabulary of an EAGLE-3 draft model, as SpecForge builds it (`vocab_mapping.pt`) or as
vLLM speculators does (`d2t.npy` and `t2d.npy`).

A draft predicts over the `draft_vocab_size` target tokens most often supervised in its training
data. SpecForge counts the tokens where `loss_mask == 1` over its tokenized dataset, sample by
sample, into a `collections.Counter` (each sample's ids by `torch.unique`, so in ascending id), and
maps with this rule:

1. fewer distinct tokens than `draft_vocab_size`: add the missing ids of `range(draft_vocab_size)`
   with count 0 until there are enough (SpecForge iterates a Python `set` there: ascending in
   practice, not guaranteed; we take them ascending);
2. the `draft_vocab_size` most common (`Counter.most_common`: equal counts keep insertion order,
   so a token's tie key is (the first sample where it is supervised, its id));
3. those ids sorted ascending as `used`; `d2t[i] = used[i] - i` (int64, an offset, not an id) and
   `t2d[j] = j in used` (bool, `target_vocab_size` entries).

Here the counting is vectorized: the samples of a target cache (either format) are located from
its index and read straight from the shard files, a chunk of consecutive samples of one shard at
a time (ids and mask only, never the hidden states); a token dataset written by
`pack --template chat` is read in blocks of documents (tokens.bin and the 1-bit mask). Each chunk
is one pass: the supervised positions, their ids, `np.bincount` for the counts and
`np.minimum.at` for each id's first sample; chunks run on `workers` threads and merge by sum
and minimum. Over the same samples in the same order this is exactly SpecForge's Counter, tie
order included (tests/cache/test_vocab_map.py checks it against the rule written out). SpecForge
counts its shuffled dataset, so on equal counts its order, not ours, decides.

speculators (`--for speculators`) counts the same tokens the same way and pads the same way, but
breaks equal counts by token id (it sorts by (-count, id)), so its mapping does not depend on the
order of the samples and ours equals its exactly; the two rules differ only among tokens of equal
count at the cut. It reads `d2t.npy` (int64 offsets) and `t2d.npy` (bool) with `np.load`, by
--d2t-path/--t2d-path or from its --data-path directory: `-o EXPORT/d2t.npy` writes both there.

`build_vocab_mapping` (the step `VocabMapStep`) writes the mapping with its counts and stats
beside it (`companion_paths`). What is counted is first checked as its readers check it (`verify`,
docs/cache.md): a fuelline record's checksum as it is read, a token dataset by
`verify_token_dataset`. The check reads the hidden states too, where the counting reads only ids
and masks; a deepspec-v2 cache has no checksums, only its structure is checked.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import orjson

from fuelline.formats.target_cache import (FUELLINE, MANIFEST, CacheFormatError, cache_format, layout_of,
                                           read_manifest)
from fuelline.formats.target_cache_checks import opened, verify_record_checksum
from fuelline.formats.tokens import FORMAT as TOKENS_FORMAT
from fuelline.formats.tokens import TokenFiles, TokenFormatError, verify_token_dataset
from fuelline.io.atomic import atomic_write, fsync_dir, naming_disk_full, temp_name
from fuelline.pipeline.options import Options, check_declared, identity_values, option
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.stats import StepStats
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions
from fuelline.progress import progress_bar

CHUNK_TOKENS = 1 << 22  # tokens of one pass (its arrays: ~40 bytes a token)
NEVER = np.iinfo(np.int64).max  # first_sample of a token never supervised


@dataclass
class TokenCounts:
    """Supervised-token counts of a dataset, with what SpecForge's tie order depends on.

    `counts[j]`: how often id j is supervised (int64); `first_sample[j]`: the first sample (in
    dataset order) where it is, NEVER where it is not; both `max id + 1` long. `vocab_size`:
    the target vocabulary size the source records (None: it does not), `vocab_size_from` says where."""

    counts: np.ndarray
    first_sample: np.ndarray
    samples: int
    tokens: int
    source: dict
    vocab_size: int | None
    vocab_size_from: str | None
    seconds: float

    @property
    def supervised(self) -> int:
        return int(self.counts.sum())


def count_supervised(source: str | os.PathLike, *, workers: int = 1, progress: bool = False,
                     verify: bool = True) -> TokenCounts:
    """The supervised-token counts of a target cache (either format), a token dataset with a loss
    mask, or a pack output (its train/ split only: SpecForge's mapping is of the training data);
    `progress`: a bar of the tokens counted. `verify`: check what is counted as its readers do
    (module docstring); without it, only what opening a cache or a token dataset checks."""
    path = Path(source)
    check_declared(RunOptions, "workers", workers)
    started = time.perf_counter()
    kind = _kind(path)
    if kind == "target cache":
        counted = _count_cache(path, workers, progress, verify)
    else:
        split = {"split": "train"} if kind == "pack output" else {}
        counted = _count_tokens(path / split.get("split", ""), workers, {"path": str(path), "kind": kind, **split},
                                progress, verify)
    counted.seconds = time.perf_counter() - started
    return counted


def _kind(path: Path) -> str:
    """What `path` holds, from its manifest's `format` field (token datasets have one, the
    fuelline cache another, DeepSpec's caches none); a pack output is a directory holding train/."""
    manifest = path / MANIFEST
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory (a target cache, a token dataset or a pack output)")
    if manifest.is_file():
        try:
            fmt = orjson.loads(manifest.read_bytes()).get("format")
        except (orjson.JSONDecodeError, AttributeError):
            fmt = None  # the cache reader says what is wrong with it
        return "token dataset" if fmt == TOKENS_FORMAT else "target cache"
    if (path / "train" / MANIFEST).is_file():
        return "pack output"
    raise ValueError(f"{path}: neither a target cache nor a token dataset (no {MANIFEST}), nor a pack output "
                     "(no train/ split)")


def _merge(passes: list[tuple[int, Callable[[], tuple[np.ndarray, np.ndarray]]]], workers: int,
           progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Run the passes ((tokens, pass): each returns counts and first samples) on `workers` threads;
    sum and minimum."""
    counts, first = np.zeros(0, np.int64), np.zeros(0, np.int64)
    with (ThreadPoolExecutor(max_workers=workers) as pool,
          progress_bar(disable=not progress, total=sum(t for t, _ in passes), unit="token", unit_scale=True,
                       desc="vocab-map: counting") as bar):
        for (tokens, _), (c, f) in zip(passes, pool.map(lambda p: p[1](), passes)):
            bar.update(tokens)
            if len(c) > len(counts):
                counts = np.concatenate([counts, np.zeros(len(c) - len(counts), np.int64)])
                first = np.concatenate([first, np.full(len(c) - len(first), NEVER)])
            counts[: len(c)] += c
            np.minimum(first[: len(f)], f, out=first[: len(f)])
    return counts, first


def _tally(ids: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts of `ids` (non-negative) and, per id, the least of the `samples` it occurs in."""
    counts = np.bincount(ids)
    first = np.full(len(counts), NEVER)
    np.minimum.at(first, ids, samples)
    return counts, first


def _count_tokens(directory: Path, workers: int, source: dict, progress: bool, verify: bool) -> TokenCounts:
    if verify:
        verify_token_dataset(directory)  # `fuelline verify`'s check: every sha256, the ids, the mask's count
    files = TokenFiles(directory)
    if files.mask_bits is None:
        raise TokenFormatError(directory, "no loss mask (mask.bin): the draft vocabulary is counted over supervised "
                                          "tokens; pack the data with --template chat")
    offsets = files.offsets
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    cuts = np.flatnonzero(np.diff(starts // CHUNK_TOKENS)) + 1  # blocks of whole documents, ~CHUNK_TOKENS each
    bounds = np.concatenate([[0], cuts, [files.num_documents]]).tolist() if files.num_documents else []

    def block(first_doc: int, end_doc: int):
        start, stop = int(offsets[first_doc]), int(offsets[end_doc])
        positions = np.flatnonzero(files.mask(start, stop)) + start
        ids = np.asarray(files.tokens[positions], dtype=np.int64)
        return _tally(ids, np.searchsorted(offsets, positions, side="right").astype(np.int64) - 1)

    passes = [(int(offsets[b] - offsets[a]), lambda a=a, b=b: block(a, b)) for a, b in zip(bounds, bounds[1:])]
    counts, first = _merge(passes, workers, progress)
    m = files.manifest
    return TokenCounts(counts, first, files.num_documents, files.num_tokens, source, m["vocab_size"],
                       f"{directory / MANIFEST} (vocab_size: the tokenizer's; the target model's may be larger)", 0.0)


def _count_cache(directory: Path, workers: int, progress: bool, verify: bool) -> TokenCounts:
    manifest = read_manifest(directory)
    layout = layout_of(manifest)
    index, sizes = opened(directory, manifest, layout)  # the checks CacheDataset makes when it opens
    index = np.asarray(index)
    offsets = layout.field_offsets(index)
    ids_at, mask_at = offsets["input_ids"], offsets["loss_mask"]
    lengths = index["seq_len"].astype(np.int64)
    records = (np.stack([index[name].astype(np.uint64) for name in ("offset", "nbytes", "checksum")], axis=1)
               if verify and layout.format == FUELLINE else None)  # each record's (offset, nbytes, checksum)
    passes = []
    for k, entry in enumerate(manifest["shards"]):
        samples = np.flatnonzero(index["shard_id"] == k)
        if len(samples):
            ends = np.cumsum(lengths[samples])
            cuts = np.flatnonzero(np.diff(ends // CHUNK_TOKENS)) + 1
            for chunk in np.split(samples, cuts):
                passes.append((int(lengths[chunk].sum()), lambda c=chunk, p=directory / entry["file_name"], s=sizes[k]:
                               _cache_chunk(p, s, c, ids_at[c], mask_at[c], lengths[c],
                                            None if records is None else records[c])))
    counts, first = _merge(passes, workers, progress)
    return TokenCounts(counts, first, len(index), int(lengths.sum()),
                       {"path": str(directory), "kind": "target cache", "format": cache_format(manifest)},
                       *_model_vocab_size(manifest), 0.0)


def _cache_chunk(path: Path, size: int, samples: np.ndarray, ids_at: np.ndarray, mask_at: np.ndarray,
                 lengths: np.ndarray, records: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One pass over consecutive samples of one shard: each record's checksum (`records`, as
    CacheDataset checks it on every read), their masks, then the ids where it is 1."""
    if path.stat().st_size != size:
        raise CacheFormatError(path, f"{path.stat().st_size:,} bytes, {size:,} when the cache was opened: "
                                     "truncated or replaced shard")
    shard = np.memmap(path, dtype=np.uint8, mode="r")
    if records is not None:
        for sample, (offset, nbytes, expected) in zip(samples.tolist(), records.tolist()):
            verify_record_checksum(shard[offset: offset + nbytes], expected, path, sample)
    row = np.repeat(np.arange(len(samples)), lengths)  # each token's sample, within the chunk
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    supervised = np.flatnonzero(shard[mask_at[row] + within] == 1)
    row, within = row[supervised], within[supervised]
    # An int32 at every byte offset (a view, overlapping): version 2 packs fields unaligned.
    words = np.ndarray((max(size - 3, 0),), dtype="<i4", buffer=shard, strides=(1,))
    ids = words[ids_at[row] + 4 * within].astype(np.int64)
    if len(ids) and ids.min() < 0:
        at = int(np.argmax(ids < 0))
        raise CacheFormatError(path, f"sample {int(samples[row[at]])}: token id {int(ids[at])} at position "
                                     f"{int(within[at])} is negative")
    return _tally(ids, samples[row])


def _model_vocab_size(manifest: dict) -> tuple[int | None, str | None]:
    """The target model's vocab_size, from its config.json when the cache names a local directory."""
    from fuelline.cache.inspect import find_key

    model = manifest.get("target_model_name_or_path")
    config = Path(model) / "config.json" if isinstance(model, str) else None
    if config is None or not config.is_file():
        return None, None
    try:
        found, value = find_key(orjson.loads(config.read_bytes()), "vocab_size")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None, None
    if not found or type(value) is not int or value < 1:
        return None, None
    return value, str(config)


def vocab_mapping(counts: np.ndarray, first_sample: np.ndarray, draft_vocab_size: int, target_vocab_size: int,
                  trainer: str = "specforge"):
    """(d2t, t2d) by `trainer`'s rule (module docstring) from `count_supervised`'s arrays:
    d2t int64 [draft_vocab_size], t2d bool [target_vocab_size], as torch tensors."""
    import torch

    for name, value in (("draft_vocab_size", draft_vocab_size), ("target_vocab_size", target_vocab_size)):
        if type(value) is not int and not isinstance(value, np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if draft_vocab_size > target_vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size:,} is larger than target_vocab_size "
                         f"{target_vocab_size:,}: a draft vocabulary is a subset of the target's")
    seen = np.flatnonzero(counts)
    if len(seen) and seen[-1] >= target_vocab_size:
        bad = seen[seen >= target_vocab_size]
        raise ValueError(f"token id {int(bad[0]):,} (supervised first in sample {int(first_sample[bad[0]]):,}) is "
                         f"not below target_vocab_size {target_vocab_size:,}; {len(bad):,} id(s) are outside it: the "
                         "data is from another tokenizer, or the vocabulary size is wrong")
    if len(seen) >= draft_vocab_size:  # most common first; equal counts by first sample (SpecForge), then id
        ties = (seen,) if trainer == "speculators" else (seen, first_sample[seen])
        used = seen[np.lexsort((*ties, -counts[seen]))[:draft_vocab_size]]
    else:
        missing = np.setdiff1d(np.arange(draft_vocab_size), seen)[: draft_vocab_size - len(seen)]
        used = np.concatenate([seen, missing])
    used = np.sort(used)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[torch.from_numpy(used)] = True
    return torch.from_numpy(used - np.arange(draft_vocab_size, dtype=np.int64)), t2d


def save_vocab_mapping(path: str | os.PathLike, d2t, t2d) -> None:
    """`torch.save({"d2t": d2t, "t2d": t2d}, path)`, atomically and with the same bytes: torch.save
    names the archive inside the file after the file's name, so it writes into a temporary
    directory beside `path` under the same name, then renames."""
    import torch

    path = Path(path)
    temp = path.parent / temp_name(path.name)
    try:
        with naming_disk_full(path):
            temp.mkdir(parents=True)
            torch.save({"d2t": d2t, "t2d": t2d}, temp / path.name)
            with open(temp / path.name, "rb") as f:
                os.fsync(f.fileno())
            os.replace(temp / path.name, path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    fsync_dir(path.parent)


def save_speculators_mapping(d2t_path: Path, t2d_path: Path, d2t, t2d) -> None:
    """`d2t.npy` and `t2d.npy` as speculators saves them (`np.save` of int64 and bool), each atomically."""
    for path, value in ((d2t_path, d2t), (t2d_path, t2d)):
        with atomic_write(path) as f:
            np.save(f, value.numpy())


def companion_paths(output: str | os.PathLike, trainer: str = "specforge") -> dict[str, Path]:
    """The files `build_vocab_mapping` writes: the mapping (speculators: d2t, and `t2d` beside it, its
    name with the last "d2t" turned "t2d"), `<stem>.counts.npy`, `<stem>.stats.json`."""
    output = Path(output)
    stem = output.name[: -len(output.suffix)] if output.suffix else output.name
    paths = {"mapping": output, "counts": output.with_name(f"{stem}.counts.npy"),
             "stats": output.with_name(f"{stem}.stats.json")}
    if trainer == "speculators":
        if "d2t" not in output.name:
            raise ValueError(f"{output}: for speculators -o names its d2t file (d2t.npy, which its --data-path "
                             "finds; t2d.npy is written beside it)")
        head, _, tail = output.name.rpartition("d2t")
        paths["t2d"] = output.with_name(f"{head}t2d{tail}")
    return paths


@dataclass
class VocabMapConfig(Options):
    """The options of `fuelline cache vocab-map` and of a pipeline's vocab-map step."""

    draft_vocab_size: int | None = option(None, "the draft model's vocabulary size (SpecForge's draft_vocab_size)",
                                          min=1, required=True, flag="--draft-vocab")
    target_vocab_size: int | None = option(None, "the target model's config vocab_size (default: the cache's model "
                                                 "config.json; a token dataset's tokenizer size)", min=1,
                                           flag="--target-vocab")
    trainer: str = option("specforge", "the trainer whose rule and files: specforge (vocab_mapping.pt; equal counts "
                                       "in order of first appearance) or speculators (d2t.npy and t2d.npy; equal "
                                       "counts by token id)", choices=("specforge", "speculators"), flag="--for")
    verify: bool = option(True, "check every record's checksum (a token dataset: every file's sha256) before "
                                "trusting it; without: read only the ids and masks, checking what opening checks",
                          identity=False)


class VocabMapStep(Step):
    """SpecForge's (vocab_mapping.pt) or speculators' (d2t.npy, t2d.npy) draft vocabulary from the
    supervised tokens of a cache or a pack output."""

    name, Config = "vocab-map", VocabMapConfig
    MAPPINGS = {"specforge": "vocab_mapping.pt", "speculators": "d2t.npy"}  # in a pipeline step's directory

    def check(self) -> None:
        if self.config.draft_vocab_size is None:
            raise ValueError("--draft-vocab (draft_vocab_size in a pipeline step) is required: the draft model's "
                             "vocabulary size")

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        if len(inputs) != 1:
            raise ValueError(f"{self.name} counts one cache or pack output; it was given {len(inputs)} inputs")
        return self.write(inputs[0], output, options)

    def write(self, source: str | os.PathLike, output: Path, options: RunOptions, single_file: bool = False) -> dict:
        """Count `source` and write into `output` (a directory; `single_file`: the mapping file itself,
        its counts and stats beside it) under the resume contract; a finished output is recognized by
        the options and the source's manifests and index (their sizes and times)."""
        path = Path(source)
        described = [p for p in sorted(path.rglob(MANIFEST)) if p.is_file()] + \
            [p for p in (path / "samples.idx",) if p.is_file()]
        identity = {"task": self.name, "config": identity_values(self.config), "inputs": describe_inputs(described)}
        trainer = self.config.trainer
        mapping = output if single_file else output / self.MAPPINGS[trainer]
        written = {key: path for key, path in companion_paths(mapping, trainer).items() if key != "stats"}
        layouts = [p.name for t, name in self.MAPPINGS.items()  # a directory's, whichever trainer made it
                   for key, p in companion_paths(Path(name), t).items() if key != "stats"]
        step_dir = WorkDir(output, identity, beside=[p for p in written.values() if p != mapping] if single_file
                           else None, defaults={"trainer": "specforge"}, reads=[source],  # defaults: before --for
                           writes=layouts)

        def work() -> StepStats:
            stats = _write_mapping(source, mapping, step_dir.stats_path, self.config,
                                   options.resolved_workers(1 << 30), options.progress)
            return StepStats(self.name, stats["samples"], stats["samples"], details=stats)

        return step_dir.run_once(work, restart=options.restart)


def build_vocab_mapping(source: str | os.PathLike, output: str | os.PathLike, *, draft_vocab_size: int | None = None,
                        target_vocab_size: int | None = None, trainer: str = "specforge", workers: int = 1,
                        progress: bool = False, verify: bool = True, restart: bool = False) -> dict:
    """`VocabMapStep` writing the mapping file `output`, its counts and stats beside it (`companion_paths`);
    returns the stats. The target vocabulary size: the one given, else the source's (a token dataset's
    manifest; a cache's target model config.json, when the cache names a local directory). `seconds`
    in the stats: the counting, opening included; `tokens_per_second`: all tokens of the counted
    samples over it. A source with no supervised token is refused: it has no draft vocabulary."""
    if Path(output).is_dir():
        raise IsADirectoryError(f"{output}: a directory; -o names the mapping file to write (e.g. "
                                f"{VocabMapStep.MAPPINGS.get(trainer, 'vocab_mapping.pt')})")
    step = VocabMapStep(VocabMapConfig(draft_vocab_size, target_vocab_size, trainer, verify))
    companion_paths(output, trainer)  # a speculators output not named d2t: refused before counting
    step.check()
    return step.write(source, Path(output), RunOptions(workers=workers, restart=restart, progress=progress),
                      single_file=True)


def _write_mapping(source, output: Path, stats_path: Path, config: VocabMapConfig, workers: int,
                   progress: bool) -> dict:
    """Count, map, write the mapping and the counts; the numbers for the stats."""
    paths = companion_paths(output, config.trainer)
    counted = count_supervised(source, workers=workers, progress=progress, verify=config.verify)
    if not counted.supervised:
        raise ValueError(f"{source}: no supervised token in its {counted.samples:,} samples ({counted.tokens:,} "
                         "tokens, every loss mask 0): there is nothing to choose a draft vocabulary from; nothing "
                         "was written")
    target_vocab_size, vocab_from = config.target_vocab_size, "given"
    if target_vocab_size is None:
        if counted.vocab_size is None:
            raise ValueError(f"{source}: the target vocabulary size is not known from the {counted.source['kind']} "
                             "(its target model is not a local directory with a config.json): pass --target-vocab, "
                             "the target model's config vocab_size")
        target_vocab_size, vocab_from = counted.vocab_size, counted.vocab_size_from
    d2t, t2d = vocab_mapping(counted.counts, counted.first_sample, config.draft_vocab_size, target_vocab_size,
                             config.trainer)
    counts = np.zeros(target_vocab_size, np.int64)
    counts[: len(counted.counts)] = counted.counts
    stats = {"source": counted.source, "samples": counted.samples, "tokens": counted.tokens,
             "supervised_tokens": counted.supervised, "distinct_tokens": int(np.count_nonzero(counts)),
             "draft_vocab_size": config.draft_vocab_size, "target_vocab_size": target_vocab_size,
             "target_vocab_size_from": vocab_from, "source_vocab_size": counted.vocab_size,
             "coverage": int(counts[t2d.numpy()].sum()) / counted.supervised,
             "seconds": round(counted.seconds, 3),
             "tokens_per_second": round(counted.tokens / counted.seconds) if counted.seconds else None,
             "trainer": config.trainer,
             "files": {**{key: str(path) for key, path in paths.items() if key != "stats"}, "stats": str(stats_path)}}
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(paths["counts"]) as f:
        np.save(f, counts)
    if config.trainer == "speculators":
        save_speculators_mapping(output, paths["t2d"], d2t, t2d)
    else:
        save_vocab_mapping(output, d2t, t2d)
    return stats


def format_summary(stats: dict) -> str:
    """What `build_vocab_mapping` did, in a few lines for the terminal."""
    source = stats["source"]
    what = source["kind"] + (f" ({source['format']})" if "format" in source else "") + (
        f", its {source['split']}/ split only" if "split" in source else "")
    lines = [f"counted    {source['path']}: {what}",
             f"           {stats['samples']:,} samples, {stats['supervised_tokens']:,} supervised tokens of "
             f"{stats['tokens']:,}, {stats['distinct_tokens']:,} distinct, in {stats['seconds']:.2f}s",
             f"mapping    draft {stats['draft_vocab_size']:,} of target {stats['target_vocab_size']:,} "
             f"({stats['target_vocab_size_from']}); coverage {stats['coverage']:.2%} of supervised tokens",
             f"wrote      {stats['files']['mapping']} (+ "
             f"{', '.join(Path(stats['files'][k]).name for k in ('t2d', 'counts', 'stats') if k in stats['files'])})"]
    given, recorded = stats["target_vocab_size"], stats["source_vocab_size"]
    if stats["target_vocab_size_from"] == "given" and recorded is not None and recorded != given:
        lines.append(f"note       the source records vocabulary size {recorded:,}, not the {given:,} given")
    if stats["distinct_tokens"] < stats["draft_vocab_size"]:
        lines.append(f"note       only {stats['distinct_tokens']:,} distinct supervised tokens: the rest of the draft "
                     "vocabulary is the lowest unseen ids, as SpecForge and speculators pad it")
    return "\n".join(lines)
