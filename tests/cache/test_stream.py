"""`fuelline cache stream` and `StreamingCacheDataset` on a real tiny transformer: the disk bound,
exactly-once delivery through SIGKILLs of either side, bytes equal to an offline build's,
back-pressure that names who is waited for, damaged and killed partitions built again, DataLoader
workers resumed, and the refusals.

What the tests share is built once per module: offline caches of both formats (`build_cache`) and
`held`, a stream of two epochs that nobody reads, so every partition stays published (a window
larger than the stream, and a builder that stops waiting after half a second). Builders and
trainers that are SIGKILLed are real processes (`tests/cache/stream_trainer.py` is the trainer);
a builder beside a reader in this process runs in a thread of it (`Background`): a start of a
process less, seconds each.
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


def stream_words(model: Path, chats: Path, out: Path, *, quiet: bool = True, **options) -> list[str]:
    """`fuelline cache stream` with `options`: the words after `fuelline`."""
    return ["cache", "stream", *(["--quiet"] if quiet else []), "--model", str(model), "-i", str(chats), "-o", str(out),
            *options_args(**options)]


def stream_cli(model: Path, chats: Path, out: Path, **options) -> list[str]:
    return [sys.executable, "-m", "fuelline", *stream_words(model, chats, out, **options)]


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
            said = log.read_text()[-3000:] if log else ""
            raise AssertionError(f"ended ({process.returncode}) before {what}: {said}")
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
    return sample.get("record_id") or sample["input_ids"].numpy().tobytes()


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
    """The offline builds with the stream's options: {format: (directory, {key_of(sample): fields(sample)})}."""
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
    mark, measured on disk when it publishes, is at most the polled peak and holds the window. Every sample is read once, byte-equal to the offline build's."""
    out, window = tmp_path / "stream", 2
    peak = DiskPeak(out)
    peak.start()
    read = []
    try:
        with building(qwen4_dir, chats, out, partition_samples=6, window=window, wait_timeout=60) as builder:
            wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest")
            for sample in StreamingCacheDataset(out, "train", timeout=60):
                read.append((sample["record_id"], fields(sample)))
                time.sleep(0.04)  # slower than the builder: it waits on the window
    finally:
        peak.stopped.set()
        peak.join()
    manifest = read_stream_manifest(out)
    largest = max(p["bytes"] for p in manifest["partitions"])
    stats = builder.result["stream"]
    assert stats == json.loads((out / "stats.json").read_text())["stream"]
    assert peak.polls > 100 and len(manifest["partitions"]) > 2 * window
    assert 0 < peak.most <= (window + 1) * largest
    metadata = 16 << 10  # a partition's manifest.json and stats.json, and its shards' index files while merged
    assert stats["high_water_bytes"] == manifest["high_water_bytes"] <= window * (largest + metadata)
    assert (window - 1) * largest < stats["high_water_bytes"] <= peak.most
    assert stats["waited_seconds"] > 0  # the window was full
    assert sorted(rid for rid, _ in read) == sorted(offline["fuelline"][1])
    assert all(sample == offline["fuelline"][1][rid] for rid, sample in read)
    assert not list(out.glob("epoch-*")) and not (out / ".build").exists()


# --- exactly once through SIGKILLs ------------------------------------------------------------------

def run_with_kills(model: Path, chats: Path, out: Path, logs: Path, kills: list[tuple[str, int]], pause: float,
                   acknowledge: str = "checkpoint", **options) -> dict[str, list]:
    """A builder and two trainer ranks, each SIGKILLed (its whole group) once the trainers have together
    consumed the number of samples its kill names, and started again at once; the trainers' checkpoints
    once every process has ended."""
    checkpoints = {rank: logs / f"trainer-{rank}.json" for rank in (0, 1)}
    argv = {"builder": stream_cli(model, chats, out, **options),
            **{f"trainer-{rank}": [sys.executable, str(TRAINER), str(out), str(rank), "2", str(path), str(pause),
                                   acknowledge] for rank, path in checkpoints.items()}}

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
        assert abs(len(ranks[0]) - len(ranks[1])) <= 1, epoch  # DDP ranks take the same number of steps
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
@pytest.mark.timeout(300)  # each seed ~40 s: 80 conversations, 3 epochs, 7 kills, each a process started again
@pytest.mark.parametrize("seed", [1, 2])
def test_many_random_sigkills_of_builder_and_trainers(qwen4_dir, tmp_path, seed):
    """A variation of test_two_trainer_ranks_read_each_sample_once_per_epoch_through_sigkills: more
    conversations, three epochs, seven kills of any side, partitions of a random size, and trainers
    that acknowledge what they yield (seed 1) instead of their checkpoints (then with a window of at
    least 2: a checkpoint may lie in the partition before the one read)."""
    rng = random.Random(seed)
    chats = write_chats(tmp_path / "chats.jsonl", 80, seed=seed)
    reference = tmp_path / "offline"
    build_cache(qwen4_dir, [str(chats)], reference, CacheConfig(**OPTIONS), progress=False)
    digests = {rid: sample_digest(CacheDataset(reference)[i]) for i, rid in enumerate(_record_ids(reference))}
    consumed = run_with_kills(qwen4_dir, chats, tmp_path / "stream", tmp_path, kill_plan(rng, 7, 3 * 80),
                              rng.choice([0.0, 0.01, 0.03]), ["yielded", "checkpoint"][seed - 1],
                              partition_samples=rng.randint(2, 12), epochs=3,
                              window=rng.randint(1, 3) if seed == 1 else rng.randint(2, 3), wait_timeout=300)
    assert_each_sample_once_per_epoch(consumed, digests, 3)


# --- the bytes: an offline build's, in every epoch and every format ---------------------------------

def test_partitions_equal_the_offline_build_sample_by_sample(held, offline):
    """Every partition of both epochs, read as the cache it is: every field of every sample equal to the
    offline build's sample of the same record id, and each epoch's partitions hold every record once."""
    manifest = read_stream_manifest(held)
    reference = offline["fuelline"][1]
    for epoch in range(2):
        seen = []
        for entry in [p for p in manifest["partitions"] if p["epoch"] == epoch]:
            samples = cache_samples(held / entry["name"])
            assert len(samples) == entry["samples"]
            assert all(sample == reference[rid] for rid, sample in samples.items()), entry["name"]
            seen += samples
        assert sorted(seen) == sorted(reference), epoch


def read_epochs(stream: Path, **reader) -> list[list[tuple[str, dict]]]:
    dataset = StreamingCacheDataset(stream, "train", acknowledge="checkpoint", timeout=10, **reader)
    epochs = []
    for epoch in range(dataset.epochs):
        dataset.set_epoch(epoch)
        epochs.append([(sample["record_id"], fields(sample)) for sample in dataset])
    return epochs


def test_each_epoch_has_the_same_bytes_in_another_order(held):
    first, second = read_epochs(held)
    assert sorted(rid for rid, _ in first) == sorted(rid for rid, _ in second)
    assert [rid for rid, _ in first] != [rid for rid, _ in second]
    assert dict(first) == dict(second)
    partitions = read_stream_manifest(held)["partitions"]
    order = [[p["samples"] for p in partitions if p["epoch"] == epoch] for epoch in range(2)]
    assert order[0] != order[1]  # the forward batches themselves are dealt anew, not only the samples


def test_a_published_deepspec_v2_partition_reads_with_deepspecs_rule_and_back_pressure_names_the_consumer(
        qwen4_dir, chats, offline, tmp_path):
    """Consumers 'train' and 'eval'; only 'train' reads. The builder publishes the window and no more,
    says it waits for consumer 'eval' (not started), and with --wait-timeout exits 2 naming it. A
    partition 'eval' holds on disk reads with the independent deepspec-v2 reader to the offline
    build's samples. Once 'eval' has read and acknowledged, the same build resumes and finishes
    while both read; every sample each once, byte-equal to the offline build's."""
    out, window = tmp_path / "stream", 2
    options = dict(format="deepspec-v2", consumers="train,eval", partition_samples=6, window=window)
    reference = offline["deepspec-v2"][1]
    read = {"train": [], "eval": []}
    with Background(lambda: invoke(*stream_words(qwen4_dir, chats, out, quiet=False, wait_timeout=2.5,
                                                 **options))) as stopped:
        wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest")
        train = StreamingCacheDataset(out, "train", acknowledge="checkpoint", timeout=60)
        readers = {"train": iter(train)}
        first = sum(p["samples"] for p in read_stream_manifest(out)["partitions"][:window])
        read["train"] += [next(readers["train"]) for _ in range(first)]
        train.acknowledge(train.state_dict())
    assert stopped.result.exit_code == 2
    said = stopped.result.stderr
    assert "Traceback" not in said
    assert (f"stream: waiting for consumer 'eval' (not started) to acknowledge epoch-0000/part-00000 before "
            f"building epoch-0000/part-0000{window} (window {window})") in said
    assert f"{out}: waiting for consumer 'eval' (not started) to acknowledge" in said
    assert "(--wait-timeout 2.5); the same command resumes once the consumer runs again" in said
    held = published(out)
    assert [p["index"] for p in held] == list(range(window))
    assert {p["state"] for p in read_stream_manifest(out)["partitions"][window:]} == {"planned"}
    assert sorted(p.parent.name for p in out.glob("epoch-*/*/manifest.json")) == [p["name"][-10:] for p in held]
    for entry in held:  # DeepSpec's reader rule, on partitions the builder keeps for 'eval'
        for sample in read_v2(out / entry["name"]):
            found = reference[sample["input_ids"].tobytes()]
            assert all(sample[name].tobytes() == found[name] for name in FIELDS if name in found), entry["name"]
            assert sample["attention_mask"].tolist() == [1] * len(sample["input_ids"])

    evaluation = StreamingCacheDataset(out, "eval", acknowledge="checkpoint", timeout=60)
    readers["eval"] = iter(evaluation)
    read["eval"] += [next(readers["eval"]) for _ in range(first)]
    evaluation.acknowledge(evaluation.state_dict())
    resumed = building(qwen4_dir, chats, out, **{**options, "consumers": ["train", "eval"]}, wait_timeout=60)
    with resumed:  # the two read in step: neither may run a window ahead of the other
        for pair in zip(readers["train"], readers["eval"]):
            for (name, dataset), sample in zip((("train", train), ("eval", evaluation)), pair):
                read[name].append(sample)
                dataset.acknowledge(dataset.state_dict())
    assert resumed.result["records_out"] == CHATS and not list(out.glob("epoch-*"))
    for name, samples in read.items():
        assert sorted(key_of(s) for s in samples) == sorted(reference), name
        assert all(fields(s) == reference[key_of(s)] for s in samples), name


class Background(threading.Thread):
    """`work()` in a thread of this process for the block of a `with`: its result, or its error raised
    at the end (a builder beside a reader in this process: no start of a process of its own)."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            self.error = e

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *failed) -> None:
        self.join(120)
        assert not self.is_alive(), "the work in the background did not end"
        if self.error is not None and not failed[0]:
            raise self.error


def building(model: Path, chats: Path, out: Path, **options) -> Background:
    return Background(lambda: stream_cache(model, [str(chats)], out, stream_config(**options), progress=False))


# --- faults: a builder killed mid-partition, a damaged partition -----------------------------------

def partitions_of(stream: Path) -> dict[str, dict[str, bytes]]:
    """Every published partition's files (its stats, which hold seconds, left out)."""
    return {entry["name"]: files_of(stream / entry["name"]) for entry in published(stream)}


def resume_held(model: Path, chats: Path, out: Path) -> None:
    """The held stream's build run again in `out`, until it waits for 'train' with every partition published."""
    with pytest.raises(StreamError, match="every partition is published"):
        stream_cache(model, [str(chats)], out, stream_config(**HELD), progress=False)


def test_a_builder_killed_mid_partition_resumes_to_the_partitions_of_an_uninterrupted_stream(qwen4_dir, chats, held,
                                                                                           tmp_path):
    out, log = tmp_path / "stream", tmp_path / "builder.log"
    builder = start(stream_cli(qwen4_dir, chats, out, **HELD), log)

    def batch_committed() -> bool:  # a partition's batch committed, the partition not yet published
        return len(list(out.glob("epoch-*/*/manifest.json"))) >= 2 and any(
            p.stat().st_size for p in out.glob("epoch-*/*/.build/*.idx.partial"))

    try:
        wait_for(batch_committed, "committed batch of an unpublished partition", process=builder, log=log)
    finally:
        kill(builder)
    building = [p for p in read_stream_manifest(out)["partitions"] if p["state"] == "building"]
    assert len(building) == 1 and not (out / building[0]["name"] / MANIFEST).exists()
    resume_held(qwen4_dir, chats, out)
    assert partitions_of(out) == partitions_of(held)
    assert not list(out.glob("epoch-*/*/.build"))


def test_a_damaged_partition_is_refused_naming_its_file_and_built_again_once_removed(qwen4_dir, chats, held,
                                                                                   tmp_path):
    out = tmp_path / "stream"
    shutil.copytree(held, out)
    name = read_stream_manifest(out)["partitions"][1]["name"]
    shard = sorted((out / name).glob("shard-*.bin"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x20
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError) as refused:
        read_epochs(out)
    assert str(refused.value).startswith(f"{shard}: ") and "checksum" in str(refused.value)
    assert any(f"rm -r {out / name}" in note for note in refused.value.__notes__)
    shutil.rmtree(out / name)
    resume_held(qwen4_dir, chats, out)
    assert partitions_of(out) == partitions_of(held)
    assert read_epochs(out) == read_epochs(held)


# --- DataLoader workers, and a trainer's checkpoint between batches ---------------------------------

@pytest.mark.parametrize("taken", [3, 8])
def test_dataloader_workers_resume_after_k_batches_with_exactly_the_rest(held, taken):
    """Two workers, batches of 3: `state_dict(after=batch)` after `taken` batches (within the first
    epoch's partitions, and past several), loaded into a new dataset and loader, continues with the
    samples the uninterrupted loader would have given, in its order: none repeated, none lost."""
    from torch.utils.data import DataLoader

    size = 3

    def loader(dataset):
        return DataLoader(dataset, batch_size=size, num_workers=2, collate_fn=CacheCollator())

    def reader():
        return StreamingCacheDataset(held, "train", batch_size=size, acknowledge="checkpoint", timeout=10)

    whole = [rid for batch in loader(reader()) for rid in batch["record_ids"]]
    assert whole == [rid for rid, _ in read_epochs(held)[0]]  # the workers hand the samples on in order
    first = reader()
    batches = iter(loader(first))
    before = [next(batches) for _ in range(taken)]
    state = first.state_dict(after=before[-1])
    del batches
    resumed = reader()
    resumed.load_state_dict(state)
    rest = [rid for batch in loader(resumed) for rid in batch["record_ids"]]
    assert [rid for batch in before for rid in batch["record_ids"]] + rest == whole
    assert state["position"] == taken * size


def test_a_dataloader_batch_size_the_dataset_was_not_given_is_refused_never_a_state_that_skips(held):
    """Batches of 4 from two workers, the dataset given no batch_size (each worker then took every other
    sample: a batch's positions 0, 2, 4, 6, and a state after it would skip 1, 3, 5) or another one (2:
    a batch of 4 spans two workers' runs; 8: a batch of 4 is half a run, the other worker's run before
    it unread): refused, at the first batch or at the state, naming batch_size. Without workers any
    batch size resumes with exactly the rest."""
    from torch.utils.data import DataLoader

    def loader(dataset, workers=2):
        return DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=CacheCollator())

    def reader(**options):
        return StreamingCacheDataset(held, "train", acknowledge="checkpoint", timeout=10, **options)

    with pytest.raises(ValueError, match="2 DataLoader workers read it, and StreamingCacheDataset was not given the "
                                         "DataLoader's batch_size"):
        next(iter(loader(reader())))
    for size in (2, 8):
        dataset = reader(batch_size=size)
        batches = iter(loader(dataset))
        taken = [next(batches) for _ in range(3)]
        with pytest.raises(ValueError, match=f"not one DataLoader worker's run of batch_size {size} from position 0"):
            for batch in taken:
                dataset.state_dict(after=batch)
        del batches
    whole = [rid for batch in loader(reader(), workers=0) for rid in batch["record_ids"]]
    first = reader()
    batches = iter(loader(first, workers=0))
    taken = [next(batches) for _ in range(5)]
    before = [rid for batch in taken for rid in batch["record_ids"]]
    resumed = reader()
    resumed.load_state_dict(first.state_dict(after=taken[-1]))
    assert before + [rid for batch in loader(resumed, workers=0) for rid in batch["record_ids"]] == whole


# --- refusals -------------------------------------------------------------------------------------

def test_readers_that_would_lose_or_repeat_samples_are_refused(held):
    with pytest.raises(StreamError, match="consumer 'eval' is not one this stream is built for \\(train\\).*"
                                          "add it to --consumers"):
        StreamingCacheDataset(held, "eval")
    train = StreamingCacheDataset(held, "train", acknowledge="checkpoint")
    with pytest.raises(StreamError, match="consumer 'train' read this stream with 1 rank\\(s\\), now with 2.*"
                                          "resume it with 1 rank"):
        StreamingCacheDataset(held, "train", rank=1, world_size=2)
    state = train.state_dict()
    for key, value, said in (("consumer", "eval", "consumer 'eval' there, 'train' here"),
                             ("seed", 1, "seed 1 there, 0 here"),
                             ("world_size", 2, "world_size 2 there, 1 here"),
                             ("shuffle_partitions", 2, "shuffle_partitions 2 there, 1 here")):
        with pytest.raises(ValueError, match=f"another reading of {held}.*{said}"):
            train.load_state_dict({**state, key: value})
    other_seed = StreamingCacheDataset(held, "train", seed=1, acknowledge="checkpoint")
    with pytest.raises(ValueError, match="seed 0 there, 1 here"):
        other_seed.load_state_dict(state)
    with pytest.raises(ValueError, match="position 999 is outside"):
        train.load_state_dict({**state, "position": 999})


@pytest.mark.parametrize("option, value, said", [
    ("--window", "0", "--window"),
    ("--partition-samples", "-3", "--partition-samples"),
    ("--epochs", "two", "--epochs"),
    ("--max-disk", "lots", "--max-disk"),
    ("--wait-timeout", "-1", "--wait-timeout"),
])
def test_a_bad_option_value_is_named(chats, tmp_path, option, value, said):
    done = invoke("cache", "stream", "--quiet", "--model", str(tmp_path / "no-model"), "-i", str(chats), "-o",
                  str(tmp_path / "stream"), "--layers", "0", option, value)
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert said in done.stderr and value in done.stderr, done.stderr
    assert not (tmp_path / "stream").exists()


@pytest.mark.parametrize("option, value", [("partition_samples", 5), ("seed", 1), ("epochs", 3)])
def test_a_resume_with_another_cut_or_order_is_refused_naming_the_option(qwen4_dir, chats, held, option, value):
    before = (held / STREAM_MANIFEST).read_bytes()
    done = invoke(*stream_words(qwen4_dir, chats, held, **{**HELD, option: value}))
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert f"different config.{option}; pass --restart" in done.stderr, done.stderr
    assert (held / STREAM_MANIFEST).read_bytes() == before


# --- acknowledging what is yielded ---------------------------------------------------------------

def test_yielded_acknowledgements_let_the_builder_finish_with_one_sample_partitions_and_a_resumed_rank(
        qwen4_dir, tmp_path):
    """Partitions of one forward batch (mostly one sample), a window of one, two ranks acknowledging what
    they yield (the default): a rank that takes no sample of a partition acknowledges it too, and rank
    0, stopped right after a partition's last sample and resumed from its state, acknowledges that
    partition; otherwise the builder would wait for them until its timeout. The two ranks read as
    many samples, though most partitions have one."""
    chats = write_chats(tmp_path / "chats.jsonl", 8, seed=5)
    out = tmp_path / "stream"
    read = {0: [], 1: []}
    with building(qwen4_dir, chats, out, partition_samples=1, window=1, wait_timeout=20) as builder:
        wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest", seconds=60)
        other = threading.Thread(target=lambda: read[1].extend(
            s["record_id"] for s in StreamingCacheDataset(out, "train", rank=1, world_size=2, timeout=30)))
        other.start()
        try:
            first = StreamingCacheDataset(out, "train", rank=0, world_size=2, timeout=30)
            read[0].append(next(iter(first))["record_id"])  # then stopped, before asking for the next
            resumed = StreamingCacheDataset(out, "train", rank=0, world_size=2, timeout=30)
            resumed.load_state_dict(first.state_dict())
            read[0] += [s["record_id"] for s in resumed]
        finally:
            other.join(60)
    assert builder.result["stream"]["partitions"] > 8 - 2  # a few forward batches have two samples
    assert set(read[0]).isdisjoint(read[1]) and sorted(read[0] + read[1]) == sorted(f"chat-{k}" for k in range(8))
    assert len(read[0]) == len(read[1])  # the n-th sample of the epoch goes to rank n mod 2, whatever the partitions


def test_a_stream_manifest_that_miscounts_a_partition_is_refused_naming_it(held, tmp_path):
    """The readers draw their order from the stream manifest's counts: one that says fewer samples than
    the partition holds would skip some silently, one that says more would read past its end."""
    for wrong in (-2, 1):
        out = tmp_path / f"stream{wrong}"
        shutil.copytree(held, out)
        manifest = read_stream_manifest(out)
        manifest["partitions"][1]["samples"] += wrong
        (out / STREAM_MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(StreamError, match=f"^{out / manifest['partitions'][1]['name']}: holds .* sample\\(s\\) "
                                              "where the stream's stream.json says"):
            read_epochs(out)


@pytest.mark.slow  # two torchrun starts; the two-rank proof of the build itself stays in the default part
@pytest.mark.timeout(600)
def test_two_torchrun_ranks_stream_the_partitions_of_one_process(qwen4_dir, chats, held, tmp_path):
    """Two builder ranks share each partition's shards: every partition, every epoch, equals the one-process
    stream's file for file (the plan, and so the bytes, never depend on the ranks)."""
    out, log = tmp_path / "stream", tmp_path / "torchrun.log"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "fuelline",
               *stream_words(qwen4_dir, chats, out, **HELD)]
    process = start(command, log)
    try:
        process.wait(timeout=540)
    finally:
        kill(process)
    assert "waiting for consumer 'train' (not started)" in log.read_text(), log.read_text()[-2000:]
    names = [p["name"] for p in published(held)]
    assert names and [p["name"] for p in published(out)] == names
    for name in names:
        assert files_of(out / name) == files_of(held / name), name


# --- a partition that cannot be deleted ------------------------------------------------------------

def test_a_partition_that_cannot_be_deleted_stops_the_builder_naming_it_and_the_disk_stays_bounded(
        qwen4_dir, chats, offline, tmp_path, monkeypatch):
    """The first partition's delete fails (its files stay, as on a file system that refuses): the
    builder tries again, then stops with an error naming the partition instead of counting it gone and
    building past the window; what the disk holds never exceeds the window. Once the delete works, the
    same command finishes and every sample was read once."""
    import fuelline.cache.stream as stream_module

    out, window = tmp_path / "stream", 2
    stuck = out / "epoch-0000" / "part-00000"
    real = shutil.rmtree

    def refusing(path, *args, **kwargs):
        if Path(path) == stuck:
            if kwargs.get("ignore_errors"):
                return
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(stream_module, "DELETE_PAUSE", 0.05, raising=False)
    monkeypatch.setattr(stream_module.shutil, "rmtree", refusing)
    read, peak = [], DiskPeak(out)
    peak.start()
    try:
        with pytest.raises(StreamError, match=f"^{stuck}: cannot be deleted \\(.*Permission denied"):
            with building(qwen4_dir, chats, out, partition_samples=6, window=window, wait_timeout=30):
                wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest")
                with pytest.raises(StreamError, match="not published after"):
                    for sample in StreamingCacheDataset(out, "train", timeout=3):
                        read.append(sample["record_id"])
    finally:
        peak.stopped.set()
        peak.join()
    largest = max(p["bytes"] for p in read_stream_manifest(out)["partitions"])
    assert stuck.exists() and 0 < peak.most <= (window + 1) * largest
    manifest = read_stream_manifest(out)
    assert manifest["partitions"][0]["state"] == "acknowledged"  # counted on disk
    assert manifest["high_water_bytes"] >= partition_bytes(out)  # measured there, small files included
    monkeypatch.setattr(stream_module.shutil, "rmtree", real)
    with building(qwen4_dir, chats, out, partition_samples=6, window=window, wait_timeout=30) as builder:
        dataset = StreamingCacheDataset(out, "train", timeout=30)
        dataset.load_state_dict({**dataset.state_dict(), "position": len(read)})
        read += [sample["record_id"] for sample in dataset]
    assert builder.result["records_out"] == CHATS
    assert sorted(read) == sorted(offline["fuelline"][1]) and not stuck.exists()


# --- no configuration waits forever ------------------------------------------------------------------

def windowed(qwen4_dir, chats, held, out: Path, window: int) -> None:
    """A copy of the held stream at `out` without the readers other tests registered, its builder resumed
    with `window` (it stops waiting for 'train')."""
    shutil.copytree(held, out, ignore=shutil.ignore_patterns("consumers"))
    done = invoke(*stream_words(qwen4_dir, chats, out, **{**HELD, "window": window}))
    assert done.exit_code == 2 and "waiting for consumer 'train'" in done.stderr, done.stderr
    assert read_stream_manifest(out)["window"] == window


def test_readers_that_would_wait_on_the_builder_forever_are_refused_when_they_open(qwen4_dir, chats, held, tmp_path):
    """Checkpoint acknowledgements with shuffle_partitions equal to the window (the builder waits for the
    group's first partition, the reader for the next group's), and window 1 with batches that span two
    partitions: refused when opened, naming what they need and the window; acknowledging what is
    yielded, shuffle_partitions equal to the window reads."""
    out = tmp_path / "stream"
    windowed(qwen4_dir, chats, held, out, 2)
    with pytest.raises(StreamError, match="rank 0 may need [3-9] partitions on disk at once \\(shuffle_partitions 2, "
                                          "acknowledge 'checkpoint'\\), and the builder's window \\(--window 2\\) "
                                          "has room for 2: each would wait for the other"):
        StreamingCacheDataset(out, "train", shuffle_partitions=2, acknowledge="checkpoint")
    assert StreamingCacheDataset(out, "train", shuffle_partitions=2).need == 2
    single = tmp_path / "single"
    windowed(qwen4_dir, chats, held, single, 1)
    with pytest.raises(StreamError, match="may need [2-9] partitions .*batch_size 4.*has room for 1"):
        StreamingCacheDataset(single, "train", batch_size=4, acknowledge="checkpoint")


def test_a_builder_resumed_with_a_window_too_small_for_a_registered_consumer_is_refused(qwen4_dir, chats, held,
                                                                                       tmp_path):
    """A consumer registered reading groups of 3 partitions; the builder resumed with --window 2 would
    publish 2 and wait for an acknowledgement the consumer gives only after the third: refused naming
    the consumer, the stream unchanged. A reader opened before the builder shrank the window is
    refused when it next waits."""
    out = tmp_path / "stream"
    shutil.copytree(held, out, ignore=shutil.ignore_patterns("consumers"))
    StreamingCacheDataset(out, "train", shuffle_partitions=3)
    before = (out / STREAM_MANIFEST).read_bytes()
    done = invoke(*stream_words(qwen4_dir, chats, out, **{**HELD, "window": 2}))
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert (f"{out}: consumer 'train' may need 3 partitions on disk at once, and --window 2 leaves room for 2: the "
            "two would wait on each other; resume with --window 3 or more") in done.stderr, done.stderr
    assert (out / STREAM_MANIFEST).read_bytes() == before


def test_a_trainer_that_never_acknowledges_is_told_so_instead_of_waiting_forever(qwen4_dir, chats, tmp_path):
    """Checkpoint acknowledgements and a trainer that never calls acknowledge(): its reader needs the
    partition after the window, which the builder publishes only once the first is acknowledged. With
    no timeout the wait would never end; it is an error naming both partitions at once."""
    out = tmp_path / "stream"
    with building(qwen4_dir, chats, out, partition_samples=6, window=2, wait_timeout=20):
        wait_for(lambda: (out / STREAM_MANIFEST).exists(), "stream manifest")
        dataset = StreamingCacheDataset(out, "train", acknowledge="checkpoint", timeout=15)
        started = time.monotonic()
        with pytest.raises(StreamError, match="part-00002: would be waited for forever: the builder publishes it only "
                                              "once epoch-0000/part-00000 is acknowledged, and consumer 'train' rank 0 "
                                              "has not acknowledged it"):
            for _ in dataset:
                pass
        assert time.monotonic() - started < 10
        dataset.acknowledge(dataset.state_dict())  # then the builder may finish: it reads on from here
        for _ in dataset:
            dataset.acknowledge(dataset.state_dict())
