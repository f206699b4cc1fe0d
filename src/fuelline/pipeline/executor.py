"""Running a stage over input shards, resumably, on an executor: local processes or Ray tasks.

It writes the layout of a stage's output directory (`fuelline.io.stage_layout`), locally or at an
fsspec URL (`s3://bucket/clean`, `fuelline.pipeline.output`), under the one resume contract
(`fuelline.pipeline.workdir`); within it, a shard counts as finished only when its marker exists
and the sizes it records match the files on disk: a crash before the marker, or a truncated temp
file, means the shard is redone. Which executor ran (`fuelline.pipeline.workers`) is no part of
`_plan.json`: a run begun on one may be resumed on the other.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator, Sequence

import orjson

from fuelline.io.atomic import remove_temp_files
from fuelline.io.paths import as_sources, expand_inputs
from fuelline.io.readers import READ_ERROR_REASONS, iter_file_records
from fuelline.io.rejects import Rejects
from fuelline.io.stage_layout import DONE_DIR, PLAN_FILE, PREPARE_DIR, REJECTS_DIR, STAGE_PART_PREFIX, STAGE_WRITES
from fuelline.io.writers import RecordWriter, open_writer
from fuelline.pipeline.options import identity_history, identity_values, read_paths
from fuelline.pipeline.output import OutputStore, open_output
from fuelline.pipeline.shards import InputShard, describe_inputs, plan_shards
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage
from fuelline.pipeline.stats import StepStats, write_json
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import RESTART, WorkDir, not_a_step_output
from fuelline.pipeline.ray_executor import RayExecutor  # imports Ray itself only when it is opened
from fuelline.pipeline.workers import WORKER_BYTES, RunOptions, WorkerPool
from fuelline.progress import progress_bar
from fuelline.records import Location

PLAN_VERSION = 1
PROGRESS_EVERY = 4096


def output_targets(stage: Stage, output_dir: Path, locations: dict[str, str | os.PathLike] | None = None
                   ) -> dict[str, Path]:
    """Directory of each output's parts: the first in `output_dir`, others in `output_dir/NAME`.

    A stage with one unnamed output has the single key "". `locations` moves named outputs
    other than the first elsewhere (e.g. `--eval-output DIR`).
    """
    if not stage.outputs:
        if locations:
            raise ValueError(f"stage {stage.name!r} has one output; it takes no output locations")
        return {"": output_dir}
    unknown = sorted(set(locations or {}) - set(stage.outputs[1:]))
    if unknown:
        raise ValueError(f"stage {stage.name!r} cannot place output(s) {', '.join(unknown)}; "
                         f"its outputs are {', '.join(stage.outputs)} (the first is the stage directory)")
    targets = {stage.outputs[0]: output_dir}
    for name in stage.outputs[1:]:
        targets[name] = Path((locations or {}).get(name, output_dir / name))
    return targets


def open_executor(options: RunOptions, tasks: int) -> WorkerPool | RayExecutor:
    """The executor `options` ask for, with at most `tasks` workers where it starts them (and, here,
    as many as the memory holds)."""
    if options.executor == "ray":
        return RayExecutor(options.ray_address, options.resolved_workers(tasks))
    return WorkerPool(options.resolved_workers(tasks, worker_bytes=WORKER_BYTES))


def _write_shard_outputs(stage: Stage, records: Iterator[tuple[Location, dict]], ctx: ShardContext,
                         writers: dict[str, RecordWriter]) -> None:
    if not stage.outputs:
        write = writers[""].write
        for record in stage.process(records, ctx):
            write(record)
        return
    for name, record in stage.process(records, ctx):
        writers[name].write(record)


def run_shard(stage: Stage, shard: InputShard, store: OutputStore, targets: dict[str, Path], options: RunOptions,
              progress: Callable[[int], None] = lambda n: None) -> dict:
    """Process one shard: write its part files, its rejects and, last, its completion marker into
    the store's directory (`targets`: each output's); then publish them to the store, in that order."""
    output_dir = store.directory
    started = time.perf_counter()
    rejects_path = output_dir / REJECTS_DIR / f"{shard.part_name}.jsonl.zst" if options.keep_rejects else None
    rejects = Rejects(rejects_path)
    ctx = ShardContext(shard.shard_id, rejects, on_error=options.on_error)
    read = 0

    def located() -> Iterator[tuple[Location, dict]]:
        nonlocal read
        for line, record in iter_file_records(shard.source, start=shard.start, stop=shard.stop,
                                              on_error=options.on_error, rejects=rejects):
            read += 1
            if read % PROGRESS_EVERY == 0:
                progress(PROGRESS_EVERY)
            yield Location(shard.source, line), record

    with ExitStack() as files:  # committed when the shard is written, removed when anything raised
        files.enter_context(rejects)
        writers = {name: files.enter_context(open_writer(directory / shard.part_name, options.output_format))
                   for name, directory in targets.items()}
        _write_shard_outputs(stage, located(), ctx, writers)
    progress(read % PROGRESS_EVERY)
    unreadable = sum(rejects.counts[r] for r in READ_ERROR_REASONS)
    marker = {
        "shard": shard.shard_id,
        "records_in": read + unreadable,
        "records_out": sum(w.count for w in writers.values()),
        "dropped": dict(sorted(rejects.counts.items())),
        "drop_examples": dict(sorted(rejects.examples.items())),
        "counters": dict(sorted(ctx.counters.items())),
        "seconds": round(time.perf_counter() - started, 4),
        "files": {os.path.relpath(w.path, output_dir): w.path.stat().st_size for w in writers.values()},
    }
    if stage.outputs:
        marker["outputs"] = {name: w.count for name, w in writers.items()}
    if rejects.written:
        marker["files"][f"{REJECTS_DIR}/{rejects_path.name}"] = rejects_path.stat().st_size
    marker_name = f"{DONE_DIR}/{shard.part_name}.json"
    write_json(output_dir / marker_name, marker)
    store.publish([*marker["files"], marker_name])
    return marker


def _finished_marker(output_dir: Path, shard: InputShard, size_of: Callable[[str], int | None]) -> dict | None:
    """The shard's marker if the shard is complete (`size_of`: the finished files' sizes), else None."""
    try:
        marker = orjson.loads((output_dir / DONE_DIR / f"{shard.part_name}.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    for name, size in marker["files"].items():
        if size_of(name) != size:
            return None
    return marker


class _StageDir(WorkDir):
    """A stage's output directory in its store (a URL's staging directory), with the parts it
    wrote into other directories (`targets` outside it)."""

    def __init__(self, store: OutputStore, identity: dict, history: dict, outside: list[Path], *,
                 reads: list, writes: list, also: list):
        """`history`: `identity_history` of the stage's Config; `reads`, `also`: for the overlap rule;
        `writes`: its layout in the directory."""
        super().__init__(store.directory, identity, name=str(store), **history, reads=reads, writes=writes,
                         also=also)
        self.store, self.outside = store, outside

    def lock(self):
        return self.store.lock()

    def discard(self, by: str | None = RESTART) -> None:
        self.store.discard(self.writes, by)  # first: a URL that holds a file of its own refuses before anything goes
        super().discard(by)  # the directory the run writes (a URL's staging directory)
        for directory in self.outside:  # only the parts this stage wrote there
            for part in directory.glob(f"{STAGE_PART_PREFIX}*"):
                part.unlink()


def _prepare_output(step_dir: _StageDir, inputs: list[Path | str], options: RunOptions) -> list[InputShard]:
    """Make or find the plan (`WorkDir.begin`); return the shards of this run."""
    store = step_dir.store
    output_dir = store.directory

    def new_plan() -> dict:
        for directory in step_dir.outside:
            if directory.exists() and any(directory.iterdir()):
                raise not_a_step_output(directory)
        return {"shards": [s.to_json() for s in plan_shards(inputs, options.shard_size)]}

    plan = step_dir.begin(lambda: any((output_dir / DONE_DIR).glob("*.json")), new_plan)
    for directory in [output_dir, *step_dir.outside]:
        directory.mkdir(parents=True, exist_ok=True)
        if step_dir.resumed:
            remove_temp_files(directory)
    if not step_dir.resumed:
        store.publish([PLAN_FILE])
    return [InputShard(**s) for s in plan["shards"]]


def _found_finished(step_dir: _StageDir) -> dict | None:
    """The stats of this identity's finished output, as they are, when every shard of its plan is still
    whole: a rerun that has nothing to do writes nothing. A damaged shard is redone by the run instead."""
    if (done := step_dir.finished()) is None or (plan := step_dir.read_plan()) is None:
        return None
    shards = [InputShard(**s) for s in plan["shards"]]
    sizes = step_dir.store.sizes()
    if any(_finished_marker(step_dir.store.directory, s, sizes) is None for s in shards):
        return None
    return {**done, "resumed_shards": len(shards)}


def _identity(stage: Stage, inputs: list[Path | str], options: RunOptions, targets: dict[str, Path],
              output_dir: Path) -> dict:
    identity = {
        "version": PLAN_VERSION,
        "stage": stage.name, "config": identity_values(stage.config),
        "inputs": describe_inputs(inputs),
        "shard_size": options.shard_size,
        "output_format": options.output_format,
        "on_error": options.on_error,
    }
    if stage.outputs:
        identity["outputs"] = {name: os.path.relpath(d, output_dir) for name, d in targets.items()}
    if reads := stage.fingerprints():
        identity["reads"] = reads
    return identity


def aggregate_stats(stage: Stage, markers: list[dict]) -> StepStats:
    dropped: Counter = Counter()
    counters: Counter = Counter()
    outputs: Counter = Counter()
    examples: dict[str, str] = {}
    for m in markers:
        dropped.update(m["dropped"])
        for reason, example in m.get("drop_examples", {}).items():
            examples.setdefault(reason, example)
        counters.update(m["counters"])
        outputs.update(m.get("outputs", {}))
    details = {"seconds": round(sum(m["seconds"] for m in markers), 3), "shards": len(markers)}
    if stage.outputs:
        details["outputs"] = {name: outputs[name] for name in stage.outputs}
    return StepStats(stage.name, sum(m["records_in"] for m in markers), sum(m["records_out"] for m in markers),
                     dict(dropped), examples, dict(counters), details=details)


class RecordStep(Step):
    """A record stage as a pipeline step: run over its input's shards by `run_stage`."""

    produces_records = True
    uses_workers = True

    def __init__(self, stage: Stage):
        super().__init__(stage.config)
        self.stage = stage
        self.name, self.description, self.Config = stage.name, stage.description, type(stage).Config

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        return run_stage(self.stage, inputs, output, options)


def run_stage(stage: Stage, inputs, output_dir: str | os.PathLike, options: RunOptions | None = None,
              output_locations: dict[str, str | os.PathLike] | None = None, copies: Sequence[Path] = (),
              reads: Sequence[str | os.PathLike] = ()) -> dict:
    """Run `stage` over `inputs` (files, directories, globs) into `output_dir`; return its stats.

    Inputs and `output_dir` may be local paths or fsspec URLs (`s3://…`, `memory://…`). Finished
    shards of an earlier, interrupted run with the same options are kept. For a stage with
    several outputs, `output_locations` may put the outputs after the first elsewhere. `copies`:
    files the caller writes from the outputs once the stage is done (chat prepare's `.jsonl`
    outputs), outputs of the command too; `reads`: what else the caller read (a --config file), kept
    apart from the outputs as the inputs are.
    """
    options = options or RunOptions()  # its output_format checked where it was built
    store = open_output(output_dir)
    files = expand_inputs(inputs)
    targets = output_targets(stage, store.directory, store.locations(output_locations))
    outside = [d for d in targets.values() if not d.resolve().is_relative_to(store.directory.resolve())]
    # a further output is the stage's own at its default place, OUT/NAME; put elsewhere, it must lie apart
    moved = [d for name, d in list(targets.items())[1:] if d != store.directory / name]
    inside = [f"{name}/{STAGE_PART_PREFIX}*" for name, d in list(targets.items())[1:] if d not in outside]
    step_dir = _StageDir(store, _identity(stage, files, options, targets, store.directory),
                         identity_history(type(stage.config)), outside,
                         reads=[*as_sources(inputs), *read_paths(stage.config), *reads],
                         writes=[*STAGE_WRITES, *inside, *stage.writes], also=[*moved, *copies])
    with step_dir.lock():
        return _run_locked(stage, files, step_dir, options, targets)


def _run_locked(stage: Stage, files: list[Path | str], step_dir: _StageDir, options: RunOptions,
                targets: dict[str, Path]) -> dict:
    store = step_dir.store
    output_dir = store.directory
    store.pull()
    if options.restart:
        step_dir.restart()
    if (done := _found_finished(step_dir)) is not None:
        return done
    shards = _prepare_output(step_dir, files, options)
    finished = store.sizes()
    pending = [s for s in shards if _finished_marker(output_dir, s, finished) is None]
    total = None if any(s.units is None for s in pending) else sum(s.units for s in pending)
    if pending:
        with open_executor(options, len(shards)) as executor:
            stage.prepare(PrepareContext(files, shards, output_dir / PREPARE_DIR,
                                         functools.partial(executor.map, progress=options.progress)))
            run = functools.partial(run_shard, stage, store=store, targets=targets, options=options)
            with progress_bar(total=total, desc=stage.name, unit="rec", disable=not options.progress,
                              leave=False) as bar:
                executor.run_shards(run, pending, bar)
        for directory in [output_dir, *step_dir.outside]:
            remove_temp_files(directory)  # of a try whose worker died (Ray tries the shard again)
    markers = []
    finished = store.sizes()
    for shard in shards:
        marker = _finished_marker(output_dir, shard, finished)
        if marker is None:
            raise RuntimeError(f"{store}: shard {shard.part_name} did not finish")
        markers.append(marker)
    stats = aggregate_stats(stage, markers)
    stats.details.update(stage.summary(output_dir / PREPARE_DIR, stats.to_json()), resumed_shards=len(shards) - len(pending))
    written = step_dir.finish(stats)
    store.finish()
    return written
