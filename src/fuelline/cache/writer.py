"""Writing shards: one shard's records with a commit per batch, and a writer thread behind a byte budget.

A shard is written to `.build/shard-NNNNN.bin.partial`, its index records to `.idx.partial`.
After each forward batch the records' bytes are fsynced, then their index records appended and
fsynced: the index says what is committed. Every record's offset is known from the plan, so a
resumed shard cuts both files back to the last whole batch the index holds and goes on from
there; the next batch is the one the plan says, with the same samples, so the bytes equal an
uninterrupted build's. A finished shard is renamed to `shard-NNNNN.bin` and `shard-NNNNN.idx`
(the index last: its presence means the shard is done).

`WriteQueue` runs the serialization and writes on one thread while the main thread runs the
next forward; `put` blocks only while the bytes queued exceed the budget, so memory stays
bounded and a slow disk slows the build instead of exhausting the host.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import numpy as np

from fuelline.cache.plan import Shard
from fuelline.formats.target_cache import Layout, checksum_of, index_entry, shard_name


def build_file(build_dir: Path, shard_id: int, suffix: str) -> Path:
    """A shard's file in `.build/`: `.bin` (its data, the cache's own file name), `.idx` (its index
    records), `.stats.json` (its timing); `.bin.partial` and `.idx.partial` while written."""
    return build_dir / (shard_name(shard_id).removesuffix(".bin") + suffix)


def shard_done(build_dir: Path, shard_id: int) -> bool:
    """Its index has its final name, and its data lies in `.build/` or already in the cache (a merge
    stopped midway moved it)."""
    data = build_file(build_dir, shard_id, ".bin")
    return build_file(build_dir, shard_id, ".idx").exists() and (data.exists() or (build_dir.parent / data.name).exists())


class ShardWriter:
    def __init__(self, build_dir: Path, shard: Shard, layout: Layout, offsets: np.ndarray):
        """`offsets[k]`: where the shard's k-th record starts (len(offsets) = records + 1)."""
        self.shard, self.layout, self.offsets = shard, layout, offsets
        self.data_path = build_file(build_dir, shard.shard_id, ".bin.partial")
        self.index_path = build_file(build_dir, shard.shard_id, ".idx.partial")
        self.done_data = build_file(build_dir, shard.shard_id, ".bin")
        self.done_index = build_file(build_dir, shard.shard_id, ".idx")
        self.index_dtype = layout.index_dtype()
        self.data = self.index = None

    def open(self) -> int:
        """Open for appending after the last committed whole batch; returns its first record's position."""
        committed = 0
        if self.index_path.exists() and self.data_path.exists():
            held = self.index_path.stat().st_size // self.index_dtype.itemsize
            written = self.data_path.stat().st_size
            # the last batch start at or below what both files hold
            committed = max((b for b in self.shard.batches if b <= held and self.offsets[b] <= written), default=0)
        self.data = open(self.data_path, "r+b" if committed else "wb")
        self.index = open(self.index_path, "r+b" if committed else "wb")
        self.data.truncate(int(self.offsets[committed]))
        self.index.truncate(committed * self.index_dtype.itemsize)
        self.data.seek(0, os.SEEK_END)
        self.index.seek(0, os.SEEK_END)
        return committed

    def write_batch(self, first: int, records: list[tuple[str, dict[str, np.ndarray], int]]) -> None:
        """Append the records at positions first, first+1, … ((record id, arrays, loss tokens) each) and commit."""
        index = np.zeros(len(records), self.index_dtype)
        for k, (record_id, arrays, loss_tokens) in enumerate(records):
            position = first + k
            offset = int(self.offsets[position])
            if self.data.tell() != offset:
                raise RuntimeError(f"{self.data_path}: record {position} would start at {self.data.tell():,}, "
                                   f"the plan says {offset:,}")
            parts, fields = self.layout.pieces(record_id, arrays)
            self.data.writelines(parts)
            index[k] = index_entry(self.layout, self.shard.first_sample_id + position, self.shard.shard_id,
                                   int(arrays["input_ids"].shape[0]), offset, fields, checksum_of(parts),
                                   len(record_id.encode("utf-8")), loss_tokens)
        self.data.flush()
        os.fsync(self.data.fileno())
        self.index.write(index.tobytes())
        self.index.flush()
        os.fsync(self.index.fileno())

    def finish(self) -> None:
        """Close and rename: data first, then the index, whose final name marks the shard done."""
        self.close()
        expected = int(self.offsets[-1])
        if self.data_path.stat().st_size != expected:
            raise RuntimeError(f"{self.data_path}: holds {self.data_path.stat().st_size:,} bytes, the plan says "
                               f"{expected:,}")
        os.replace(self.data_path, self.done_data)
        os.replace(self.index_path, self.done_index)

    def close(self) -> None:
        for f in (self.data, self.index):
            if f is not None and not f.closed:
                f.close()


class WriteQueue:
    """Runs jobs in order on one writer thread (or inline); `put` waits while `limit` bytes are queued."""

    def __init__(self, limit: int, threaded: bool = True):
        self.limit, self.threaded = limit, threaded
        self.queued = 0
        self.wait_seconds = 0.0  # time the caller spent blocked on the budget
        self.write_seconds = 0.0
        self._room = threading.Condition()
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cache-writer", daemon=True) if threaded else None
        if self._thread:
            self._thread.start()

    def put(self, job, nbytes: int) -> None:
        if not self.threaded:
            started = time.perf_counter()
            job()
            self.write_seconds += time.perf_counter() - started
            return
        started = time.perf_counter()
        with self._room:
            # one job bigger than the budget still goes, alone
            while self.queued and self.queued + nbytes > self.limit and self._error is None:
                self._room.wait()
            self.queued += nbytes
        self.wait_seconds += time.perf_counter() - started
        self._raise_if_failed()
        self._jobs.put((job, nbytes))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, nbytes = item
            started = time.perf_counter()
            try:
                if self._error is None:
                    job()
            except BaseException as e:  # handed to the main thread at its next put or close
                self._error = e
            self.write_seconds += time.perf_counter() - started
            with self._room:
                self.queued -= nbytes
                self._room.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for every job; re-raise the writer's error, if any."""
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        self._raise_if_failed()
