"""Reading a streaming target cache while it is built: `StreamingCacheDataset`.

The samples of an epoch come in groups of `shuffle_partitions` partitions, in the stream's order.
Each group is shuffled from (seed, epoch, group), and rank r of R takes every R-th sample of the
epoch's sequence of shuffled groups (the n-th goes to rank n mod R, so the ranks' counts differ by
at most one, and DDP ranks take the same number of steps): the ranks' samples are disjoint and
together are every sample of the epoch, once. A rank's
samples form one sequence per epoch; its *position* (how many it has consumed) is its state, so
a checkpoint resumes at the right sample with any number of DataLoader workers. Workers take
`batch_size` consecutive positions in turn, which is the order a DataLoader with that batch size
hands the batches on, so `state_dict(after=batch)` is exact in the main process; several workers
without a `batch_size` are refused, and a batch whose positions are not one worker's run of
`batch_size` (another batch size in the DataLoader) is refused by `state_dict`, since the samples
before its last would not all have been consumed.

A partition is acknowledged for a rank once every sample of its group that the rank takes has
been yielded (`acknowledge="yielded"`; with DataLoader workers that is when a worker has
fetched it, ahead of the trainer by the loader's prefetch), or only when the trainer says its
checkpoint holds a state past the group (`acknowledge="checkpoint"`, `acknowledge(state)`): then a
consumer killed at any point resumes from its last checkpoint without losing a sample.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from fuelline.cache.dataset import CacheDataset
from fuelline.formats.target_cache import MANIFEST, CacheFormatError
from fuelline.formats.target_stream import (HEARTBEAT_SECONDS, STREAM_MANIFEST, StreamError, builder_silence,
                                            consumer_dir, fits, partition_name, rank_acknowledgements,
                                            read_stream_manifest, register_consumer, room, write_ack, write_need)
from fuelline.pipeline.options import check_number

SAY_AFTER, SAY_EVERY = 10.0, 60.0  # seconds of waiting before the first "waiting" line, and between lines
STATE_KEYS = ("consumer", "world_size", "seed", "shuffle_partitions")  # what must match to resume a state


class StreamingCacheDataset(IterableDataset):
    """The samples of a streaming target cache (`fuelline cache stream`), each once per epoch across
    `world_size` ranks; see the module docstring. Samples are `CacheDataset`'s, plus their
    `stream_position`. `consumer`: one of the names the stream was built for (its `--consumers`);
    `timeout`: seconds to wait for the stream's manifest, and then for each partition, before an
    error (None: as long as it takes, saying so on stderr)."""

    def __init__(self, path: str | os.PathLike, consumer: str = "train", *, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle_partitions: int = 1, batch_size: int | None = None,
                 acknowledge: str = "yielded",
                 timeout: float | None = None, poll_seconds: float = 0.2, io: str = "mmap",
                 verify_checksums: bool = True):
        for name, value, low in (("world_size", world_size, 1), ("rank", rank, 0), ("seed", seed, None),
                                 ("shuffle_partitions", shuffle_partitions, 1)):
            check_number(name, value, min=low)
        check_number("batch_size", batch_size, min=1, optional=True)
        check_number("timeout", timeout, min=0, whole=False, optional=True)
        check_number("poll_seconds", poll_seconds, min=0.001, whole=False)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), not {rank} of {world_size}")
        if acknowledge not in ("yielded", "checkpoint"):
            raise ValueError(f"acknowledge must be 'yielded' or 'checkpoint', not {acknowledge!r}")
        self.path = Path(path)
        self.consumer, self.rank, self.world_size, self.seed = consumer, rank, world_size, seed
        self.timeout, self.poll_seconds = timeout, poll_seconds
        self._wait(lambda: (self.path / STREAM_MANIFEST).exists(), "the stream's manifest",
                   lambda: "its builder writes it once the conversations are encoded")
        manifest = read_stream_manifest(self.path)
        if consumer not in manifest["consumers"]:
            raise StreamError(self.path, f"consumer {consumer!r} is not one this stream is built for "
                                         f"({', '.join(manifest['consumers'])}): its builder would delete "
                                         f"partitions before it reads them; add it to --consumers")
        self.manifest = manifest  # the stream's when opened: the target, its layers and hidden size, the plan
        self.shuffle_partitions, self.batch_size, self.acknowledge_mode = shuffle_partitions, batch_size, acknowledge
        self.io, self.verify_checksums = io, verify_checksums
        self.epochs = manifest["epochs"]
        self.sizes = [[p["samples"] for p in manifest["partitions"] if p["epoch"] == e] for e in range(self.epochs)]
        self.epoch, self.position, self.places = 0, 0, {}
        self._register(max(self._need(epoch, 0) for epoch in range(self.epochs)))
        register_consumer(self.path, consumer, world_size)

    # -- the window ------------------------------------------------------------------------------------
    def _places(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each of this rank's positions in `epoch`: its partition's place in the stream's order
        (epochs one after the other), the first place of its group, and of the group before it."""
        if epoch not in self.places:
            offset = sum(len(sizes) for sizes in self.sizes[:epoch])
            before = offset - len(self.sizes[epoch - 1]) + (len(self.sizes[epoch - 1]) - 1) // self.shuffle_partitions \
                * self.shuffle_partitions if epoch else offset
            parts, firsts, befores = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
            for members, partitions, _ in self.groups(epoch):
                parts.append(partitions + offset)
                firsts.append(np.full(len(partitions), members[0] + offset))
                befores.append(np.full(len(partitions), before))
                before = members[0] + offset
            self.places[epoch] = tuple(np.concatenate(found) for found in (parts, firsts, befores))
        return self.places[epoch]

    def _need(self, epoch: int, start: int) -> int:
        """The most partitions this rank may need on disk at once reading `epoch` from `start`: from the
        first of the group it reads (acknowledge="yielded"), or of the group before it, where the last
        checkpoint may lie, to the last one a batch needs ("checkpoint")."""
        parts, first, before = self._places(epoch)
        if start >= len(parts):
            return 1
        if self.acknowledge_mode == "yielded":
            return int((parts[start:] - first[start:]).max()) + 1
        starts = np.arange(start, len(parts), self.batch_size or 1)
        return int((np.maximum.reduceat(parts[start:], starts - start) - before[starts]).max()) + 1

    def _register(self, need: int) -> None:
        """Say what this rank may need (the builder refuses to resume with less room), and refuse to read
        with more need than the builder's window has room for: each would wait for the other."""
        self.need = need
        self._check_room(self.manifest)
        consumer_dir(self.path, self.consumer).mkdir(parents=True, exist_ok=True)
        write_need(self.path, self.consumer, self.rank, need)
        self._check_room(read_stream_manifest(self.path))  # a builder resumed meanwhile with a smaller window

    def _check_room(self, manifest: dict) -> None:
        if self.need > (has := room(manifest)):
            checkpoint = self.acknowledge_mode == "checkpoint"
            raise StreamError(self.path, f"consumer {self.consumer!r} rank {self.rank} may need {self.need} "
                                         f"partitions on disk at once (shuffle_partitions {self.shuffle_partitions}, "
                                         f"acknowledge {self.acknowledge_mode!r}"
                                         f"{f', batch_size {self.batch_size}' if checkpoint and self.batch_size else ''}"
                                         f"), and the builder's window (--window {manifest['window']}"
                                         f"{', --max-disk' if manifest.get('max_disk') else ''}) has room for {has}: "
                                         "each would wait for the other"
                                         f"{' (with checkpoint acknowledgements the window holds the group before too, where the last checkpoint may lie, and every group a batch spans)' if checkpoint else ''}"
                                         f"; lower shuffle_partitions or build with --window {self.need} or more")

    def _check_owed(self, manifest: dict, epoch: int, partition: int, batch_start: int) -> None:
        """Waiting for a partition the builder publishes only once this rank acknowledges an older one,
        when the trainer cannot acknowledge it before it gets this sample, is an error, not a wait
        that never ends (acknowledge="checkpoint" with too few checkpoints)."""
        if self.acknowledge_mode != "checkpoint":
            return
        order = [(p["epoch"], p["index"]) for p in manifest["partitions"]]
        acked = rank_acknowledgements(self.path, self.consumer)
        oldest = next((k for k, key in enumerate(order) if self.rank not in acked.get(key, ())), None)
        wanted = order.index((epoch, partition))
        if oldest is None or fits(manifest, oldest, wanted):
            return
        worker = get_worker_info() is not None
        if worker and fits(manifest, int(self._places(epoch)[1][batch_start]), wanted):
            return  # the trainer may still acknowledge the batches before this one
        raise StreamError(self.path / partition_name(epoch, partition),
                          f"would be waited for forever: the builder publishes it only once "
                          f"{partition_name(*order[oldest])} is acknowledged, and consumer {self.consumer!r} rank "
                          f"{self.rank} has not acknowledged it{' and cannot before this batch' if worker else ''}; "
                          "with acknowledge='checkpoint', call acknowledge(state) at least once in every group of "
                          "shuffle_partitions partitions read, or build with a larger --window")

    # -- the order -------------------------------------------------------------------------------------
    def groups(self, epoch: int) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """Each group of `epoch`: (its partitions, and this rank's samples in order as partition and
        sample arrays)."""
        sizes, out, before = self.sizes[epoch], [], 0
        for g, first in enumerate(range(0, len(sizes), self.shuffle_partitions)):
            members = list(range(first, min(first + self.shuffle_partitions, len(sizes))))
            bounds = np.cumsum([0] + [sizes[p] for p in members])
            shuffled = np.random.default_rng([self.seed, epoch, g]).permutation(int(bounds[-1]))
            order = shuffled[(self.rank - before) % self.world_size::self.world_size]
            before += int(bounds[-1])
            which = np.searchsorted(bounds, order, side="right") - 1
            out.append((members, np.asarray(members)[which], order - bounds[which]))
        return out

    def rank_samples(self, epoch: int | None = None) -> int:
        """How many samples this rank reads in `epoch` (its sequence's length)."""
        return sum(len(rows) for _, _, rows in self.groups(self.epoch if epoch is None else epoch))

    # -- the state -------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Read `epoch` next: from its start, or from the loaded state's position when it is that epoch's."""
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} is not one of the stream's {self.epochs}")
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self, after: dict | None = None) -> dict:
        """Where this rank stands: after everything yielded in this process, or, with DataLoader
        workers, `after` the last batch the trainer took (its `stream_positions`)."""
        position = self.position if after is None else self._after(after["stream_positions"].tolist())
        return {"consumer": self.consumer, "world_size": self.world_size, "seed": self.seed,
                "shuffle_partitions": self.shuffle_partitions, "rank": self.rank, "epoch": self.epoch,
                "position": position}

    def _after(self, positions: list[int]) -> int:
        """The position after a batch the trainer took, once its positions show that every sample
        before them was consumed too: read in this process, or one worker's run of `batch_size`."""
        last = max(positions) + 1
        if self.position == last and positions == list(range(last - len(positions), last)):
            return last  # read here, in order (no workers)
        run, first = self.batch_size, positions[0]
        whole = run is None or (len(positions) == run or last == self.rank_samples()) and (first - self.position) % run == 0
        if positions != list(range(first, last)) or not whole:
            raise ValueError(f"a batch of positions {positions[:8]}{' …' if len(positions) > 8 else ''} is not one "
                             f"DataLoader worker's run of batch_size {run} from position {self.position} of "
                             f"{self.path}: give StreamingCacheDataset the DataLoader's batch_size; a state after "
                             "it would skip samples the workers had not handed on")
        return last

    def load_state_dict(self, state: dict) -> None:
        """Resume at `state` (from `state_dict`); one taken with another order or consumer is refused."""
        mine = self.state_dict()
        differ = [f"{key} {state.get(key)!r} there, {mine[key]!r} here" for key in (*STATE_KEYS, "rank")
                  if state.get(key) != mine[key]]
        if differ:
            raise ValueError(f"this state belongs to another reading of {self.path} ({'; '.join(differ)}): "
                             "resuming it here would repeat or skip samples")
        if not 0 <= state["epoch"] < self.epochs or not 0 <= state["position"] <= self.rank_samples(state["epoch"]):
            raise ValueError(f"state epoch {state['epoch']} position {state['position']} is outside {self.path}")
        self._register(max(self._need(epoch, state["position"] if epoch == state["epoch"] else 0)
                           for epoch in range(state["epoch"], self.epochs)))
        self.epoch, self.position = state["epoch"], state["position"]

    def acknowledge(self, state: dict) -> None:
        """`acknowledge="checkpoint"`: the trainer's checkpoint holds `state`; every partition this rank
        has wholly read before it is acknowledged (and may be deleted by the builder)."""
        for epoch in range(state["epoch"] + 1):
            end = 0
            for members, _, rows in self.groups(epoch):
                end += len(rows)
                if epoch < state["epoch"] or end <= state["position"]:
                    for p in members:
                        self._ack(epoch, p, 0, 1)

    def _ack(self, epoch: int, partition: int, worker: int, workers: int) -> None:
        if not (consumer_dir(self.path, self.consumer) / "acks" /
                f"e{epoch}-p{partition}-r{self.rank}-w{worker}of{workers}").exists():
            write_ack(self.path, self.consumer, epoch, partition, self.rank, worker, workers)

    # -- reading ---------------------------------------------------------------------------------------
    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        if workers > 1 and self.batch_size is None:
            raise ValueError(f"{self.path}: {workers} DataLoader workers read it, and StreamingCacheDataset was "
                             "not given the DataLoader's batch_size: each worker takes that many consecutive "
                             "samples in turn, or a checkpoint's state would skip samples")
        run = self.batch_size or 1
        epoch, start = self.epoch, self.position
        position = 0
        for members, partitions, rows in self.groups(epoch):
            end = position + len(rows)
            if end > start:
                mine = [k for k in range(max(start, position), end) if ((k - start) // run) % workers == worker]
                opened = {}
                for k in mine:
                    p, i = int(partitions[k - position]), int(rows[k - position])
                    if p not in opened:
                        opened[p] = self._open(epoch, p, start + (k - start) // run * run)
                    sample = self._read(opened[p], i, epoch, p)
                    sample["stream_position"] = k
                    if info is None:
                        self.position = k + 1
                    yield sample
                for dataset in opened.values():
                    dataset.close()
            # also a group read before `start` (a resumed state's) or of which this rank takes no sample:
            # without its acknowledgement the builder would wait for this rank forever
            if self.acknowledge_mode == "yielded":
                for p in members:
                    self._ack(epoch, p, worker, workers)
            position = end

    def _open(self, epoch: int, partition: int, batch_start: int) -> CacheDataset:
        """The partition as a cache, once its builder has published it (`batch_start`: the position its
        sample's batch starts at)."""
        name = partition_name(epoch, partition)
        directory = self.path / name

        def state() -> str:
            manifest = read_stream_manifest(self.path)
            found = next(p["state"] for p in manifest["partitions"] if p["name"] == name)
            if found in ("acknowledged", "deleted"):
                raise StreamError(directory, f"deleted before consumer {self.consumer!r} rank {self.rank} read it: "
                                             "every consumer the builder waited for had acknowledged it, so this "
                                             "reader resumed from a state older than its acknowledgements "
                                             "(acknowledge='checkpoint' ties them to the trainer's checkpoints) or "
                                             "joined after it was deleted; build the stream again with --restart to "
                                             "read it")
            self._check_room(manifest)  # a builder resumed with a smaller window
            self._check_owed(manifest, epoch, partition, batch_start)
            silence = builder_silence(self.path)
            if silence is None or silence > 3 * HEARTBEAT_SECONDS:
                return (f"the stream says: {found}; no builder runs (run the same `fuelline cache stream` command "
                        "to go on)")
            return f"the stream says: {found}"

        self._wait(lambda: (directory / MANIFEST).exists(), name, state)
        dataset = CacheDataset(directory, io=self.io, verify_checksums=self.verify_checksums)
        if len(dataset) != self.sizes[epoch][partition]:  # the order is drawn from the stream's counts
            dataset.close()
            raise StreamError(directory, f"holds {len(dataset)} sample(s) where the stream's {STREAM_MANIFEST} says "
                                         f"{self.sizes[epoch][partition]}: one of the two is damaged (the builder "
                                         f"run again writes {STREAM_MANIFEST} anew); reading on would skip or repeat "
                                         "samples")
        return dataset

    def _wait(self, ready, what: str, why) -> None:
        """Poll until `ready()`, saying on stderr what is waited for (`why()`: the latest news, which may
        raise instead) when it lasts; an error once `timeout` passes."""
        started, said = time.monotonic(), 0.0
        while not ready():
            news, waited = why(), time.monotonic() - started
            if self.timeout is not None and waited > self.timeout:
                raise StreamError(self.path, f"{what} not published after {waited:.0f} s ({news}); is `fuelline "
                                             "cache stream` running? It may be waiting for another consumer's "
                                             "acknowledgements")
            if waited - said >= (SAY_EVERY if said else SAY_AFTER):
                print(f"stream consumer {self.consumer!r} rank {self.rank}: waiting for {what} "
                      f"({news}, {waited:.0f} s)", file=sys.stderr, flush=True)
                said = waited
            time.sleep(self.poll_seconds)

    def _read(self, dataset: CacheDataset, i: int, epoch: int, partition: int) -> dict:
        try:
            return dataset[i]
        except CacheFormatError as e:
            e.add_note(f"the builder builds {partition_name(epoch, partition)} again, to the same bytes, once its "
                       f"directory is removed (`rm -r {dataset.path}`, the builder running); then resume from the "
                       "last state")
            raise

