"""The build plan (shards, batches, ranks) and the writer queue, without a model."""

from __future__ import annotations

import threading
import time

import numpy as np
import orjson
import pytest

from fuelline.cache.plan import SAMPLES, CacheConfig, assign, plan_shards
from fuelline.cache.writer import WriteQueue
from fuelline.formats.target_cache import Layout


def samples_of(lengths) -> np.ndarray:
    out = np.zeros(len(lengths), SAMPLES)
    out["length"] = lengths
    out["start"] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return out


@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(5, 2000, size=1000)


def test_shards_fit_and_every_sample_is_placed_once(lengths):
    layout = Layout("deepspec-v2", 3, 64)
    sizes = layout.record_sizes(lengths)
    limit = int(sizes.sum() // 20)
    shards = plan_shards(samples_of(lengths), sizes, CacheConfig(layers=[0], max_shard_bytes=limit, batch_tokens=4096))
    assert len(shards) >= 20
    assert all(s.nbytes <= limit for s in shards)
    placed = np.concatenate([s.samples for s in shards])
    assert sorted(placed) == list(range(len(lengths)))
    assert [s.first_sample_id for s in shards] == list(np.cumsum([0] + [len(s.samples) for s in shards[:-1]]))
    # shards cost about the same: every shard holds every length
    costs = [s.cost for s in shards]
    assert max(costs) < 1.2 * min(costs)


def test_batches_ascend_in_length_and_respect_the_token_budget(lengths):
    shards = plan_shards(samples_of(lengths), lengths.astype(np.int64),
                         CacheConfig(layers=[0], max_shard_bytes=10**12, min_shards=4, batch_tokens=4096))
    assert len(shards) == 4
    for shard in shards:
        shard_lengths = lengths[shard.samples]
        assert list(shard_lengths) == sorted(shard_lengths)
        bounds = shard.batches + [len(shard.samples)]
        for start, end in zip(bounds, bounds[1:]):
            assert end > start
            if end - start > 1:  # a lone sample may exceed the budget; a batch of several never does
                assert (end - start) * shard_lengths[end - 1] <= 4096


def test_a_sample_bigger_than_a_shard_is_refused():
    with pytest.raises(ValueError, match="more than --max-shard-bytes"):
        plan_shards(samples_of([10, 5000]), np.array([10, 5000]), CacheConfig(layers=[0], max_shard_bytes=1000))


def test_ranks_get_balanced_whole_shards(lengths):
    shards = plan_shards(samples_of(lengths), lengths.astype(np.int64),
                         CacheConfig(layers=[0], max_shard_bytes=10**12, min_shards=16, batch_tokens=4096))
    for world in (1, 2, 3, 16, 20):
        work = assign(shards, world)
        assert sorted(i for ids in work for i in ids) == list(range(16))
        loads = [sum(shards[i].cost for i in ids) for ids in work]
        # whole shards: no rank carries more than one shard's work beyond the least loaded one
        assert max(loads) - min(loads) <= max(s.cost for s in shards)
    assert assign(shards, 2) == assign(shards, 2)  # the same on every rank


def test_write_queue_runs_jobs_in_order_within_the_byte_budget():
    done, in_flight, peak = [], [0], [0]
    lock = threading.Lock()

    def job(k):
        def run():
            with lock:
                in_flight[0] -= 1
            time.sleep(0.01)
            done.append(k)
        return run

    queue = WriteQueue(limit=300, threaded=True)
    for k in range(20):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        queue.put(job(k), 100)
    queue.close()
    assert done == list(range(20))
    assert peak[0] <= 4  # 300 bytes of 100-byte jobs queued, plus the one being written


def test_a_writer_error_reaches_the_caller():
    queue = WriteQueue(limit=10**6, threaded=True)

    def fail():
        raise OSError(28, "No space left on device")

    queue.put(fail, 10)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(100):
            queue.put(lambda: None, 10)
            time.sleep(0.01)
        queue.close()


def test_pack_and_the_cache_give_the_same_records_the_same_samples_by_default(qwen_dir, tmp_path):
    """The chat-encoding options are one group (`ChatEncoding`) with one set of defaults: the model's
    own template, 4,096 tokens, at least 1 supervised token. A conversation longer than that is cut
    alike, a two-token answer kept by both (the cache used to drop it, pack to keep a 5,000-token one)."""
    import io
    import shutil

    from fuelline.cache.plan import encode_inputs
    from fuelline.formats.tokens import TokenFiles
    from fuelline.io.rejects import Rejects
    from fuelline.models import QWEN3_CHAT_TEMPLATE
    from fuelline.pack.packer import PackConfig, pack

    model = tmp_path / "model"  # a tokenizer with a template of its own, as a target's has
    model.mkdir()
    shutil.copy(qwen_dir / "tokenizer.json", model)
    (model / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE)
    long_turn = "很长的回答。" * 700  # ~1,400 tokens a turn: four exchanges go past 4,096
    records = [{"id": "short", "conversations": [{"role": "user", "content": "2+2?"},
                                                 {"role": "assistant", "content": "4"}]},
               {"id": "long", "conversations": [turn for k in range(4) for turn in (
                   {"role": "user", "content": f"part {k}"}, {"role": "assistant", "content": long_turn})]},
               {"id": "plain", "conversations": [{"role": "user", "content": "Hi"},
                                                 {"role": "assistant", "content": "Hello, how are you?"}]}]
    source = tmp_path / "chats.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))

    stats = pack([source], model, tmp_path / "sft", PackConfig(template="chat", val_fraction=0.0), workers=1,
                 progress=False)
    files = TokenFiles(tmp_path / "sft" / "train")
    packed = [files.document(k) for k in range(files.num_documents)]
    ids, masks = io.BytesIO(), io.BytesIO()
    encoded = encode_inputs([str(source)], model, CacheConfig(layers=[0]), ids, masks, Rejects(), progress=False)
    all_ids, all_masks = np.frombuffer(ids.getvalue(), "<i4"), np.frombuffer(masks.getvalue(), "u1").astype(bool)
    planned = [(all_ids[s:s + n], all_masks[s:s + n])
               for s, n in zip(encoded.samples["start"], encoded.samples["length"])]

    assert encoded.record_ids == ["short", "long", "plain"] and stats["records_out"] == 3
    assert encoded.truncated == stats["counters"]["truncated"] == 1 and encoded.dropped == stats["dropped"] == {}
    assert max(len(i) for i, _ in planned) <= 4096 < 4 * 1400
    for (pack_ids, pack_mask), (cache_ids, cache_mask) in zip(packed, planned, strict=True):
        assert np.array_equal(pack_ids, cache_ids) and np.array_equal(pack_mask, cache_mask)
    assert packed[0][1].sum() == 2  # "4" and the end of turn: trained on by both
