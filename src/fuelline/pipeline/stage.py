"""What a stage is: a small object that turns the records of one shard into output records.

A stage knows nothing of processes, files or resume: the executor feeds it one shard's records
as `(location, record)` pairs and a `ShardContext`, writes what it yields, and counts what it
drops. Most stages only implement `apply(record, location)`, returning the new record or a
`Drop` with a named reason; stages that need the whole shard override `process`.

A stage that writes more than one dataset (chat-prepare: train and eval) names them in
`outputs` and yields `(output name, record)` pairs; the first output is its primary one, which
is what a later stage reads from the stage directory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

from fuelline.io.rejects import Rejects
from fuelline.pipeline.options import Options
from fuelline.pipeline.shards import InputShard
from fuelline.records import Drop, Location


@dataclass
class ShardContext:
    """Per-shard bookkeeping a stage may use: drop records, add counters (tokens, bytes, …); and the
    run's `on_error`, for a stage that finds a record it cannot use: raise, or drop it under its reason."""

    shard_id: int
    rejects: Rejects
    counters: Counter = field(default_factory=Counter)
    on_error: str = "raise"

    def drop(self, record: Any, reason: str, location: Location | None = None, detail: str | None = None) -> None:
        self.rejects.add(reason, record, source=location.source if location else None,
                         line=location.line if location else None, detail=detail)

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount


@dataclass
class PrepareContext:
    """What `Stage.prepare` may use: the inputs, the shard plan, a directory, and parallel map.

    `map(fn, items, desc)` runs a picklable `fn` over `items` on the executor's workers (local
    processes or Ray tasks) and returns the results in the order of `items`; the stage never sees
    processes. What `fn` writes goes under `workdir`, which every worker sees.
    """

    files: list[Path | str]  # a file at a URL is its URL: `iter_file_records` reads it
    shards: list[InputShard]
    workdir: Path
    map: Callable[[Callable[[Any], Any], Sequence[Any], str], list]


@dataclass
class StageConfig(Options):
    """Base of every stage's options (`option` fields): they become CLI options and pipeline-file keys."""


class Stage:
    """Base class. Subclasses set `name`, `Config` (a StageConfig dataclass) and `apply` or `process`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type[StageConfig]] = StageConfig
    outputs: ClassVar[tuple[str, ...]] = ()  # named outputs; empty: one unnamed output
    writes: ClassVar[tuple[str, ...]] = ()  # files it writes beside its parts (dedup's audit): --restart deletes them

    def __init__(self, config: StageConfig | None = None):
        self.config = config if config is not None else self.Config()

    def prepare(self, ctx: PrepareContext) -> None:
        """Corpus-level pass run once before the shards (counting lines, hashing documents, …).

        Whatever it learns is kept on `self` (the stage object travels to every worker) or in
        `ctx.workdir`, which survives an interrupted run. Most stages need nothing here.
        """

    def fingerprints(self) -> dict[str, str]:
        """Checksums of the files the stage reads besides its input (decontaminate's evaluation sets):
        part of its identity, so that an output made from other files is not taken for this one's."""
        return {}

    def summary(self, workdir: Path, stats: dict[str, Any]) -> dict[str, Any]:
        """Corpus-level numbers for stats.json that no single shard knows.

        Read from `workdir`, or reshaped from `stats`, the shards' summed counts and counters.
        """
        return {}

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        for location, record in records:
            result = self.apply(record, location)
            if isinstance(result, Drop):
                ctx.drop(record, result.reason, location, result.detail)
            else:
                yield result

    def apply(self, record: dict, location: Location) -> dict | Drop:
        raise NotImplementedError(f"stage {self.name!r} must implement apply() or process()")
