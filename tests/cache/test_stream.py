"""`fuelline cache stream` and `StreamingCacheDataset` on a real tiny transformer: the disk bound,
exactly-once delivery through SIGKILLs of either side, bytes equal to an offline build's,
back-pressure that names who is waited for, damaged and killed partitions built again, DataLoader
workers resumed, and the refusals.

What the tests share is built once per module: offline caches of both formats (`build_cache`) and
`held`, a stream of two epochs that nobody reads, so every partition stays published (a window
larger than the stream, and a builder that stops waiting after half a second). Builders and
trainers that must be SIGKILLed, or whose disk use is measured while they run, are real
processes (`tests/cache/stream_trainer.py` is the trainer); the others run in this process.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fuelline.cache.build import build_cache  # noqa: E402
from fuelline.cache.dataset import CacheCollator, CacheDataset  # noqa: E402
from fuelline.cache.plan import CacheConfig  # noqa: E402
from fuelline.cache.stream import StreamConfig, stream_cache  # noqa: E402
from fuelline.cache.stream_dataset import StreamingCacheDataset  # noqa: E402
from fuelline.formats.target_cache import MANIFEST, CacheFormatError  # noqa: E402
from fuelline.formats.target_stream import STREAM_MANIFEST, StreamError, read_stream_manifest  # noqa: E402

from .stream_trainer import sample_digest  # noqa: E402
from .test_build import LAYERS, files_of, invoke, one_thread, write_chats  # noqa: E402,F401 (one_thread: autouse)
from .test_v2_independent_reader import FIELDS, read_v2  # noqa: E402

TRAINER = Path(__file__).with_name("stream_trainer.py")
CHATS = 36
OPTIONS = dict(layers=LAYERS, min_loss_tokens=1, batch_tokens=256, min_shards=2, device="cpu")
HELD = dict(partition_samples=6, epochs=2, window=64, wait_timeout=0.5)  # `held`: every partition stays


def options_args(**options) -> list[str]:
    """`options` (StreamConfig's) as command-line words."""
    words = []
    for name, value in {**OPTIONS, **options}.items():
        words += [f"--{name.replace('_', '-')}", ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return words


def stream_cli(model: Path, chats: Path, out: Path, *, quiet: bool = True, **options) -> list[str]:
    return [sys.executable, "-m", "fuelline", "cache", "stream", *(["--quiet"] if quiet else []), "--model", str(model),
            "-i", str(chats), "-o", str(out), *options_args(**options)]


def stream_config(**options) -> StreamConfig:
    return StreamConfig(**{**OPTIONS, **options})


def env() -> dict:
    # One thread per process, as in this one (`one_thread`): the same bytes as the offline build.
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def start(argv: list[str], log: Path) -> subprocess.Popen:
    """A process in a session of its own (its whole group is killed), stderr appended to `log`."""
    with open(log, "ab") as f:
        return subprocess.Popen(argv, env=env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=f)


def kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_for(condition, what: str, seconds: float = 120, process: subprocess.Popen | None = None, log=None):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if process is not None and process.poll() is not None:
            raise AssertionError(f"ended ({process.returncode}) before {what}: {log.read_text()[-3000:] if log else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.002)
    return found


def fields(sample: dict) -> dict:
    """A sample's fields as bytes (hidden states by their bits), its stream position left out."""
    return {name: value.contiguous().view(torch.uint8).numpy().tobytes() if isinstance(value, torch.Tensor) else value
            for name, value in sample.items() if name != "stream_position"}


def key_of(sample: dict):
    """A sample's identity: its record id (fuelline), or its token ids (deepspec-v2 keeps no id)."""
    return sample.get("record_id") or bytes(sample["input_ids"].numpy().tobytes())


def cache_samples(directory: Path) -> dict:
    dataset = CacheDataset(directory)
    samples = {key_of(dataset[i]): fields(dataset[i]) for i in range(len(dataset))}
    assert len(samples) == len(dataset)  # the keys are unique
    return samples


def published(stream: Path) -> list[dict]:
    return [p for p in read_stream_manifest(stream)["partitions"] if p["state"] == "published"]


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl", CHATS)


@pytest.fixture(scope="module")
def offline(qwen4_dir, chats, tmp_path_factory):
    """The offline builds with the stream's options: {format: {key: sample fields}}."""
    found = {}
    for fmt in ("fuelline", "deepspec-v2"):
        out = tmp_path_factory.mktemp("offline") / fmt
        build_cache(qwen4_dir, [str(chats)], out, CacheConfig(**OPTIONS, format=fmt), progress=False)
        found[fmt] = (out, cache_samples(out))
    return found


@pytest.fixture(scope="module")
def held(qwen4_dir, chats, tmp_path_factory):
    """A stream of two epochs whose partitions are all published and none read: its builder stopped
    waiting for consumer 'train'. Tests that build into it again work on a copy."""
    out = tmp_path_factory.mktemp("held") / "stream"
    with pytest.raises(StreamError, match="waiting for consumer 'train' \\(not started\\).*every partition is "
                                          "published.*--wait-timeout 0.5"):
        stream_cache(qwen4_dir, [str(chats)], out, stream_config(**HELD), progress=False)
    return out


class DiskPeak(threading.Thread):
    """The most bytes the partition directories (epoch-*/part-*, all they hold) held at one poll."""

    def __init__(self, stream: Path):
        super().__init__(daemon=True)
        self.stream, self.most, self.polls, self.stopped = stream, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.most = max(self.most, partition_bytes(self.stream))
            self.polls += 1
            time.sleep(0.002)


def partition_bytes(stream: Path) -> int:
    """Top-down, so a shard moved out of a partition's `.build/` into the partition is never counted twice."""
    total = 0
    for epoch in stream.glob("epoch-*"):
        for folder, _, names in os.walk(epoch):
            for name in names:
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except FileNotFoundError:  # deleted or renamed while walked
                    pass
    return total


# --- the disk bound, measured while a builder and a consumer run -----------------------------------

def test_disk_high_water_stays_under_window_plus_one_partition(qwen4_dir, chats, offline, tmp_path):
    """A slow consumer keeps the window full. What the partitions hold on disk, polled every few
    milliseconds, never exceeds (window + 1) × the largest partition; the builder's own high-water
    mark, counted from the partitions it built, is the measured peak up to the partitions' small
    files (manifest, stats). Every sample is read once, byte-equal to the offline build's."""
    out, window = tmp_path / "stream", 2
    log = tmp_path / "builder.log"
    builder = start(stream_cli(qwen4_dir, chats, out, partition_samples=6, window=window, wait_timeout=60), log)
    peak = DiskPeak(out)
    peak.start()
    read = []
    try:
        wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest", process=builder, log=log)
        for sample in StreamingCacheDataset(out, "train", timeout=60):
            read.append((sample["record_id"], fields(sample)))
            time.sleep(0.04)  # slower than the builder: it waits on the window
        assert builder.wait(60) == 0, log.read_text()[-3000:]
    finally:
        peak.stopped.set()
        kill(builder)
        peak.join()
    manifest = read_stream_manifest(out)
    largest = max(p["bytes"] for p in manifest["partitions"])
    stats = json.loads((out / "stats.json").read_text())["stream"]
    assert peak.polls > 100 and len(manifest["partitions"]) > 2 * window
    assert 0 < peak.most <= (window + 1) * largest
    assert stats["high_water_bytes"] == manifest["high_water_bytes"] <= window * largest
    metadata = 16 << 10  # a partition's manifest.json and stats.json, and its shards' index files while merged
    assert stats["high_water_bytes"] <= peak.most <= stats["high_water_bytes"] + window * metadata
    assert stats["waited_seconds"] > 0  # the window was full
    assert sorted(rid for rid, _ in read) == sorted(offline["fuelline"][1])
    assert all(sample == offline["fuelline"][1][rid] for rid, sample in read)
    assert not list(out.glob("epoch-*")) and not (out / ".build").exists()


# --- exactly once through SIGKILLs ------------------------------------------------------------------

def run_with_kills(model: Path, chats: Path, out: Path, logs: Path, kills: list[tuple[str, int]], pause: float,
                   **options) -> dict[str, list]:
    """A builder and two trainer ranks, each SIGKILLed (its whole group) once the trainers have together
    consumed the number of samples its kill names, and started again at once; the trainers' checkpoints
    once every process has ended."""
    checkpoints = {rank: logs / f"trainer-{rank}.json" for rank in (0, 1)}
    argv = {"builder": stream_cli(model, chats, out, **options),
            **{f"trainer-{rank}": [sys.executable, str(TRAINER), str(out), str(rank), "2", str(path), str(pause)]
               for rank, path in checkpoints.items()}}

    def consumed() -> int:
        total = 0
        for path in checkpoints.values():
            if path.exists():
                total += len(json.loads(path.read_bytes())["consumed"])
        return total

    processes = {name: start(words, logs / f"{name}.log") for name, words in argv.items()}
    pending = sorted(kills, key=lambda kill_: kill_[1])
    try:
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in processes.values()):
            assert time.monotonic() < deadline, f"not finished; kills left {pending}, consumed {consumed()}"
            while pending and consumed() >= pending[0][1]:
                name, at = pending.pop(0)
                assert processes[name].poll() is None, f"{name} ended before its kill at {at}"
                kill(processes[name])
                processes[name] = start(argv[name], logs / f"{name}.log")
            failed = {n: p.returncode for n, p in processes.items() if p.poll() not in (None, 0)}
            assert not failed, {n: (logs / f"{n}.log").read_text()[-2000:] for n in failed}
            time.sleep(0.01)
    finally:
        for process in processes.values():
            kill(process)
    assert not pending, f"the run ended before the kills {pending}"
    return {rank: json.loads(path.read_bytes())["consumed"] for rank, path in checkpoints.items()}


def assert_each_sample_once_per_epoch(consumed: dict[int, list], digests: dict[str, str], epochs: int) -> None:
    for epoch in range(epochs):
        ranks = [[rid for e, rid, _ in consumed[rank] if e == epoch] for rank in (0, 1)]
        assert set(ranks[0]).isdisjoint(ranks[1]), epoch
        assert sorted(ranks[0] + ranks[1]) == sorted(digests), epoch  # every record id once
    assert all(digest == digests[rid] for rank in (0, 1) for _, rid, digest in consumed[rank])


def kill_plan(rng: random.Random, count: int, total: int) -> list[tuple[str, int]]:
    """`count` kills (builder and both trainers first, then any), each after a random number of samples
    consumed, away from the start and the end (where a process may have ended)."""
    names = ["builder", "trainer-0", "trainer-1"]
    who = rng.sample(names, 3)[:count] + [rng.choice(names) for _ in range(count - 3)]
    return list(zip(who, sorted(rng.sample(range(4, total - 8), count))))


def test_two_trainer_ranks_read_each_sample_once_per_epoch_through_sigkills(qwen4_dir, chats, offline, tmp_path):
    """Two epochs read by rank 0 and 1 of a trainer, each rank a process; the builder, rank 0 and rank 1
    are each SIGKILLed once at seeded random points and started again (trainers from their last
    checkpoint): per epoch the two ranks' record ids are disjoint and together every record once,
    and every sample's bytes are the offline build's."""
    digests = {rid: sample_digest(CacheDataset(offline["fuelline"][0])[i])
               for i, rid in enumerate(_record_ids(offline["fuelline"][0]))}
    kills = kill_plan(random.Random(37), 3, 2 * CHATS)
    out = tmp_path / "stream"
    consumed = run_with_kills(qwen4_dir, chats, out, tmp_path, kills, 0.01, partition_samples=4, epochs=2, window=2,
                              wait_timeout=120)
    assert_each_sample_once_per_epoch(consumed, digests, 2)
    assert (out / "stats.json").exists() and not list(out.glob("epoch-*"))  # finished: every partition deleted


def _record_ids(cache: Path) -> list[str]:
    dataset = CacheDataset(cache)
    return [dataset[i]["record_id"] for i in range(len(dataset))]


@pytest.mark.slow
@pytest.mark.timeout(600)  # each seed: 80 conversations, 3 epochs, 7 kills, each a process started again
@pytest.mark.parametrize("seed", [1, 2])
def test_many_random_sigkills_of_builder_and_trainers(qwen4_dir, tmp_path, seed):
    """A variation of test_two_trainer_ranks_read_each_sample_once_per_epoch_through_sigkills: more
    conversations, three epochs, seven kills of any side, partitions of a random size."""
    rng = random.Random(seed)
    chats = write_chats(tmp_path / "chats.jsonl", 80, seed=seed)
    reference = tmp_path / "offline"
    build_cache(qwen4_dir, [str(chats)], reference, CacheConfig(**OPTIONS), progress=False)
    digests = {rid: sample_digest(CacheDataset(reference)[i]) for i, rid in enumerate(_record_ids(reference))}
    consumed = run_with_kills(qwen4_dir, chats, tmp_path / "stream", tmp_path, kill_plan(rng, 7, 3 * 80),
                              rng.choice([0.0, 0.01, 0.03]), partition_samples=rng.randint(2, 12), epochs=3,
                              window=rng.randint(1, 3), wait_timeout=300)
    assert_each_sample_once_per_epoch(consumed, digests, 3)
