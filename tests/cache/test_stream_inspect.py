"""Looking at a stream: `fuelline cache info` and `verify` of a stream directory, the builder's
waiting and the disk check of its window, and `cache estimate`'s streaming line."""

from __future__ import annotations

import re

import orjson
import pytest

pytest.importorskip("torch")

from fuelline.cache.inspect import verify_cache  # noqa: E402
from fuelline.formats.target_stream import STREAM_MANIFEST  # noqa: E402

from ..conftest import invoke_cli  # noqa: E402
from .test_build import write_chats  # noqa: E402

CHATS = 20


@pytest.fixture(scope="module")
def held(qwen4_dir, tmp_path_factory):
    """A stream whose one consumer never comes: the builder publishes its window (two partitions), says
    whom it waits for, and stops at its --wait-timeout; (stream, the command's result)."""
    root = tmp_path_factory.mktemp("held")
    chats = write_chats(root / "chats.jsonl", CHATS)
    out = root / "stream"
    result = invoke_cli("cache", "stream", "-i", chats, "-o", out, "--model", qwen4_dir, "--layers", "0,1",
                        "--min-loss-tokens", "1", "--batch-tokens", "512", "--min-shards", "2", "--device", "cpu",
                        "--partition-samples", "5", "--window", "2", "--consumers", "train,eval",
                        "--wait-timeout", "2.5")
    return out, result


def test_a_builder_nobody_acknowledges_stops_at_its_window_naming_every_consumer(held):
    out, result = held
    assert result.exit_code == 2, result.output
    assert "consumer 'train' (not started), consumer 'eval' (not started)" in result.output
    assert "--wait-timeout 2.5" in result.output and "the same command resumes" in result.output
    states = [p["state"] for p in orjson.loads((out / STREAM_MANIFEST).read_bytes())["partitions"]]
    assert states[:2] == ["published", "published"] and set(states[2:]) == {"planned"}, states


def test_info_shows_the_partitions_states_and_each_consumer(held):
    out, _ = held
    result = invoke_cli("cache", "info", out)
    assert result.exit_code == 0, result.output
    partitions = len(orjson.loads((out / STREAM_MANIFEST).read_bytes())["partitions"])
    assert f"{partitions} over 1 epoch(s)" in result.output
    assert f"{partitions - 2} planned, 0 building, 2 published, 0 acknowledged, 0 deleted" in result.output
    assert re.search(r"consumer train\s+not started", result.output)
    assert re.search(r"consumer eval\s+not started", result.output)


def test_verify_checks_every_published_partition_and_names_a_damaged_one(held, tmp_path):
    import shutil

    out, _ = held
    copy = tmp_path / "stream"
    shutil.copytree(out, copy)
    assert verify_cache(copy) == []
    shard = copy / "epoch-0000" / "part-00001" / "shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = verify_cache(copy)
    assert problems and all("part-00001" in p for p in problems), problems
    result = invoke_cli("cache", "verify", copy)
    assert result.exit_code == 1 and "part-00001/shard-00000.bin" in result.output


def test_the_window_must_fit_on_the_disk_unless_forced(qwen4_dir, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    chats = write_chats(tmp_path / "chats.jsonl", 4)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1000))
    args = ["cache", "stream", "-q", "-i", chats, "-o", tmp_path / "s", "--model", qwen4_dir, "--layers", "0",
            "--min-loss-tokens", "1", "--device", "cpu", "--partition-samples", "2", "--window", "1"]
    result = invoke_cli(*args)
    assert result.exit_code == 2 and "the stream's window needs up to" in result.output
    assert "lower --window or --partition-samples, or pass --force" in result.output
    forced = invoke_cli(*args, "--force", "--wait-timeout", "1")  # builds its window, then nobody acknowledges
    assert forced.exit_code == 2 and "waiting for consumer 'train' (not started)" in forced.output, forced.output


def test_estimate_gives_the_streaming_disk_beside_the_offline_bytes():
    result = invoke_cli("cache", "estimate", "--hidden-size", "64", "--layers", "0,1", "--tokens", "1e6",
                        "--samples", "1000", "--partition-samples", "100", "--window", "2",
                        "--tokens-per-second", "5000")
    assert result.exit_code == 0, result.output
    line = result.output.splitlines()[-1]
    # 10 partitions of a tenth of the cache each; window 2 + the one being written: 3 tenths
    assert "10 partition(s)" in line and "(100,000 tokens)" in line, line
    assert "30.00% of" in line, line
    assert "a partition takes about 20 s at 5,000 tokens/s" in line, line


def test_a_reader_waiting_on_a_stream_whose_builder_stopped_is_told_so(held, tmp_path):
    import shutil

    from fuelline.cache.stream_dataset import StreamingCacheDataset
    from fuelline.formats.target_stream import BUILDER, StreamError

    out, _ = held
    copy = tmp_path / "stream"
    shutil.copytree(out, copy)
    assert not (copy / BUILDER).exists()  # the builder that stopped took its heartbeat with it
    dataset = StreamingCacheDataset(copy, "train", timeout=0.5, poll_seconds=0.05)
    read = []
    with pytest.raises(StreamError, match=r"part-00002 not published after \d+ s \(the stream says: planned; no "
                                          r"builder runs \(run the same `fuelline cache stream` command"):
        for sample in dataset:
            read.append(sample["record_id"])
    assert len(read) == 10  # the two published partitions of 5, then the wait for the third
