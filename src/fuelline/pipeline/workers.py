"""Where a stage's work runs: the options of a run, and the executors that run its tasks.

An executor only runs functions on items: `WorkerPool` (processes on this machine) and
`RayExecutor` (`fuelline.pipeline.ray_executor`, Ray tasks on a cluster) run the same function
over the same items and return the results in their order, so which one ran, like how many
workers, changes no byte of the output. Both are context managers (leaving one ends its workers)
with `map(fn, items, desc, progress=…)` (`Executor`) and `run_shards(run, shards, bar)`; the first
error a task raises is re-raised once the tasks not yet started are cancelled. The stage runner
(`fuelline.pipeline.executor`, which opens them) and the packer (`fuelline.pack.packer`) run on them.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Callable, Sequence

from tqdm import tqdm

from fuelline.io.bad_records import ON_ERROR
from fuelline.pipeline.lifetime import die_with_parent, quiet_on_interrupt, spawning_workers
from fuelline.pipeline.options import Options, option
from fuelline.pipeline.shards import InputShard
from fuelline.progress import progress_bar

EXECUTORS = ("local", "ray")
# What one local worker process holds besides the parent: the interpreter with numba, pyarrow and the
# tokenizers loaded, and a shard's buffers (40 to 200 MiB measured on the poetry corpus), rounded up.
WORKER_BYTES = 256 << 20
_said: set[str] = set()  # the worker caps already reported by this process


def on_error_option() -> Any:
    """`on_error`, declared once for the run options of record steps (`RunOptions`) and for pack's and
    cache build's own (`fuelline.chat.encoding_options.RecordErrors`). Two fields, one declaration:
    pack's and the cache's identities record it as their own option, a record step's as a run option."""
    return option("raise", "a record that cannot be read or used (malformed, or, for pack and the cache, one the "
                  "chat template cannot render): stop, naming FILE:LINE and its id (raise), or count it under a "
                  "named reason and keep it in _rejects/ (skip)", choices=list(ON_ERROR))


@dataclass
class RunOptions(Options):
    """How a step is run. output_format, shard_size, on_error and keep_rejects decide its output (its
    encoding, its shard files, what becomes of a bad record); the others only how it is made. Shared
    by every command that runs steps (`cli_options.run_params`) and a pipeline file's [defaults] and
    step tables; `restart` and `progress` are the command line's own (`--restart`, `--quiet`)."""

    workers: int | None = option(None, "how many run at once: processes (threads for cache export and vocab-map, "
                                 "whose work is reading and writing)  [default: one per core]", min=1, short="-w")
    shard_size: int = option(50_000, "records per shard: the unit of work of a worker and of resume", min=1)
    output_format: str = option("jsonl.zst", "output format of a record step", choices=["jsonl.zst", "parquet"],
                                flag="--format")
    on_error: str = on_error_option()
    keep_rejects: bool = option(True, "keep the records a step drops in _rejects/ (--no-rejects: count them only)",
                                flag="--rejects")
    restart: bool = option(False, "discard what the output directory holds", user=False)
    progress: bool = option(True, "progress bars", user=False)
    executor: str = option("local", "local: processes on this machine; ray: Ray tasks, same output (docs/ray.md)",
                           choices=list(EXECUTORS))
    ray_address: str | None = option(None, "--executor ray: the running cluster to use, auto or HOST:PORT (default: "
                                     "start one here for the run)")

    def __post_init__(self):
        super().__post_init__()
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError(f"ray_address {self.ray_address!r} is for the ray executor, but executor is "
                             f"{self.executor!r}: set executor to \"ray\" (--executor ray) or drop the address")

    def resolved_workers(self, tasks: int, *, worker_bytes: int | None = None) -> int:
        """How many workers to start for `tasks` tasks: those asked for (by default one per core), but
        never more than the tasks, nor than the available memory holds at `worker_bytes` a worker. A
        cap below an explicit --workers is said once on stderr: more workers than that only cost
        starting them (seconds each on a busy machine) and their memory, and change no byte."""
        caps = [(self.workers or len(os.sched_getaffinity(0)), ""),
                (tasks, f"the input has {tasks:,} shard{'s' * (tasks != 1)}")]
        if worker_bytes and (memory := available_memory()) is not None:
            caps.append((memory // worker_bytes, f"{memory / 2**30:.1f} GiB of memory is available, "
                                                 f"about {worker_bytes >> 20} MiB a worker"))
        workers, why = min(caps, key=lambda cap: cap[0])
        workers = max(1, workers)
        if self.workers is not None and workers < self.workers:
            _say_once(f"--workers {self.workers}: using {workers} ({why})")
        return workers


def available_memory() -> int | None:
    """The bytes this machine can still give without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


class Executor:
    """What both executors share: `map` over their `_gather(fn, items, desc, on_result)`, which runs `fn`
    on every item and hands each result over with its position as its task ends."""

    def map(self, fn: Callable, items: Sequence, desc: str, *, progress: bool) -> list:
        """`[fn(x) for x in items]`, on the workers, with a progress bar of finished items."""
        results: list = [None] * len(items)
        with progress_bar(total=len(items), desc=desc, disable=not progress, leave=False) as bar:
            def store(i: int, result) -> None:
                results[i] = result
                bar.update()

            self._gather(fn, items, desc, store)
        return results


class WorkerPool(Executor):
    """The processes of one stage run: started on first use, shared by `prepare` and the shards.

    Spawned, not forked (the parent may hold threads: pyarrow, tqdm); starting them and
    importing numba in each costs about a second, paid once per stage. With one worker
    everything runs in this process. Workers end when this process ends, however it ends
    (`fuelline.pipeline.lifetime`).
    """

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._updates = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self._pool is not None:
            # After success every task has ended and only the workers' own exit is left (0.2 s and
            # more with numba loaded): not waited for. After an error the running tasks are, so that
            # none still writes once the run has ended.
            self._pool.shutdown(wait=exc_type is not None, cancel_futures=True)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = get_context("spawn")
            self._updates = ctx.Queue()
            self._pool = _QuietPool(self.workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self._updates, os.getpid()))
        return self._pool

    def _gather(self, fn: Callable, items: Sequence, desc: str, on_result: Callable[[int, object], None],
                bar: tqdm | None = None) -> None:
        """Run `fn` on every item; results in completion order; the first error cancels the rest. `bar`
        counts what the workers report through their queue."""
        if self.workers == 1:
            for i, item in enumerate(items):
                on_result(i, fn(item))
            return
        futures = {self._executor().submit(fn, item): i for i, item in enumerate(items)}
        running = set(futures)
        try:
            while running:
                done, running = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                if bar is not None:
                    _drain(self._updates, bar)
                for future in done:
                    on_result(futures[future], future.result())  # a worker's error re-raised here
        except BaseException:
            for future in running:
                future.cancel()  # finished work stays finished; queued work is not started
            raise

    def run_shards(self, run: Callable[..., dict], shards: list[InputShard], bar: tqdm) -> None:
        """`run(shard, progress=…)` for every shard; a worker's progress reaches `bar` through a queue."""
        if self.workers == 1:
            for shard in shards:
                run(shard, progress=bar.update)
            return
        self._gather(functools.partial(_run_in_worker, run), shards, "shards", lambda i, marker: None, bar)
        _drain(self._updates, bar)


class _QuietPool(ProcessPoolExecutor):
    """Its workers start with SIGINT ignored (`spawning_workers` around each start, milliseconds), so
    that a Ctrl-C while one imports leaves no traceback of it."""

    def _spawn_process(self):
        with spawning_workers():
            super()._spawn_process()


_worker_updates = None


def _init_worker(updates, parent_pid: int) -> None:
    global _worker_updates
    die_with_parent(parent_pid)
    quiet_on_interrupt()
    _worker_updates = updates


def _run_in_worker(run: Callable[..., dict], shard: InputShard) -> dict:
    return run(shard, progress=_worker_updates.put)


def _drain(updates, bar: tqdm) -> None:
    while True:
        try:
            bar.update(updates.get_nowait())
        except queue.Empty:
            return
