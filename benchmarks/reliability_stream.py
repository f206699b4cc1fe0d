"""Reliability family (m), issue 37: the streaming target cache (`fuelline cache stream` and
`StreamingCacheDataset`) resumed with other options, damaged, given odd values and killed.

The conversations and the tiny model are reliability_cache.py's; `held` is a stream of two epochs
that nobody reads (a window larger than the stream, and a builder that stops waiting for its
consumer after half a second), so that every partition stays published; the reference is the
offline `fuelline cache build` with the same options, whose samples every streamed one must equal.

- **Resumed with another option or input.** The held stream's command again with one option that
  decides the bytes changed (every one of StreamConfig's, generated from its declaration) or
  another input: exit 2 naming `different config.NAME` (`different inputs`), the stream
  untouched: clear_error; anything else is silent_wrong or a crash. With another window, disk
  bound, consumer list or wait (options that decide no byte) it must resume: ok when it stops
  only to wait for its consumer, its partitions unchanged.
- **Damaged partitions and manifest.** A copy of the held stream with one file of a partition, or
  the stream manifest, truncated or with a byte flipped, or a manifest that miscounts a
  partition's samples (by -2, -1, +1), read whole by `StreamingCacheDataset`:
  ok when it reads every sample equal to the undamaged stream's, a clear error when a
  StreamError or CacheFormatError names the damaged partition (or stream.json); then the last
  damaged partition's directory is removed and the builder run again: ok when it is built to the
  same bytes.
- **Odd values.** `--window 1 --partition-samples 1` read by two ranks acknowledging what they
  yield; (full run) `--max-disk` below one partition's bytes, three epochs of one partition each:
  ok when the builder and both trainer ranks finish and every sample is read once per epoch,
  byte-equal to the offline build's (trainers acknowledging what they yield: one partition on disk
  at a time is too little for checkpoint acknowledgements, which family (r) shows refused).
- **Kills.** The builder and the two trainer ranks (tests/cache/stream_trainer.py: a checkpoint
  after every sample) SIGKILLed at random moments and started again: ok as above. A trainer
  killed and started again without its checkpoint, after the builder deleted what it had read:
  a clear error naming the partition (no silent restart from a later sample).

Builders and trainers are processes of their own (the harness never runs a forward pass in its own
process, so a forked reader never inherits a started thread pool). Called by
benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT
from trials import Tally, changed_options, cli, damage_file, isolated, judged, run

TRAINER = ROOT / "tests" / "cache" / "stream_trainer.py"
OPTIONS = ["--layers", "0,1", "--max-length", "384", "--min-shards", "2", "--batch-tokens", "512", "--hidden-dtype",
           "fp8", "--device", "cpu"]
HELD = ["--partition-samples", "5", "--epochs", "2", "--window", "99", "--wait-timeout", "0.5"]
WAITS = "waiting for consumer 'train' (not started)"  # how the held stream's builder stops
TRIAL_SECONDS = 180


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    from reliability_cache import cache_inputs

    chats, model = cache_inputs(work)
    work = work / "stream"
    work.mkdir()
    rng = random.Random(seed)
    stream = Stream(model, chats, work)
    held = stream.held()
    return [resumed_with_another_option(stream, held), resumed_alike(stream, held),
            *damaged(stream, held, 24 if full else 8, rng), odd_values(stream, full),
            kills(stream, 3 if full else 1, rng), restarted_without_checkpoint(stream)]


class Stream:
    """The model, the conversations and the reference: what every trial of the family shares."""

    def __init__(self, model: Path, chats: Path, work: Path):
        self.model, self.chats, self.work = model, chats, work
        reference = work / "offline"
        code, stderr = run(cli("cache", "build", "--quiet", "--model", model, "-i", chats, "-o", reference, *OPTIONS))
        if code != 0:
            sys.exit(f"setup failed: {stderr[-2000:]}")
        trainer = _trainer_module()
        from fuelline.cache.dataset import CacheDataset

        dataset = CacheDataset(reference)
        self.digests = {dataset[i]["record_id"]: trainer.sample_digest(dataset[i]) for i in range(len(dataset))}

    def words(self, out: Path, *options) -> list[str]:
        """`fuelline cache stream` into `out`: the words after `fuelline`."""
        return ["cache", "stream", "--quiet", "--model", str(self.model), "-i", str(self.chats), "-o", str(out),
                *OPTIONS, *map(str, options)]

    def held(self) -> Path:
        out = self.work / "held"
        code, stderr = run(cli(*self.words(out, *HELD)))
        if code != 2 or WAITS not in stderr or "every partition is published" not in stderr:
            sys.exit(f"setup failed: the held stream ({code}): {stderr[-2000:]}")
        return out

    def run_with(self, out: Path, options: list, trainers: list[list[str]],
                 kills: list[tuple[float, str]] = ()) -> tuple[str, str]:
        """A builder and trainer ranks (each given the trainer's arguments after its checkpoint), each
        process named by `kills` SIGKILLed that many seconds after the start and started again at once:
        the outcome once all have ended."""
        argv = {"builder": cli(*self.words(out, *options))}
        checkpoints = {}
        for rank, extra in enumerate(trainers):
            checkpoints[rank] = self.work / f"{out.name}-trainer-{rank}.json"
            argv[f"trainer-{rank}"] = [sys.executable, str(TRAINER), str(out), str(rank), str(len(trainers)),
                                       str(checkpoints[rank]), *extra]
        logs = {name: self.work / f"{out.name}-{name}.log" for name in argv}
        processes = {name: _start(words, logs[name]) for name, words in argv.items()}
        started, pending = time.monotonic(), sorted(kills)
        try:
            while any(p.poll() is None for p in processes.values()):
                if time.monotonic() - started > TRIAL_SECONDS:
                    return "hang", f"{out.name}: not finished after {TRIAL_SECONDS} s"
                failed = {n: p.returncode for n, p in processes.items() if p.poll() not in (None, 0)}
                if failed:
                    return "crash", f"{out.name}: {failed}: " + " | ".join(logs[n].read_text()[-500:] for n in failed)
                if pending and time.monotonic() - started > pending[0][0]:
                    _, name = pending.pop(0)
                    _kill(processes[name])
                    processes[name] = _start(argv[name], logs[name])
                time.sleep(0.02)
        finally:
            for process in processes.values():
                _kill(process)
        return self.judge(out, {rank: json.loads(path.read_bytes())["consumed"] for rank, path in checkpoints.items()})

    def judge(self, out: Path, consumed: dict[int, list]) -> tuple[str, str]:
        """ok when every epoch's samples were read once across the ranks, byte-equal to the offline build's,
        and the finished stream holds no partition, encoded tokens or temp file."""
        epochs = json.loads((out / "stats.json").read_bytes())["stream"]["epochs"]
        for epoch in range(epochs):
            ids = [rid for rank in consumed for e, rid, _ in consumed[rank] if e == epoch]
            if sorted(ids) != sorted(self.digests):
                missing, twice = set(self.digests) - set(ids), {i for i in ids if ids.count(i) > 1}
                return "silent_wrong", f"{out.name} epoch {epoch}: {len(missing)} missing, {len(twice)} read twice"
        if any(digest != self.digests[rid] for rank in consumed for _, rid, digest in consumed[rank]):
            return "silent_wrong", f"{out.name}: samples differ from the offline build's"
        left = [p.relative_to(out).as_posix() for p in out.rglob("*")
                if ".tmp-" in p.name or p.name == ".build" or p.name.startswith("epoch-")]
        return ("leftover", f"{out.name}: left behind {left[:5]}") if left else ("ok", "")


def _trainer_module():
    spec = importlib.util.spec_from_file_location("stream_trainer", TRAINER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "ab") as f:
        return subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=f)


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _invoke(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stderr + (repr(result.exception) if result.exit_code not in (0, 2) else "")


def _files(directory: Path, partitions_only: bool = False) -> dict[str, bytes]:
    """Every file of a stream (its stats, which hold seconds, aside); or its partitions' only."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "stats.json" and (not partitions_only or p.parts[-3].startswith("epoch-"))}


def _add(tally: Tally, trial, label: str, timeout: float = 120) -> None:
    """`trial` in a forked child, bounded in time; its outcome may carry a detail after a NUL."""
    outcome, note = isolated(trial, timeout=timeout)
    outcome, _, detail = outcome.partition("\0")
    tally.add(outcome, f"{label}: {detail or note}")


# --- resumed with other options ---------------------------------------------------------------------

def resumed_with_another_option(stream: Stream, held: Path) -> Tally:
    from fuelline.cache.stream import StreamConfig

    tally = Tally("cache stream resumed with another option or input")
    other = stream.work / "other.jsonl"
    other.write_bytes(b"".join(stream.chats.read_bytes().splitlines(keepends=True)[:-1]))
    changed = changed_options(StreamConfig, {"layers": ["--layers", "0"],
                                             "chat_template": ["--chat-template", "chatml"],
                                             "min_loss_tokens": ["--min-loss-tokens", "2"],
                                             "hidden_dtype": ["--hidden-dtype", "bf16"],  # OPTIONS' is fp8
                                             "format": ["--format", "deepspec-v2", "--hidden-dtype", "bf16"]})
    trials = [(name, [*stream.words(held, *HELD), *words]) for name, words in changed]
    words = stream.words(held, *HELD)
    trials.append(("inputs", [str(other) if word == str(stream.chats) else word for word in map(str, words)]))
    before = _files(held)
    for name, args in trials:
        def trial(args=args, name=name) -> str:
            code, stderr = _invoke(args)
            if _files(held) != before:
                return f"silent_wrong\0exit {code}, the stream changed"
            if code == 2 and f"different {name}" in stderr and "Traceback" not in stderr:
                return "clear_error"
            return f"{'silent_wrong' if code == 0 else 'crash'}\0exit {code}: {stderr[-400:]}"

        _add(tally, trial, name)
    return tally


def resumed_alike(stream: Stream, held: Path) -> Tally:
    tally = Tally("cache stream resumed with another window, disk bound, consumer list or wait")
    before = _files(held, partitions_only=True)
    for words in (["--window", "50"], ["--max-disk", "1G"], ["--consumers", "train,eval"], ["--wait-timeout", "0.3"]):
        def trial(words=words) -> str:
            code, stderr = _invoke([*stream.words(held, *HELD), *words])
            if code == 2 and "every partition is published" in stderr and _files(held, True) == before:
                return "ok"
            return f"crash\0exit {code}: {stderr[-400:]}"

        _add(tally, trial, " ".join(words))
    return tally


# --- damage ---------------------------------------------------------------------------------------

def read_whole(stream_dir: Path):
    """Every sample of every epoch, in the order the consumer 'train' reads them, as bytes."""
    def read() -> dict:
        import numpy as np
        import torch

        from fuelline.cache.stream_dataset import StreamingCacheDataset

        dataset = StreamingCacheDataset(stream_dir, "train", acknowledge="checkpoint", timeout=2)
        found = {}
        for epoch in range(dataset.epochs):
            dataset.set_epoch(epoch)
            for sample in dataset:
                for name, value in sample.items():
                    found[f"{epoch}.{sample['stream_position']}.{name}"] = np.frombuffer(
                        value.contiguous().view(torch.uint8).numpy().tobytes() if isinstance(value, torch.Tensor)
                        else str(value).encode(), dtype=np.uint8)
        return found
    return read


def damaged(stream: Stream, held: Path, count: int, rng: random.Random) -> list[Tally]:
    from fuelline.cache.stream_dataset import StreamError
    from fuelline.formats.target_cache import CacheFormatError

    tally = Tally("stream with a damaged partition or manifest, read whole")
    files = sorted(p.relative_to(held).as_posix() for p in held.rglob("*")
                   if p.is_file() and (p.name == "stream.json" or p.parts[-3].startswith("epoch-")))
    copy, last = stream.work / "damaged", None
    for _ in range(count):
        name, kind = rng.choice(files), rng.choice(["truncate", "flip"])
        where, value = rng.random(), rng.randint(1, 255)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(held, copy)
        damage_file(copy / name, kind, where, value)
        partition = None if name == "stream.json" else name.rsplit("/", 1)[0]
        named = str(copy / (partition or name))
        # read in a child (this process never opens what it damages), the reference too
        _add(tally, lambda: judged(read_whole(copy), read_whole(held)(), (StreamError, CacheFormatError), named),
             f"{kind} {name} at {where:.3f}")
        last = partition or last
    for wrong in (-2, -1, 1):  # a stream manifest that miscounts a partition, whose order readers draw from
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(held, copy)
        manifest = json.loads((copy / "stream.json").read_bytes())
        entry = manifest["partitions"][rng.randrange(len(manifest["partitions"]))]
        entry["samples"] += wrong
        (copy / "stream.json").write_text(json.dumps(manifest))
        _add(tally, lambda: judged(read_whole(copy), read_whole(held)(), (StreamError, CacheFormatError),
                                   str(copy / entry["name"])), f"stream.json: {entry['name']} samples {wrong:+d}")
    rebuilt = Tally("stream partition damaged, removed and built again")
    if last is not None:  # the last copy damaged a partition: its directory removed, the builder run again
        shutil.rmtree(copy / last)
        code, stderr = run(cli(*stream.words(copy, *HELD)))
        same = _files(copy, True) == _files(held, True)
        outcome = "crash" if code != 2 or "every partition is published" not in stderr else \
            "ok" if same else "silent_wrong"
        rebuilt.add(outcome, f"{last}: exit {code}, {'same' if same else 'other'} partitions: {stderr[-400:]}")
    return [tally, rebuilt]


# --- odd values and kills -------------------------------------------------------------------------

def odd_values(stream: Stream, full: bool) -> Tally:
    tally = Tally("stream with odd values (window 1, one-sample partitions, a disk bound below a partition)")
    yielded = ["0", "yielded"]
    cases = [("window 1, partition-samples 1, two ranks acknowledging what they yield",
              ["--partition-samples", 1, "--window", 1], [yielded, yielded])]
    if full:
        cases += [("max-disk 1 byte, window 3", ["--partition-samples", 8, "--window", 3, "--max-disk", 1],
                   [yielded, yielded]),
                  ("three epochs of one partition, window 1", ["--partition-samples", 1000, "--epochs", 3,
                                                                "--window", 1], [yielded, yielded]),
                  ("one rank, window 1, partition-samples 2", ["--partition-samples", 2, "--window", 1], [yielded])]
    for k, (label, options, trainers) in enumerate(cases):
        outcome, note = stream.run_with(stream.work / f"odd-{k}", [*options, "--wait-timeout", 120], trainers)
        tally.add(outcome, f"{label}: {note}")
    return tally


def kills(stream: Stream, count: int, rng: random.Random) -> Tally:
    tally = Tally("stream with its builder and trainer ranks SIGKILLed at random moments")
    names = ["builder", "trainer-0", "trainer-1"]
    for k in range(count):
        options = ["--partition-samples", rng.randint(2, 8), "--epochs", 2, "--window", rng.randint(2, 3),
                   "--wait-timeout", 120]
        moments = [(rng.uniform(1.0, 9.0), rng.choice(names)) for _ in range(3)]
        outcome, note = stream.run_with(stream.work / f"kill-{k}", options, [["0.01"], ["0.01"]], moments)
        tally.add(outcome, f"{options} kills {moments}: {note}")
    return tally


def restarted_without_checkpoint(stream: Stream) -> Tally:
    """A trainer that lost its checkpoint after the builder deleted what it had read: it must stop,
    naming the partition, not read on from a later sample as if it were the start."""
    tally = Tally("stream trainer started again without its checkpoint")
    from fuelline.formats.target_stream import read_stream_manifest

    out = stream.work / "lost"
    checkpoint, log = stream.work / "lost-trainer.json", stream.work / "lost-trainer.log"
    builder = _start(cli(*stream.words(out, "--partition-samples", 4, "--window", 2, "--wait-timeout", 60)),
                     stream.work / "lost-builder.log")
    trainer = _start([sys.executable, str(TRAINER), str(out), "0", "1", str(checkpoint), "0.05", "yielded"], log)
    try:
        deadline = time.monotonic() + TRIAL_SECONDS
        while not (out / "stream.json").exists() or all(
                p["state"] != "deleted" for p in read_stream_manifest(out)["partitions"]):
            if time.monotonic() > deadline or trainer.poll() is not None:
                tally.add("hang" if trainer.poll() is None else "crash", log.read_text()[-500:])
                return tally
            time.sleep(0.05)
        _kill(trainer)
        checkpoint.unlink()
        trainer = _start(trainer.args, log)
        code = trainer.wait(TRIAL_SECONDS)
        said = log.read_text()
        if code != 0 and "deleted before consumer 'train' rank 0 read it" in said and "epoch-0000/part-0000" in said:
            tally.add("clear_error")
        else:
            tally.add("silent_wrong" if code == 0 else "crash", f"exit {code}: {said[-500:]}")
    except subprocess.TimeoutExpired:
        tally.add("hang", f"the trainer did not end in {TRIAL_SECONDS} s")
    finally:
        _kill(trainer)
        _kill(builder)
    return tally
