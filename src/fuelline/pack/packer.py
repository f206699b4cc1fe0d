"""The parallel packer: document records → `train/` and `val/` token datasets.

Shards are rendered on the workers into `_work/` (`encode_shard`, with a marker each, ids already in
the output's dtype), then merged in order into both splits at once, one shard at a time
(`merge_splits`), so memory stays flat in corpus size and the bytes do not depend on the workers: docs/tokenizer-and-pack.md, and
benchmarks/bench_pack.py for the processes × tokenizer threads measured. The plan and identity
(tokenizer fingerprint, options, shards) follow every step's resume contract
(`fuelline.pipeline.workdir`).

A record that cannot be read, is not of the template's kind, or that the chat template cannot
render stops the run naming FILE:LINE and its id (`on_error="raise"`), or is counted under its
reason (`on_error="skip"`); every dropped record, with its reason, file and line, goes to
`_rejects/PART.jsonl.zst` (written before the shard's marker) and the first of each reason to
stats.json's `drop_examples`.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import orjson

from fuelline.fingerprints import tokenizer_fingerprint
from fuelline.formats.tokens import (DTYPES, MANIFEST, MASK, OFFSETS, TOKENS, TokenDatasetWriter, check_dtype,
                                    dtype_for)
from fuelline.io.atomic import remove_temp_files, write_bytes_atomic
from fuelline.io.paths import as_sources, expand_inputs
from fuelline.io.readers import RecordError, iter_file_records
from fuelline.io.rejects import Rejects
from fuelline.io.remote import refuse_url
from fuelline.io.spill import save_array
from fuelline.io.stage_layout import REJECTS_DIR, STAGE_PART_PREFIX
from fuelline.pack.templates import TEMPLATES
from fuelline.chat.encode import ConversationError
from fuelline.chat.encoding_options import ChatEncoding, RecordErrors
from fuelline.pipeline.options import group, identity_history, identity_values, option, read_paths
from fuelline.pipeline.shards import InputShard, describe_inputs, plan_shards
from fuelline.pipeline.stats import StepStats
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.executor import open_executor
from fuelline.pipeline.workers import RunOptions
from fuelline.records import unit_interval
from fuelline.tokenizer.train import TOKENIZER_FILES

SPLITS = ("train", "val")
SHARD_ARRAYS = ("ids", "val", "lengths", "mask", "dropped")
WORK_DIR = "_work"  # the shards' arrays, removed once stats.json is written
# What pack writes into its output (`fuelline.io.step_files`): each split's token dataset, the tokenizer
# it carries, the rejects and the shards' arrays under _work/ (an earlier fuelline's plan there too).
PACK_WRITES = (*(f"{split}/{name}" for split in SPLITS for name in (MANIFEST, TOKENS, OFFSETS, MASK)),
               *(f"tokenizer/{name}" for name in TOKENIZER_FILES), f"{REJECTS_DIR}/{STAGE_PART_PREFIX}*", WORK_DIR)
BATCH_SIZE = 4096  # records per encode batch of the tokenizer
CHAT_ENCODING = {f.name for f in fields(ChatEncoding)}


@dataclass
class PackConfig(ChatEncoding):
    """The options of `fuelline pack` and of a pipeline's pack step, declared once for both; those that
    encode chat records (`--template chat`) are cache build's too (`ChatEncoding`)."""

    tokenizer: str = option("@tokenizer", "tokenizer directory (from `fuelline tokenizer train` or `from-tiktoken`;"
                            " in a pipeline file also @STEP)", identity=False, step_ref=True, reads=True)
    template: str = option("poetry", "documents: poetry or plain; chat records (SFT): chat, with an assistant-only "
                           "mask", choices=list(TEMPLATES))
    errors: RecordErrors = group(RecordErrors)  # on_error
    metadata_dropout: float = option(0.25, "share of poetry documents packed without title, author and dynasty",
                                      min=0, max=1)
    val_fraction: float = option(0.05, "share of documents that go to val/", min=0, max=1)
    seed: int = option(42, "decides split and dropout per document")
    dtype: str = option("auto", "token id type on disk; auto: uint16 when the vocabulary fits, else uint32",
                        choices=["auto", *DTYPES])
    threads: int = option(0, "tokenizer threads per worker (0: the library's own)", identity=False, min=0)

    def template_options(self, tokenizer_dir: str | os.PathLike) -> dict:
        options = {"metadata_dropout": self.metadata_dropout, "seed": self.seed}
        if self.template == "chat":
            options.update(encoding=self, on_error=self.errors.on_error, tokenizer_dir=os.fspath(tokenizer_dir))
        return options


_tokenizers: dict[str, object] = {}


def _load_tokenizer(path: str, threads: int | None):
    """One tokenizer per process; its thread pool sized before the library starts it."""
    if path not in _tokenizers:
        if threads:
            os.environ["RAYON_NUM_THREADS"] = str(threads)
        from tokenizers import Tokenizer

        _tokenizers[path] = Tokenizer.from_file(path)
    return _tokenizers[path]


def encode_shard(shard: InputShard, *, tokenizer_path: str, config: PackConfig, workdir: Path,
                 threads: int | None, dtype: str) -> dict:
    """Render one shard with the template; write its arrays (ids as `dtype`, the output's: a quarter of int64's
    bytes to write and to read back), its rejects and, last, its marker. Returns the marker."""
    marker_path = workdir / f"{shard.part_name}.json"
    if marker_path.exists():
        return orjson.loads(marker_path.read_bytes())
    tokenizer = _load_tokenizer(tokenizer_path, threads)
    template = TEMPLATES[config.template](tokenizer, **config.template_options(Path(tokenizer_path).parent))
    with Rejects(workdir.parent / REJECTS_DIR / f"{shard.part_name}.jsonl.zst") as rejects:
        parts, doc_ids = _render_shard(shard, template, config.errors.on_error, rejects)

    def joined(name: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros(0, dtype)

    ids = joined("ids", np.int64)
    max_id = int(ids.max()) if len(ids) else -1
    check_dtype(dtype, max_id, shard.part_name)  # pack checked the vocabulary; this checks the ids themselves
    arrays = {"ids": ids.astype(DTYPES[dtype]), "lengths": joined("lengths", np.int64), "dropped": joined("dropped_metadata", bool),
              "val": np.array([unit_interval(config.seed, "split", r) < config.val_fraction for r in doc_ids], bool),
              "mask": np.packbits(joined("mask", bool), bitorder="little")}
    for name, array in arrays.items():
        save_array(workdir / f"{shard.part_name}.{name}.npy", array)
    marker = {"documents": len(arrays["lengths"]), "tokens": int(len(ids)), "max_id": max_id,
              "dropped": dict(sorted(rejects.counts.items())), "drop_examples": dict(sorted(rejects.examples.items())),
              "truncated": sum(p.truncated for p in parts), "special_text": sum(p.special_text for p in parts),
              "encoder": template.encoder}
    write_bytes_atomic(marker_path, orjson.dumps(marker))
    return marker


def _render_shard(shard: InputShard, template, on_error: str, rejects: Rejects):
    """The shard's records rendered BATCH_SIZE at a time: (rendered batches, ids of the kept records in order);
    every record left out goes to `rejects`, or, with on_error="raise", one that cannot be used stops it."""
    parts, doc_ids, batch = [], [], []

    def flush() -> None:
        try:
            rendered = template.render([record for _, record in batch])
        except ConversationError as e:  # an index in the batch: name the file, line and id instead
            line, record = batch[e.index]
            raise RecordError(shard.source, line, f"record {record['id']!r}: {e.message}") from None
        parts.append(rendered)
        kept = rendered.kept if rendered.kept is not None else [True] * len(batch)
        doc_ids.extend(record["id"] for (_, record), keep in zip(batch, kept) if keep)
        for k, drop in rendered.drops:
            line, record = batch[k]
            rejects.add(drop.reason, record, source=shard.source, line=line,
                        detail=f"record {record['id']!r}: {drop.detail}")
        batch.clear()

    for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error=on_error,
                                          rejects=rejects):
        problem = template.record_problem(record)
        if problem is not None and on_error == "raise":
            raise template.refusal(problem, shard.source, line)
        if problem is not None:
            rejects.add(problem.reason, record, source=shard.source, line=line, detail=problem.detail)
            continue
        batch.append((line, record))
        if len(batch) == BATCH_SIZE:
            flush()
    if batch:
        flush()
    return parts, doc_ids


def _identity(files: list[Path], tokenizer_dir: Path, config: PackConfig) -> dict:
    """The options that decide the output (the chat-encoding ones only for chat records), the tokenizer, the inputs."""
    values = identity_values(config)
    if config.template != "chat":
        values = {k: v for k, v in values.items() if k not in CHAT_ENCODING}
    return {"config": values, "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer_dir),
            "inputs": describe_inputs(files)}


def merge_splits(shards: list[InputShard], workdir: Path, output: Path, with_mask: bool, writer_args: dict) -> dict:
    """Write every split from the shard arrays, each shard read once and alone in memory; return each split's
    numbers."""
    writers = {}
    try:
        for split in SPLITS:
            writers[split] = TokenDatasetWriter(output / split, with_mask=with_mask, **writer_args)
        lengths_kept, dropped = {split: [] for split in SPLITS}, dict.fromkeys(SPLITS, 0)
        for shard in shards:
            arrays = {name: np.load(workdir / f"{shard.part_name}.{name}.npy") for name in SHARD_ARRAYS}
            mask = np.unpackbits(arrays["mask"], count=len(arrays["ids"]), bitorder="little").view(bool) \
                if with_mask else None
            for split, chosen in (("train", ~arrays["val"]), ("val", arrays["val"])):
                tokens = np.repeat(chosen, arrays["lengths"])
                writers[split].add_documents(arrays["ids"][tokens], arrays["lengths"][chosen],
                                             None if mask is None else mask[tokens])
                lengths_kept[split].append(arrays["lengths"][chosen])
                dropped[split] += int(arrays["dropped"][chosen].sum())
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return {split: split_stats(writer.close(), np.concatenate(lengths_kept[split]), dropped[split])
            for split, writer in writers.items()}


def split_stats(manifest: dict, lengths: np.ndarray, dropped: int) -> dict:
    tokens, documents = manifest["num_tokens"], manifest["num_documents"]
    supervised = manifest["mask"]["supervised_tokens"] if manifest["mask"] else tokens
    percentiles = np.percentile(lengths, [50, 90, 99]).tolist() if documents else [0, 0, 0]
    edges = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, np.inf]
    counts = np.histogram(lengths, bins=edges)[0].tolist() if documents else [0] * (len(edges) - 1)
    return {
        "documents": documents, "tokens": tokens,
        "supervised_tokens": supervised, "masked_tokens": tokens - supervised,
        "supervised_share": round(supervised / tokens, 4) if tokens else 0.0,
        "masked_share": round(1 - supervised / tokens, 4) if tokens else 0.0,
        "metadata_dropout_share": round(dropped / documents, 4) if documents else 0.0,
        "tokens_per_document": {
            "min": int(lengths.min()) if documents else 0, "mean": round(float(lengths.mean()), 2) if documents else 0.0,
            "p50": percentiles[0], "p90": percentiles[1], "p99": percentiles[2],
            "max": int(lengths.max()) if documents else 0,
            "histogram": {f"{int(lo)}-{'' if hi == np.inf else int(hi) - 1}": c
                          for lo, hi, c in zip(edges[:-1], edges[1:], counts)},
        },
    }


def pack(inputs, tokenizer_dir: str | os.PathLike, output: str | os.PathLike, config: PackConfig | None = None,
         **run) -> dict:
    """Pack document records into OUTPUT/train and OUTPUT/val; return (and write) stats.json.

    `tokenizer_dir` is `config.tokenizer` made a directory by the caller (a pipeline's @STEP). `run`:
    `RunOptions` (workers, restart, progress, executor, ray_address, shard_size), where and in what
    pieces the shards are tokenized; the bytes are the same either way.
    """
    refuse_url(output, "pack")  # inputs may be URLs (`expand_inputs`)
    config, options = config or PackConfig(), RunOptions(**run)
    output, tokenizer_dir = Path(output), Path(tokenizer_dir)
    from tokenizers import Tokenizer

    tokenizer_path = tokenizer_dir / "tokenizer.json"
    if not tokenizer_path.exists():
        raise FileNotFoundError(f"{tokenizer_dir}: no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = dtype_for(vocab_size - 1) if config.dtype == "auto" else config.dtype
    check_dtype(dtype, vocab_size - 1, os.fspath(output))  # before anything is written
    # refuses a tokenizer without the template's special tokens, before anything is written
    boundary = TEMPLATES[config.template](tokenizer, **config.template_options(tokenizer_dir)).boundary_ids()
    files = expand_inputs(inputs)
    step_dir = WorkDir(output, _identity(files, tokenizer_dir, config), **identity_history(PackConfig),
                       reads=[*as_sources(inputs), tokenizer_dir, *read_paths(config)], writes=PACK_WRITES)
    with step_dir.lock():
        return _pack(files, tokenizer, tokenizer_dir, step_dir, config, (dtype, *boundary), options)


def _pack(files, tokenizer, tokenizer_dir: Path, step_dir: WorkDir, config: PackConfig,
          header: tuple[str, int | None, int | None], options: RunOptions) -> dict:
    """`pack`, once the output's lock is held; `header`: the dtype, bos and eos id of the manifests."""
    dtype, bos_id, eos_id = header
    tokenizer_path = tokenizer_dir / "tokenizer.json"
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    output, identity, started = step_dir.path, step_dir.identity, step_dir.started
    workdir = output / WORK_DIR
    if options.restart:
        step_dir.restart()
    if (finished := step_dir.finished()) is not None:
        _remove_leftovers(output)  # a run killed between stats.json and its cleanup
        return finished  # packed already
    plan = step_dir.begin(lambda: any(workdir.glob(f"{STAGE_PART_PREFIX}*.json")),
                          lambda: {"shards": [s.to_json() for s in plan_shards(files, options.shard_size)]})
    if step_dir.resumed:
        remove_temp_files(output)  # of writes a killed run left half done (we hold the output's lock)
    shards = [InputShard(**s) for s in plan["shards"]]
    encode = functools.partial(encode_shard, tokenizer_path=str(tokenizer_path), config=config, workdir=workdir,
                               threads=config.threads or None, dtype=dtype)
    with open_executor(options, len(shards)) as executor:
        markers = executor.map(encode, shards, "pack: tokenizing", progress=options.progress)
    encoded = time.perf_counter()
    for name in TOKENIZER_FILES:  # the output carries its tokenizer (inspect, training scripts)
        if (tokenizer_dir / name).exists():
            write_bytes_atomic(output / "tokenizer" / name, (tokenizer_dir / name).read_bytes())
    writer_args = {
        "dtype": dtype, "vocab_size": vocab_size, "bos_id": bos_id, "eos_id": eos_id,
        "tokenizer": {"fingerprint": identity["tokenizer_fingerprint"],
                      "special_tokens": {t.content: i for i, t in sorted(tokenizer.get_added_tokens_decoder().items())}},
        "config": {**asdict(config), "inputs": [f["path"] for f in identity["inputs"]]},
    }
    splits = merge_splits(shards, workdir, output, config.template != "plain", writer_args)
    warnings = [f"split {split} got no documents ({sum(m['documents'] for m in markers):,} in all, val_fraction "
                f"{config.val_fraction}): it cannot be loaded for training" for split, n in splits.items()
                if n["documents"] == 0]
    documents = sum(m["documents"] for m in markers)
    dropped = sum((Counter(m["dropped"]) for m in markers), Counter())
    examples: dict[str, str] = {}
    for marker in markers:  # the first record of each reason, in shard order
        for reason, example in marker.get("drop_examples", {}).items():
            examples.setdefault(reason, example)
    counters = {key: sum(m.get(key, 0) for m in markers) for key in ("truncated", "special_text")}
    stats = step_dir.finish(StepStats(
        "pack", documents + sum(dropped.values()), documents, dict(dropped), examples,
        counters=counters if config.template == "chat" else {}, details={
            "splits": splits, "dtype": dtype, "vocab_size": vocab_size, "warnings": warnings,
            "encoder": dict(Counter(m.get("encoder", "unknown") for m in markers)),  # engine and why: shards
            "seconds": {"tokenize": round(encoded - started, 2), "merge": round(time.perf_counter() - encoded, 2)}}))
    _remove_leftovers(output)
    return stats


def _remove_leftovers(output: Path) -> None:
    """The shard arrays (~4x the size of tokens.bin) and temp files of killed writes, once stats.json is written."""
    shutil.rmtree(output / WORK_DIR, ignore_errors=True)
    remove_temp_files(output)
