"""A trainer's reading loop over a streaming target cache, as a process of its own for the tests:
a real SIGKILL at any point must neither lose nor repeat a sample.

    python tests/cache/stream_trainer.py STREAM RANK WORLD_SIZE CHECKPOINT [SECONDS_PER_SAMPLE [ACKNOWLEDGE
        [SHUFFLE_PARTITIONS BATCH_SIZE WORKERS CHECKPOINT_EVERY]]]

After every sample it writes its checkpoint atomically (what a trainer saves with its optimizer):
(epoch, record id, a digest of the sample's bytes) of every sample it has consumed, and the dataset's
`state_dict()`; then it acknowledges that state (`acknowledge="checkpoint"`, the default; with
"yielded" the dataset acknowledges what it has yielded). Started again, it loads the checkpoint and
goes on from its state; it exits 0 once every epoch is read. Given a batch size, it reads through a
DataLoader with that many workers and checkpoints every CHECKPOINT_EVERY batches and at each
epoch's end. benchmarks/reliability_stream.py and reliability_stream_acks.py run it too.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import orjson


def sample_digest(sample: dict) -> str:
    """Every field of a sample, its bytes (hidden states by their bits), in one digest."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(sample):
        if name == "stream_position":
            continue
        value = sample[name]
        digest.update(name.encode())
        digest.update(value.contiguous().view(torch.uint8).numpy().tobytes() if isinstance(value, torch.Tensor)
                      else str(value).encode())
    return digest.hexdigest()


def main(stream: Path, rank: int, world_size: int, checkpoint: Path, pause: float, acknowledge: str,
         shuffle: int = 1, batch_size: int = 0, workers: int = 0, every: int = 1) -> None:
    from fuelline.cache.stream_dataset import StreamingCacheDataset
    from fuelline.formats.target_stream import STREAM_MANIFEST
    from fuelline.io.atomic import write_bytes_atomic

    deadline = time.monotonic() + 120
    while not (stream / STREAM_MANIFEST).exists():  # the builder plans first
        if time.monotonic() > deadline:
            sys.exit(f"{stream / STREAM_MANIFEST} never appeared")
        time.sleep(0.05)
    dataset = StreamingCacheDataset(stream, "train", rank=rank, world_size=world_size, acknowledge=acknowledge,
                                    shuffle_partitions=shuffle, batch_size=batch_size or None, timeout=120)
    checkpointed = acknowledge == "checkpoint"
    saved = orjson.loads(checkpoint.read_bytes()) if checkpoint.exists() else {"consumed": []}
    if "state" in saved:
        dataset.load_state_dict(saved["state"])
        if checkpointed:
            dataset.acknowledge(saved["state"])  # killed between its checkpoint and its acknowledgement
    if batch_size:
        return batched(dataset, saved, checkpoint, checkpointed, batch_size, workers, every)
    for epoch in range(dataset.state_dict()["epoch"], dataset.epochs):
        dataset.set_epoch(epoch)
        for sample in dataset:
            saved["consumed"].append([epoch, sample["record_id"], sample_digest(sample)])
            saved["state"] = dataset.state_dict()
            write_bytes_atomic(checkpoint, orjson.dumps(saved))
            if checkpointed:
                dataset.acknowledge(saved["state"])
            time.sleep(pause)


def batched(dataset, saved: dict, checkpoint: Path, checkpointed: bool, batch_size: int, workers: int,
            every: int) -> None:
    """Batches from a DataLoader; the samples of the batches since the last checkpoint are saved with it."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=keep)
    for epoch in range(dataset.state_dict()["epoch"], dataset.epochs):
        dataset.set_epoch(epoch)
        pending, count, batch = [], 0, None
        for batch in loader:
            pending += [[epoch, s["record_id"], sample_digest(s)] for s in batch]
            count += 1
            if count % every == 0:
                save(dataset, saved, pending, checkpoint, checkpointed, batch)
                pending = []
        if batch is not None:
            save(dataset, saved, pending, checkpoint, checkpointed, batch)


def keep(samples: list) -> list:
    """The DataLoader's batch as the list of its samples."""
    return samples


def save(dataset, saved: dict, pending: list, checkpoint: Path, checkpointed: bool, batch: list) -> None:
    import torch

    from fuelline.io.atomic import write_bytes_atomic

    saved["consumed"] += pending
    saved["state"] = dataset.state_dict(after={"stream_positions": torch.tensor([s["stream_position"] for s in batch])})
    write_bytes_atomic(checkpoint, orjson.dumps(saved))
    if checkpointed:
        dataset.acknowledge(saved["state"])


if __name__ == "__main__":
    extra = [int(word) for word in sys.argv[7:11]]
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]),
         float(sys.argv[5]) if len(sys.argv) > 5 else 0.0, sys.argv[6] if len(sys.argv) > 6 else "checkpoint", *extra)
