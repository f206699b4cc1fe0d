"""A consumer started beside `fuelline cache stream` waits for the stream's manifest (the builder
writes it once the conversations are encoded) instead of failing, and gives up after its timeout
with an error naming the file."""

import threading
import time

import pytest

pytest.importorskip("torch")

from fuelline.cache.stream_dataset import StreamingCacheDataset  # noqa: E402
from fuelline.formats.target_stream import (STREAM_FORMAT, STREAM_VERSION, StreamError,  # noqa: E402
                                            write_stream_manifest)

PLANNED = {"format": STREAM_FORMAT, "version": STREAM_VERSION, "epochs": 1, "seed": 0, "consumers": ["train"],
           "window": 2, "partitions": [{"name": "epoch-0000/part-00000", "epoch": 0, "index": 0, "samples": 3,
                                        "tokens": 30, "bytes": 3000, "state": "planned"}]}


def test_the_dataset_waits_for_the_manifest(tmp_path):
    writer = threading.Timer(0.5, write_stream_manifest, (tmp_path, PLANNED))
    started = time.monotonic()
    writer.start()
    try:
        dataset = StreamingCacheDataset(tmp_path, "train", timeout=60, poll_seconds=0.05)
    finally:
        writer.cancel()
    assert time.monotonic() - started >= 0.5
    assert dataset.rank_samples() == 3
    assert (tmp_path / "consumers" / "train" / "consumer.json").exists()


def test_a_stream_never_planned_is_an_error_after_the_timeout(tmp_path):
    with pytest.raises(StreamError, match=r"the stream's manifest not published after 0 s.*is `fuelline cache stream` running"):
        StreamingCacheDataset(tmp_path, "train", timeout=0.3, poll_seconds=0.05)
    assert not (tmp_path / "consumers").exists()
