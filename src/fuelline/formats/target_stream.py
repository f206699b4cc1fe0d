"""A streaming target cache on disk: the contract between its builder and its consumers.

    STREAM/
      stream.json                  the stream manifest (the builder's; rewritten atomically)
      builder.json                 the running builder's heartbeat: its host, pid and last sign of life
      .build/                      the plan and the encoded tokens, shared by every partition
      epoch-EEEE/part-PPPPP/       a partition: a complete target cache (manifest.json last)
      consumers/NAME/consumer.json a consumer's registration: its number of ranks
      consumers/NAME/need-rR.json  the most partitions rank R may need on disk at once
      consumers/NAME/acks/eE-pP-rR-wWofN
                                   worker W of N of rank R has yielded its share of partition P

The manifest names the plan, the epochs and every partition with its samples, bytes and state.
The builder writes it; consumers write only their own directory, so no file has two writers.
A partition is *published* when its manifest.json exists, *acknowledged* by a consumer when
every rank of it has acknowledged it (for a rank: every worker of one worker count), and
*deleted* by the builder once every consumer the stream names has acknowledged it (the
partition's manifest goes first, so a half-deleted partition is never read as a cache).

The rule that keeps the two sides from waiting on each other: a rank may need a partition only
while every partition from the oldest it may hold unacknowledged to that one fits in the builder's
window (`fits`); each rank records the most it may need (`write_need`), the builder refuses to
resume with less room than a consumer needs, and a consumer with more need than room is refused.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import orjson

from fuelline.formats.errors import FormatError
from fuelline.io.atomic import write_bytes_atomic

STREAM_MANIFEST = "stream.json"
STREAM_FORMAT = "fuelline-target-stream"
STREAM_VERSION = 1
CONSUMERS = "consumers"
STATES = ("planned", "building", "published", "acknowledged", "deleted")
BUILDER = "builder.json"
HEARTBEAT_SECONDS = 5.0  # how often a running builder says so; three missed beats: no builder runs
_ACK = re.compile(r"e(\d+)-p(\d+)-r(\d+)-w(\d+)of(\d+)")


class StreamError(FormatError):
    """A stream directory, its manifest or a consumer's registration that cannot be used, or a
    wait that ended: the message names the file or partition and what to do."""


def epoch_name(epoch: int) -> str:
    """The directory of an epoch's partitions under the stream (`epoch-0000`)."""
    return f"epoch-{epoch:04d}"


def partition_name(epoch: int, index: int) -> str:
    """The partition's directory under the stream, and its name in messages (`epoch-0000/part-00003`)."""
    return f"{epoch_name(epoch)}/part-{index:05d}"


def write_stream_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    write_bytes_atomic(directory / STREAM_MANIFEST,
                       orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def read_stream_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The stream manifest, checked for what its readers rely on."""
    path = Path(directory) / STREAM_MANIFEST
    try:
        manifest = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise StreamError(path, "missing: not a streaming target cache (or its builder has not planned it yet: "
                                "`fuelline cache stream` writes it once the conversations are encoded)") from None
    except orjson.JSONDecodeError as e:
        raise StreamError(path, f"not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != STREAM_FORMAT:
        raise StreamError(path, f"not a {STREAM_FORMAT} manifest")
    if manifest.get("version") != STREAM_VERSION:
        raise StreamError(path, f"version {manifest.get('version')!r}; this fuelline reads version {STREAM_VERSION}")
    for partition in manifest["partitions"]:
        if partition.get("state") not in STATES:
            raise StreamError(path, f"partition {partition.get('name')!r} has state {partition.get('state')!r}, "
                                    f"not one of {', '.join(STATES)}")
    return manifest


def consumer_dir(directory: Path, consumer: str) -> Path:
    return Path(directory) / CONSUMERS / consumer


def register_consumer(directory: Path, consumer: str, world_size: int) -> None:
    """Record the consumer's number of ranks (which acknowledgements make a partition its own), once;
    a consumer that comes back with another number of ranks is refused."""
    path = consumer_dir(directory, consumer) / "consumer.json"
    wanted = {"consumer": consumer, "world_size": world_size}
    try:
        found = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "acks").mkdir(exist_ok=True)
        write_bytes_atomic(path, orjson.dumps(wanted))
        return
    if found != wanted:
        raise StreamError(path, f"consumer {consumer!r} read this stream with {found.get('world_size')} rank(s), "
                                f"now with {world_size}: its acknowledgements would not add up; resume it with "
                                f"{found.get('world_size')} rank(s), or read under another consumer name")


def fits(manifest: dict[str, Any], first: int, last: int) -> bool:
    """Whether the builder has room for partitions `first` to `last` (their places in the stream's
    order, epochs one after the other) on disk at once: at most `window` of them, and within
    `max_disk` bytes when it is set (one partition always fits)."""
    if last - first + 1 > manifest["window"]:
        return False
    if not manifest.get("max_disk") or last <= first:
        return True
    return sum(p["bytes"] for p in manifest["partitions"][first:last + 1]) <= manifest["max_disk"]


def room(manifest: dict[str, Any]) -> int:
    """How many consecutive partitions the builder always has room for at once, wherever they start."""
    count, most = len(manifest["partitions"]), manifest["window"]
    for first in range(count):
        span = 1
        while span < most and first + span < count and fits(manifest, first, first + span):
            span += 1
        if first + span < count:  # stopped by the window or the bytes, not by the stream's end
            most = span
    return most


def write_need(directory: Path, consumer: str, rank: int, partitions: int) -> None:
    """Rank `rank` of `consumer` may need this many partitions on disk at once (rewritten when it opens
    or resumes): the builder refuses to resume with less room."""
    write_bytes_atomic(consumer_dir(directory, consumer) / f"need-r{rank}.json", orjson.dumps({"partitions": partitions}))


def needed(directory: Path, consumer: str) -> int:
    """The most partitions any rank of `consumer` may need on disk at once (0: none has said)."""
    most = 0
    for path in consumer_dir(directory, consumer).glob("need-r*.json"):
        try:
            most = max(most, int(orjson.loads(path.read_bytes())["partitions"]))
        except (ValueError, KeyError, TypeError):
            raise StreamError(path, "not a consumer's need (a JSON object with an integer 'partitions')") from None
    return most


def write_ack(directory: Path, consumer: str, epoch: int, index: int, rank: int, worker: int, workers: int) -> None:
    """One worker's acknowledgement: an empty file, created atomically (its name is the message)."""
    write_bytes_atomic(consumer_dir(directory, consumer) / "acks" / f"e{epoch}-p{index}-r{rank}-w{worker}of{workers}",
                       b"")


def acknowledged(directory: Path, consumer: str) -> set[tuple[int, int]] | None:
    """(epoch, index) of every partition that every rank of `consumer` has acknowledged; None
    while the consumer has not registered."""
    try:
        world_size = orjson.loads((consumer_dir(directory, consumer) / "consumer.json").read_bytes())["world_size"]
    except FileNotFoundError:
        return None
    ranks = rank_acknowledgements(directory, consumer)
    return {key for key, done in ranks.items() if len(done) == world_size}


def rank_acknowledgements(directory: Path, consumer: str) -> dict[tuple[int, int], set[int]]:
    """{(epoch, index): the ranks of `consumer` that have acknowledged it (every worker of one count)}."""
    base = consumer_dir(directory, consumer)
    workers: dict[tuple[int, int, int, int], set[int]] = {}
    for name in os.listdir(base / "acks"):
        if match := _ACK.fullmatch(name):
            epoch, index, rank, worker, count = map(int, match.groups())
            workers.setdefault((epoch, index, rank, count), set()).add(worker)
    ranks: dict[tuple[int, int], set[int]] = {}
    for (epoch, index, rank, count), seen in workers.items():
        if len(seen) == count:
            ranks.setdefault((epoch, index), set()).add(rank)
    return ranks


def write_heartbeat(directory: Path) -> None:
    write_bytes_atomic(Path(directory) / BUILDER, orjson.dumps({"host": os.uname().nodename, "pid": os.getpid(),
                                                                 "seen": time.time()}))


def builder_silence(directory: Path) -> float | None:
    """Seconds since the builder's last heartbeat (its clock against ours), or None when none ever beat."""
    try:
        return time.time() - orjson.loads((Path(directory) / BUILDER).read_bytes())["seen"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
