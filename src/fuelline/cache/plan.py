"""What a cache build will write, decided before any forward pass, so any number of ranks can write it.

The plan encodes every conversation once (chat template, assistant-only mask, `max_length`,
`min_loss_tokens`), stores the token ids in `CACHE/.build/` and fixes the whole cache (a record
it cannot use, by the chat record contract of `fuelline.formats.chat_record` or because the
template cannot render it, stops it, naming FILE:LINE and the id, or with on_error="skip" is
dropped under its reason; every dropped record goes to `.build/rejects.jsonl.zst`, `_rejects/`
once merged): which samples go to which shard, in which order, in which forward batches. Every sample's bytes are
known from its length alone, so shard sizes, offsets and the total are exact before the target
runs (`fuelline cache estimate` prints them; `build` checks the disk with them).

Samples are sorted by length and dealt round-robin to the shards: each shard holds samples of
every length (so shards cost about the same and ranks balance), in ascending length within the
shard (so a batch of neighbours wastes little on padding). The shard count is the least that
keeps every shard under `max_shard_bytes`, and at least `min_shards`, so that several ranks
have work; it never depends on the number of ranks, and therefore neither do the bytes. Ranks
take whole shards, longest remaining work first; a resumed build deals out only the shards not
yet finished, to however many ranks it now has.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson

from fuelline.formats import chat_record
from fuelline.formats.chat_record import ChatRecordError
from fuelline.formats.target_cache import FORMATS, FUELLINE, HIDDEN_DTYPES, Layout
from fuelline.io.atomic import atomic_write, write_bytes_atomic
from fuelline.chat.encoding_options import ChatEncoding, RecordErrors
from fuelline.io.readers import READ_ERROR_REASONS
from fuelline.io.rejects import Rejects
from fuelline.pipeline.options import group, option

BUILD_DIR = ".build"
ENCODE_BATCH = 512
SAMPLES = np.dtype([("start", "<u8"), ("length", "<u4"), ("loss_tokens", "<u4")])
REJECTS = "rejects.jsonl.zst"  # in .build/ while planning, then in the cache's _rejects/


@dataclass
class CacheConfig(ChatEncoding):
    """Everything that decides a cache's bytes (and, last, how it is run: device, checks, writes); the
    options that encode the conversations are `pack --template chat`'s too (`ChatEncoding`).
    The model is not part of `identity_values`: the build identity records its name and fingerprint."""

    model: str = option("", "the target model: its directory (config, weights, tokenizer), or a Hub id (Qwen/Qwen3-4B) "
                            "found through the Hugging Face cache as from_pretrained finds it "
                            "(HF_HUB_OFFLINE=1: cache only)", identity=False, required=True)
    layers: list[int] = option(factory=list, comma_list=True, required=True,
                               help="layer ids to capture, ascending (e.g. 1,9,17,25,33); -1 is the embedding output; "
                                    "the final decoder layer is not allowed")
    errors: RecordErrors = group(RecordErrors)  # on_error
    format: str = option(FUELLINE, "deepspec-v2: DeepSpec's version 2, byte for byte; fuelline: checksums, ids, fp8",
                         choices=FORMATS)
    hidden_dtype: str = option("bf16", "fp8: e4m3 with a scale per token and layer (fuelline format), half the bytes",
                               choices=["bf16", "fp8"])
    max_shard_bytes: int = option(64 << 30, "largest shard file", size=True, min=1)
    min_shards: int = option(8, "at least this many shards, so that several ranks share the work", min=1)
    batch_tokens: int = option(16384, "padded tokens per forward batch (batch size x longest sequence)", min=1)
    device: str = option("auto", "auto: this rank's GPU when there is one, else the cpu; cuda: fail without a GPU",
                         choices=["auto", "cuda", "cpu"], identity=False)
    force: bool = option(False, "start even when the disk has less free space than the cache needs", identity=False)
    inline_writes: bool = option(False, "write on the main thread (no overlap; for measurements)", identity=False)
    queue_bytes: int = option(4 << 30, "host memory for batches waiting for the writer thread", size=True, min=1,
                              identity=False)

    def __post_init__(self):
        """Options are checked here, before a tokenizer or model is loaded: a mistake costs nothing."""
        super().__post_init__()
        if not self.layers:
            raise ValueError("--layers: give at least one layer id to capture")
        layout_for(self, hidden_size=1)  # the format module's checks: format, dtype and the two together


def require_transformers() -> None:
    """torch and transformers are extras: say which to install instead of an ImportError."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"the target cache needs torch and transformers ({e.name} is missing): "
                           "pip install 'fuelline[cache]'") from None


def model_config(model: str | os.PathLike):
    """The model's transformers config (a model directory or a config.json), and its text part."""
    require_transformers()
    from transformers import AutoConfig

    from fuelline.cache.capture import text_config

    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model directory or config.json")
    config = AutoConfig.from_pretrained(path.parent if path.is_file() else path)
    return config, text_config(config)


def layout_for(config: CacheConfig, hidden_size: int) -> Layout:
    return Layout(config.format, len(config.layers), hidden_size, HIDDEN_DTYPES[config.hidden_dtype])


def model_fingerprint(model: str | os.PathLike) -> str:
    """sha256 over the model's config and weight files (names and contents), in name order."""
    digest = hashlib.sha256()
    directory = Path(model)
    files = sorted(p for p in directory.iterdir() if p.name == "config.json" or p.suffix in (".safetensors", ".bin"))
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Encoded:
    """The kept conversations: ids and masks back to back, one SAMPLES row and one record id each."""

    samples: np.ndarray
    record_ids: list[str]
    records_in: int
    dropped: dict[str, int]
    drop_examples: dict[str, str]
    truncated: int


def encode_inputs(inputs: list[str], model: str | os.PathLike, config: CacheConfig, ids_file, mask_file,
                  rejects: Rejects, progress: bool = True, vocab_size: int | None = None) -> Encoded:
    """Encode every chat record of `inputs` with the model's tokenizer, writing ids (int32) and loss
    mask (uint8) to the open files and every record left out to `rejects`; with on_error="raise" a
    record that cannot be read, breaks the record contract or cannot be rendered is an error naming
    its file and line (and id). With the model's `vocab_size` (its embedding rows: the plan of a build
    or stream passes it), an id the model cannot embed stops it, whatever on_error says
    (`check_ids`): before any forward, where a GPU would stop on a device-side assert."""
    from fuelline.chat.encode import ConversationError, load_tokenizer
    from fuelline.io import expand_inputs, iter_file_records
    from fuelline.progress import progress_bar

    tokenizer = load_tokenizer(model)
    check_ids = IdBound(vocab_size, tokenizer.tokenizer.get_vocab_size(with_added_tokens=True))
    rows, record_ids, truncated, records_in, at = [], [], 0, 0, 0
    batch: list[tuple[str, int, dict]] = []
    on_error = config.errors.on_error

    def flush():
        nonlocal at, truncated
        try:
            results = config.encode([r for _, _, r in batch], tokenizer, on_error=on_error)
        except ConversationError as e:  # an index in the batch: name the file, line and id instead
            path, line, record = batch[e.index]
            raise ValueError(f"{path}:{line}: record {record['id']!r}: {e.message}") from None
        for (path, line, record), result in zip(batch, results):
            if not hasattr(result, "input_ids"):
                rejects.add(result.reason, record, source=path, line=line,
                            detail=f"record {record['id']!r}: {result.detail}")
                continue
            check_ids(result.input_ids, f"{path}:{line}: record {record['id']!r}")
            ids_file.write(result.input_ids.astype("<i4").tobytes())
            mask_file.write(result.loss_mask.astype("u1").tobytes())
            rows.append((at, len(result.input_ids), int(result.loss_mask.sum())))
            record_ids.append(record["id"])
            truncated += result.truncated
            at += len(result.input_ids)
        batch.clear()

    files = expand_inputs(inputs)
    if not files:
        raise FileNotFoundError(f"no input files in {', '.join(map(str, inputs))}")
    with progress_bar(desc="encode", unit=" conv", disable=not progress) as bar:
        for path in files:
            for line, record in iter_file_records(path, on_error=on_error, rejects=rejects):
                records_in += 1
                problem = chat_record.check(record)
                if problem is not None and on_error == "raise":
                    raise ChatRecordError(problem.reason, problem.detail, f"{path}:{line}")
                if problem is not None:
                    rejects.add(problem.reason, record, source=os.fspath(path), line=line, detail=problem.detail)
                    continue
                batch.append((os.fspath(path), line, record))
                if len(batch) == ENCODE_BATCH:
                    flush()
                    bar.update(ENCODE_BATCH)
        bar.update(len(batch))
        if batch:
            flush()
    records_in += sum(n for reason, n in rejects.counts.items() if reason in READ_ERROR_REASONS)
    return Encoded(np.array(rows, dtype=SAMPLES), record_ids, records_in, dict(sorted(rejects.counts.items())),
                   dict(sorted(rejects.examples.items())), truncated)


@dataclass
class IdBound:
    """The model's embedding rows (`vocab_size`): every encoded id must be below it. A tokenizer
    larger than that (a template's added tokens) is fine as long as no record uses the ids above."""

    vocab_size: int | None  # None: no model to check against (an estimate, a tokenizer alone)
    tokenizer_size: int

    def __call__(self, ids: np.ndarray, where: str) -> None:
        if self.vocab_size is not None and len(ids) and (largest := int(ids.max())) >= self.vocab_size:
            raise ValueError(f"{where}: token id {largest:,} is outside the model's vocabulary of "
                             f"{self.vocab_size:,} ids (its tokenizer has {self.tokenizer_size:,}): the tokenizer or "
                             "its chat template makes ids the model cannot embed; use the model's own tokenizer")


@dataclass
class Shard:
    shard_id: int
    samples: list[int]  # rows of the SAMPLES table, in write order
    batches: list[int]  # start of each forward batch within `samples`
    first_sample_id: int  # the cache-wide id of its first sample
    nbytes: int
    cost: int  # padded tokens its forwards process


def record_sizes(layout: Layout, samples: np.ndarray, record_ids: list[str]) -> np.ndarray:
    """Every sample's bytes in a shard, from its length (and, in the fuelline format, its id's length)."""
    return layout.record_sizes(samples["length"], [len(r.encode("utf-8")) for r in record_ids])


def plan_shards(samples: np.ndarray, sizes: np.ndarray, config: CacheConfig) -> list[Shard]:
    """Deal the length-sorted samples round-robin to the fewest shards that fit (see the module docstring)."""
    if len(samples) == 0:
        return []
    biggest = int(sizes.max())
    if biggest > config.max_shard_bytes:
        raise ValueError(f"one sample takes {biggest:,} bytes, more than --max-shard-bytes {config.max_shard_bytes:,}")
    order = np.lexsort((np.arange(len(samples)), samples["length"]))
    count = min(len(samples), max(config.min_shards, math.ceil(int(sizes.sum()) / config.max_shard_bytes)))
    while True:
        members = [order[k::count] for k in range(count)]
        if all(int(sizes[m].sum()) <= config.max_shard_bytes for m in members):
            break
        count += 1
    shards, first = [], 0
    for shard_id, member in enumerate(members):
        batches, cost, start = [], 0, 0
        lengths = samples["length"][member].astype(np.int64)
        while start < len(member):  # ascending lengths: a batch's longest sample is its last
            end = start + 1
            while end < len(member) and (end + 1 - start) * lengths[end] <= config.batch_tokens:
                end += 1
            batches.append(start)
            cost += (end - start) * int(lengths[end - 1])
            start = end
        shards.append(Shard(shard_id, member.tolist(), batches, first, int(sizes[member].sum()), cost))
        first += len(member)
    return shards


def assign(shards: list[Shard], world_size: int) -> list[list[int]]:
    """Shard ids for each rank: the costliest shard to the least loaded rank, in turn."""
    load = [0] * world_size
    work: list[list[int]] = [[] for _ in range(world_size)]
    for shard in sorted(shards, key=lambda s: (-s.cost, s.shard_id)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        work[rank].append(shard.shard_id)
        load[rank] += shard.cost
    return [sorted(ids) for ids in work]


@dataclass
class Plan:
    """The build's plan as stored in `.build/plan.json`, with the token arrays beside it."""

    directory: Path
    identity: dict
    hidden_size: int
    records_in: int
    dropped: dict[str, int]
    truncated: int
    record_ids: list[str]
    shards: list[Shard]
    drop_examples: dict[str, str] = field(default_factory=dict)  # the first dropped record of each reason
    # where the encoded tokens lie: this plan's `.build/`, or a stream's for one of its partitions
    tokens_dir: Path | None = None

    @property
    def build_dir(self) -> Path:
        return self.directory / BUILD_DIR

    def save(self) -> None:
        payload = {k: v for k, v in asdict(self).items() if k not in ("directory", "tokens_dir")}
        write_bytes_atomic(self.build_dir / "plan.json", orjson.dumps(payload))

    @classmethod
    def load(cls, directory: Path) -> "Plan | None":
        path = directory / BUILD_DIR / "plan.json"
        if not path.exists():
            return None
        data = orjson.loads(path.read_bytes())
        data["shards"] = [Shard(**s) for s in data["shards"]]
        return cls(directory=directory, **data)

    def tokens(self):
        """(samples, input_ids, loss_mask): the SAMPLES table and the memory-mapped token arrays."""
        where = self.tokens_dir or self.build_dir
        samples = np.load(where / "samples.npy")
        ids = np.memmap(where / "input_ids.bin", dtype="<i4", mode="r") if samples.size else np.zeros(0, "<i4")
        mask = np.memmap(where / "loss_mask.bin", dtype="u1", mode="r") if samples.size else np.zeros(0, "u1")
        return samples, ids, mask

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


def make_plan(directory: Path, inputs: list[str], model: str | os.PathLike, config: CacheConfig, identity: dict,
              text, progress: bool = True) -> Plan:
    """Encode the inputs into `.build/` and fix the shards; written atomically, plan.json last. `text`:
    the model's text config (its hidden size sizes the records, its vocab_size bounds the ids)."""
    build = directory / BUILD_DIR
    build.mkdir(parents=True, exist_ok=True)
    with (Rejects(build / REJECTS) as rejects, atomic_write(build / "input_ids.bin") as ids_file,
          atomic_write(build / "loss_mask.bin") as mask_file):
        encoded = encode_inputs(inputs, model, config, ids_file, mask_file, rejects, progress, text.vocab_size)
    with atomic_write(build / "samples.npy") as f:
        np.save(f, encoded.samples)
    layout = layout_for(config, text.hidden_size)
    shards = plan_shards(encoded.samples, record_sizes(layout, encoded.samples, encoded.record_ids), config)
    plan = Plan(directory, identity, text.hidden_size, encoded.records_in, encoded.dropped, encoded.truncated,
                encoded.record_ids, shards, encoded.drop_examples)
    plan.save()
    return plan
