"""`fuelline cache stream`: the target cache built partition by partition into a bounded window on
disk, while trainers read it (`StreamingCacheDataset`) and acknowledge what they have read.

The plan is the offline build's (`plan.py`): the same encoded conversations and the same forward
batches. Each epoch deals those batches, in an order drawn from (seed, epoch), into partitions of
at most `--partition-samples` samples (whole batches: a sample's forward batch, and so its bytes,
equal the offline build's). A partition is built as a complete cache of either format
(`forward.py`, `merge.py`: manifest last) under `epoch-E/part-P/`, by one process or by torchrun
ranks that share its shards. Before each partition the builder makes room: it deletes every
partition that every consumer named by `--consumers` has acknowledged, and waits, naming the
consumers it waits for, while `--window` partitions (or `--max-disk` bytes) are published. The
disk never holds more than the window plus the partition being written.

Killed, the same command resumes: published partitions stay, the one being built resumes after
its last committed batch, and a partition whose directory was removed (damaged, say) is built
again, to the same bytes. The layout and the states are in `fuelline.formats.target_stream`.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fuelline.cache.build import build_identity, make_plan_or_leave_nothing, on_rank_zero, write_everywhere
from fuelline.cache.capture import check_layer_ids
from fuelline.cache.forward import load_target, write_shards
from fuelline.cache.merge import merge
from fuelline.cache.plan import BUILD_DIR, CacheConfig, Plan, Shard, assign, layout_for, model_config, record_sizes
from fuelline.cache.ranks import Ranks
from fuelline.cache.writer import shard_done
from fuelline.formats.target_cache import MANIFEST
from fuelline.formats.target_stream import (BUILDER, CONSUMERS, HEARTBEAT_SECONDS, STREAM_FORMAT, STREAM_MANIFEST,
                                            STREAM_VERSION, StreamError, acknowledged, epoch_name, needed,
                                            partition_name, read_stream_manifest, room, write_heartbeat,
                                            write_stream_manifest)
from fuelline.model_source import resolve_model
from fuelline.pipeline.options import identity_history, option, read_paths
from fuelline.pipeline.stats import StepStats
from fuelline.pipeline.workdir import WorkDir

POLL_SECONDS = 0.2  # how often a waiting builder looks for acknowledgements (a directory listing each)
SAY_EVERY = 30.0  # seconds between two "still waiting" lines
# What the stream writes into its output (`fuelline.io.step_files`): its manifest, the builder's heartbeat,
# the consumers' acknowledgements, each epoch's partitions and .build/, where a partition's batches wait
STREAM_WRITES = (STREAM_MANIFEST, BUILDER, CONSUMERS, f"{epoch_name(0)[:-4]}*", BUILD_DIR)


@dataclass
class StreamConfig(CacheConfig):
    """A cache build's options, and how its partitions are cut, kept and handed over."""

    partition_samples: int = option(4096, "samples in a partition at most (whole forward batches; a batch larger "
                                          "than this is a partition of its own)", min=1)
    epochs: int = option(1, "passes over the conversations; each builds its partitions again, same bytes in a "
                            "new order (target compute traded for disk)", min=1)
    seed: int = option(0, "draws each epoch's order of the forward batches")
    consumers: list[str] = option(factory=lambda: ["train"], comma_list=True, identity=False,
                                  help="every reader that must acknowledge a partition before it is deleted")
    window: int = option(4, "published partitions on disk at most; beyond it the builder waits for "
                            "acknowledgements", min=1, identity=False)
    max_disk: int = option(0, "bytes of published partitions at most, besides --window (0: no byte limit)",
                           size=True, min=0, identity=False)
    wait_timeout: float = option(0.0, "seconds to wait for an acknowledgement before stopping with an error that "
                                      "names the consumers (0: wait as long as it takes)", min=0, identity=False)


def forward_batches(plan: Plan) -> list[list[int]]:
    """The plan's forward batches (rows of its SAMPLES table), shard by shard."""
    batches = []
    for shard in plan.shards:
        bounds = shard.batches + [len(shard.samples)]
        batches += [shard.samples[start:end] for start, end in zip(bounds, bounds[1:])]
    return batches


def cut_epoch(batches: list[list[int]], config: StreamConfig, epoch: int) -> list[list[int]]:
    """Batch numbers of each partition of `epoch`: the batches in the order (seed, epoch) draws,
    cut before the batch that would take a partition past `partition_samples`."""
    order = np.random.default_rng([config.seed, epoch]).permutation(len(batches)).tolist()
    partitions, current, count = [], [], 0
    for number in order:
        if current and count + len(batches[number]) > config.partition_samples:
            partitions.append(current)
            current, count = [], 0
        current.append(number)
        count += len(batches[number])
    return partitions + [current] if current else partitions


def partition_plan(plan: Plan, batches: list[list[int]], numbers: list[int], lengths: np.ndarray, sizes: np.ndarray,
                   config: CacheConfig, directory: Path) -> Plan:
    """The plan of one partition: its batches dealt round-robin to the fewest shards (at least
    `min_shards`, so ranks share it) that keep each under `max_shard_bytes`; tokens read from the
    stream's `.build/`."""
    count = min(len(numbers), config.min_shards)
    while True:
        members = [numbers[k::count] for k in range(count)]
        if all(sum(int(sizes[batches[n]].sum()) for n in m) <= config.max_shard_bytes for m in members):
            break
        count += 1
    shards, first = [], 0
    for shard_id, member in enumerate(members):
        rows, starts, cost = [], [], 0
        for n in member:
            starts.append(len(rows))
            rows += batches[n]
            cost += len(batches[n]) * int(lengths[batches[n]].max())
        shards.append(Shard(shard_id, rows, starts, first, int(sizes[rows].sum()), cost))
        first += len(rows)
    return Plan(directory, plan.identity, plan.hidden_size, first, {}, 0, plan.record_ids, shards,
                tokens_dir=plan.build_dir)


class Partitions:
    """Every partition of every epoch, as each rank derives them from the plan and the options."""

    def __init__(self, plan: Plan, config: StreamConfig):
        self.plan, self.config = plan, config
        self.batches = forward_batches(plan)
        samples, _, _ = plan.tokens()
        self.lengths = samples["length"]
        self.sizes = record_sizes(layout_for(config, plan.hidden_size), samples, plan.record_ids)
        self.epochs = [cut_epoch(self.batches, config, epoch) for epoch in range(config.epochs)]

    def __iter__(self):
        for epoch, partitions in enumerate(self.epochs):
            for index, numbers in enumerate(partitions):
                rows = [row for n in numbers for row in self.batches[n]]
                yield epoch, index, rows

    def plan_of(self, epoch: int, index: int) -> Plan:
        directory = self.plan.directory / partition_name(epoch, index)
        return partition_plan(self.plan, self.batches, self.epochs[epoch][index], self.lengths, self.sizes,
                              self.config, directory)


def stream_cache(model: str | os.PathLike, inputs: list[str], output: str | os.PathLike, config: StreamConfig,
                 progress: bool = True, ranks: Ranks | None = None, restart: bool = False) -> dict:
    """Build the stream at `output` (or resume it) until every partition of every epoch is published
    and acknowledged; returns its stats (on every rank). Arguments as `build_cache`'s."""
    name, model = resolve_model(model)
    ranks = ranks or Ranks()
    ranks.connect()
    output = Path(output)
    try:
        builder = None
        if ranks.rank == 0:
            step_dir = WorkDir(output, build_identity(model, inputs, config, name), **identity_history(StreamConfig),
                               reads=[*inputs, model, *read_paths(config)], writes=STREAM_WRITES)
            with step_dir.lock():
                if restart:
                    step_dir.restart()
                builder = StreamBuilder(step_dir, config, progress)
                try:
                    return _run(ranks, model, inputs, config, progress, output, builder)
                finally:
                    builder.close()
        return _run(ranks, model, inputs, config, progress, output, builder)
    finally:
        ranks.close()


def _run(ranks: Ranks, model: Path, inputs, config: StreamConfig, progress: bool, output: Path,
         builder: StreamBuilder | None) -> dict:
    state = on_rank_zero(ranks, lambda: builder.prepare(model, inputs))
    if state.get("finished"):
        return state["finished"]
    partitions = Partitions(Plan.load(output), config)
    on_rank_zero(ranks, lambda: builder.start(partitions))
    target = load_target(ranks, model, config, progress)
    while True:
        job = on_rank_zero(ranks, lambda: builder.next_job(ranks.world_size))
        if "finished" in job:
            return job["finished"]
        epoch, index = job["partition"]
        plan = partitions.plan_of(epoch, index)
        mine = job["assignment"][ranks.rank]
        write_everywhere(ranks, lambda: mine and write_shards(ranks, target, plan, config, mine, progress),
                         f"the partitions published and the batches written are kept in {output}: the same "
                         "command resumes there")
        on_rank_zero(ranks, lambda: builder.publish(epoch, index, plan))


DELETE_TRIES, DELETE_PAUSE = 4, 0.5  # a partition's delete is tried this many times, this far apart


def remove(directory: Path) -> None:
    """Delete a partition's directory, or stop with an error naming it: a partition left on disk while
    the stream counts it gone would break the disk bound unseen."""
    for attempt in range(DELETE_TRIES):
        try:
            shutil.rmtree(directory)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if attempt + 1 == DELETE_TRIES:
                raise StreamError(directory, f"cannot be deleted ({e}); it still holds disk the window counts "
                                             "as free: remove it by hand (every consumer has acknowledged it) "
                                             "and run the same command again") from None
            time.sleep(DELETE_PAUSE)


def disk_bytes(stream: Path) -> int:
    """Bytes of every file under the stream's partition directories, as they are on disk now."""
    total = 0
    for epoch in stream.glob("epoch-*"):
        for folder, _, names in os.walk(epoch):
            for name in names:
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except FileNotFoundError:  # deleted while walked
                    pass
    return total


class Heartbeat(threading.Thread):
    """Says every few seconds, in `builder.json`, that the builder runs: a reader waiting for a partition
    can then tell a busy builder from one that stopped (which no lock shows across machines)."""

    def __init__(self, path: Path):
        super().__init__(name="stream-heartbeat", daemon=True)
        self.path, self.stopped = path, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            write_heartbeat(self.path)
            self.stopped.wait(HEARTBEAT_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join()
        (self.path / BUILDER).unlink(missing_ok=True)


class StreamBuilder:
    """Rank 0's side of a stream: its plan, its manifest, the window and the consumers' acknowledgements."""

    def __init__(self, step_dir: WorkDir, config: StreamConfig, progress: bool):
        self.step_dir, self.config, self.progress = step_dir, config, progress
        self.path = step_dir.path
        self.manifest: dict = {}
        self.waited = 0.0  # seconds spent waiting for acknowledgements
        self.stalled: tuple = ((), 0.0, 0.0)  # (what is waited for, since when, how long at the last line said)
        self.heartbeat = Heartbeat(self.path)

    def close(self) -> None:
        self.heartbeat.stop()

    def prepare(self, model: Path, inputs) -> dict:
        """The finished stream's stats, or the plan made or found (the stream manifest written with it)."""
        created = not self.path.exists()
        _, text = model_config(model)
        check_layer_ids(self.config.layers, text.num_hidden_layers)
        if (finished := self.step_dir.finished()) is not None:
            return {"finished": finished}
        self.step_dir.begin(lambda: (self.path / STREAM_MANIFEST).exists())
        if not self.step_dir.resumed or Plan.load(self.path) is None:
            shutil.rmtree(self.path / BUILD_DIR, ignore_errors=True)  # a plan never finished resumes nothing
            make_plan_or_leave_nothing(self.step_dir, created, inputs, model, self.config, text, self.progress)
        return {}

    def start(self, partitions: Partitions) -> None:
        """The manifest: found (its states checked against the disk) or written afresh."""
        self.partitions = partitions
        plan = partitions.plan
        entries = []
        for epoch, index, rows in partitions:
            entries.append({"name": partition_name(epoch, index), "epoch": epoch, "index": index,
                            "samples": len(rows), "tokens": int(partitions.lengths[rows].sum()),
                            "bytes": int(partitions.sizes[rows].sum()), "state": "planned"})
        previous = read_stream_manifest(self.path) if (self.path / STREAM_MANIFEST).exists() else {}
        states = {p["name"]: p["state"] for p in previous.get("partitions", [])}
        for entry in entries:
            entry["state"] = states.get(entry["name"], "planned")
        self.manifest = {
            "format": STREAM_FORMAT, "version": STREAM_VERSION, "epochs": self.config.epochs,
            "seed": self.config.seed, "partition_samples": self.config.partition_samples,
            "consumers": list(self.config.consumers), "window": self.config.window, "max_disk": self.config.max_disk,
            "cache_format": self.config.format, "hidden_dtype": self.config.hidden_dtype,
            "target_layer_ids": list(self.config.layers), "hidden_size": plan.hidden_size,
            "target_model_name_or_path": plan.identity["model"],
            "model_fingerprint": plan.identity["model_fingerprint"],
            "plan": {"samples": len(plan.record_ids), "tokens": int(partitions.lengths.sum()),
                     "batches": len(partitions.batches), "bytes_per_epoch": plan.total_bytes},
            "partitions": entries, "high_water_bytes": previous.get("high_water_bytes", 0),
        }
        self._check_consumers()
        self._save()
        self._reconcile()
        self.heartbeat.start()
        self._check_disk()

    def _check_consumers(self) -> None:
        """A window (or disk bound) with less room than a registered consumer may need at once is refused
        before anything is written: that consumer would wait for a partition this builder waits to
        publish until it acknowledges one it cannot acknowledge yet."""
        has = room(self.manifest)
        for name in self.config.consumers:
            if (need := needed(self.path, name)) > has:
                raise StreamError(self.path, f"consumer {name!r} may need {need} partitions on disk at once, and "
                                             f"--window {self.config.window}"
                                             f"{f' with --max-disk {self.config.max_disk:,}' if self.config.max_disk else ''}"
                                             f" leaves room for {has}: the two would wait on each other; resume with "
                                             f"--window {need} or more, or resume the consumer with a smaller "
                                             "shuffle_partitions or batch_size")

    def _check_disk(self) -> None:
        """The window's bytes, at most (`--window` + 1 of the largest partitions, or `--max-disk` and
        one), must fit beside what the stream already holds, unless `--force`."""
        largest = max((p["bytes"] for p in self.manifest["partitions"]), default=0)
        window = largest * (self.config.window + 1)
        if self.config.max_disk:
            window = min(window, self.config.max_disk + largest)
        needed = window - self._on_disk()[1]
        free = shutil.disk_usage(self.path).free
        if needed > free and not self.config.force:
            raise ValueError(f"the stream's window needs up to {needed / 2**30:,.2f} GiB more and {self.path} has "
                             f"{free / 2**30:,.2f} GiB free; lower --window or --partition-samples, or pass --force "
                             "to start anyway")

    def _save(self) -> None:
        write_stream_manifest(self.path, self.manifest)

    def _entries(self, *states: str) -> list[dict]:
        return [p for p in self.manifest["partitions"] if p["state"] in states]

    def _reconcile(self) -> None:
        """Bring every state in line with the disk and the acknowledgements: delete what every consumer
        has acknowledged; build again a published partition whose manifest is gone."""
        acks = {name: acknowledged(self.path, name) for name in self.config.consumers}
        before = [entry["state"] for entry in self.manifest["partitions"]]
        for entry in self._entries("published", "acknowledged", "building", "planned"):
            directory = self.path / entry["name"]
            key = (entry["epoch"], entry["index"])
            everyone = all(found is not None and key in found for found in acks.values())
            if entry["state"] in ("published", "acknowledged") and everyone:
                entry["state"] = "acknowledged"
                self._save()
                (directory / MANIFEST).unlink(missing_ok=True)  # no reader takes it for a cache any more
                remove(directory)
                entry["state"] = "deleted"
            elif entry["state"] in ("published", "acknowledged") and not (directory / MANIFEST).exists():
                remove(directory)  # removed or damaged: built again, same bytes
                entry["state"], entry["rebuilt"] = "planned", entry.get("rebuilt", 0) + 1
            elif entry["state"] in ("planned", "building") and (directory / MANIFEST).exists():
                entry["state"] = "published"  # a kill came after the partition's manifest, before this one's
        if [entry["state"] for entry in self.manifest["partitions"]] != before:
            self._save()

    def _measure(self) -> None:
        """The high-water mark: what the partition directories hold now, measured on disk (a partition
        that could not be deleted, or one larger than planned, counts as it is)."""
        self.manifest["high_water_bytes"] = max(self.manifest["high_water_bytes"], disk_bytes(self.path))

    def _on_disk(self) -> tuple[int, int]:
        """(partitions, bytes) published and not yet deleted."""
        held = self._entries("published", "acknowledged")
        return len(held), sum(p["bytes"] for p in held)

    def _room_for(self, entry: dict) -> bool:
        """A partition built again takes the place it had: the readers wait for it, and it waits for no one."""
        count, nbytes = self._on_disk()
        if count == 0 or entry.get("rebuilt"):
            return True
        return count < self.config.window and (not self.config.max_disk or nbytes + entry["bytes"] <= self.config.max_disk)

    def next_job(self, world_size: int) -> dict:
        """The next partition to build and each rank's shards of it, once the window has room; the
        stream's stats once every partition is published and acknowledged."""
        while True:
            self._reconcile()
            todo = self._entries("building", "planned")
            waiting_for = todo[0] if todo else None
            if waiting_for is None and not self._entries("published", "acknowledged"):
                return {"finished": self._finish()}
            if waiting_for is not None and self._room_for(waiting_for):
                break
            self._wait(waiting_for)
        self._measure()
        waiting_for["state"] = "building"
        self._save()
        plan = self.partitions.plan_of(waiting_for["epoch"], waiting_for["index"])
        plan.build_dir.mkdir(parents=True, exist_ok=True)
        remaining = [s for s in plan.shards if not shard_done(plan.build_dir, s.shard_id)]
        return {"partition": (waiting_for["epoch"], waiting_for["index"]), "assignment": assign(remaining, world_size)}

    def _wait(self, entry: dict | None) -> None:
        """One poll's wait for acknowledgements; a line naming who is waited for when it lasts, and an
        error once `wait_timeout` passes without progress."""
        oldest = self._entries("published", "acknowledged")[0]
        missing = self.lagging(oldest)
        if self.stalled[0] != (oldest["name"], *missing):
            self.stalled = ((oldest["name"], *missing), time.monotonic(), 0.0)
        waited = time.monotonic() - self.stalled[1]
        why = (f"waiting for {', '.join(missing)} to acknowledge {oldest['name']}"
               + (f" before building {entry['name']} (window {self.config.window}"
                  f"{f', max disk {self.config.max_disk:,} bytes' if self.config.max_disk else ''})" if entry
                  else " (every partition is published)"))
        if self.config.wait_timeout and waited > self.config.wait_timeout:
            raise StreamError(self.path, f"{why}: nothing acknowledged for {waited:.0f} s (--wait-timeout "
                                         f"{self.config.wait_timeout:g}); the same command resumes once the "
                                         "consumer runs again")
        if self.progress and waited - self.stalled[2] >= (SAY_EVERY if self.stalled[2] else 2.0):
            print(f"stream: {why} ({waited:.0f} s)", file=sys.stderr, flush=True)
            self.stalled = (*self.stalled[:2], waited)
        time.sleep(POLL_SECONDS)
        self.waited += POLL_SECONDS

    def lagging(self, entry: dict) -> list[str]:
        """The consumers that have not acknowledged `entry`, each with what it has done."""
        out = []
        for name in self.config.consumers:
            found = acknowledged(self.path, name)
            if found is None:
                out.append(f"consumer {name!r} (not started)")
            elif (entry["epoch"], entry["index"]) not in found:
                out.append(f"consumer {name!r} ({len(found)} partition(s) acknowledged)")
        return out

    def publish(self, epoch: int, index: int, plan: Plan) -> None:
        """Every shard of the partition written: merge it into a cache (manifest last), mark it published."""
        from fuelline.io.stage_layout import STATS_FILE

        merge(plan.directory, plan, self.config, lambda stats: stats.write(plan.directory, STATS_FILE))
        entry = next(p for p in self.manifest["partitions"] if (p["epoch"], p["index"]) == (epoch, index))
        entry["state"] = "published"
        self._measure()
        self._save()

    def _finish(self) -> dict:
        plan = self.partitions.plan
        manifest = self.manifest
        details = {"stream": {
            "epochs": self.config.epochs, "partitions": len(manifest["partitions"]),
            "samples_per_epoch": manifest["plan"]["samples"], "tokens_per_epoch": manifest["plan"]["tokens"],
            "bytes_per_epoch": manifest["plan"]["bytes_per_epoch"], "high_water_bytes": manifest["high_water_bytes"],
            "high_water_share": round(manifest["high_water_bytes"] / max(1, manifest["plan"]["bytes_per_epoch"]), 4),
            "window": self.config.window, "waited_seconds": round(self.waited, 1),
            "largest_partition_bytes": max((p["bytes"] for p in manifest["partitions"]), default=0)}}
        samples = len(plan.record_ids)
        for epoch in range(self.config.epochs):  # every partition is deleted: their directories are empty
            remove(self.path / epoch_name(epoch))
        stats = self.step_dir.finish(StepStats("cache", plan.records_in, samples, dict(plan.dropped),
                                               dict(plan.drop_examples), counters={"truncated": plan.truncated},
                                               details=details))
        shutil.rmtree(plan.build_dir, ignore_errors=True)  # the encoded tokens: nothing is left to build
        return stats

