"""CacheDataset, CacheCollator, LengthGroupedBatchSampler and widen_hidden, on small caches written
by tests/cache/synthetic.py: everything read back is compared exactly with what was written."""

import os
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fuelline.cache.dataset import CacheCollator, CacheDataset, LengthGroupedBatchSampler, widen_hidden
from fuelline.cache.fp8 import error_bound
from fuelline.formats.target_cache import BF16, DEEPSPEC_V2, FP8, FUELLINE, INDEX, V2_INDEX, shard_name
from fuelline.loader import CUDAPrefetcher

from .synthetic import write_cache

KINDS = [(FUELLINE, BF16), (FUELLINE, FP8), (DEEPSPEC_V2, BF16)]
HIDDEN = ("target_hidden_states", "target_last_hidden_states")
SCALES = ("target_hidden_scales", "target_last_hidden_scales")


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def cache(request, tmp_path_factory):
    fmt, dtype = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{dtype}")
    return path, fmt, dtype, write_cache(path, fmt=fmt, hidden_dtype=dtype, num_samples=14, num_shards=4)


def assert_sample_equal(got: dict, written: dict, fmt: str, dtype: str):
    expected_keys = {"input_ids", "loss_mask", *HIDDEN}
    expected_keys |= set(SCALES) if dtype == FP8 else set()
    expected_keys |= {"record_id"} if fmt == FUELLINE else set()
    assert set(got) == expected_keys
    assert got["input_ids"].dtype == torch.int32 and got["loss_mask"].dtype == torch.uint8
    assert torch.equal(got["input_ids"], torch.from_numpy(written["input_ids"]))
    assert torch.equal(got["loss_mask"], torch.from_numpy(written["loss_mask"]))
    hidden_dtype, bits = (torch.bfloat16, torch.int16) if dtype == BF16 else (torch.float8_e4m3fn, torch.uint8)
    for key in HIDDEN:  # compared as bits: exact, whatever the values
        assert got[key].dtype == hidden_dtype and got[key].shape == written[key].shape
        assert torch.equal(got[key].view(bits), torch.from_numpy(written[key]).view(bits))
    for key in SCALES if dtype == FP8 else ():
        assert got[key].dtype == torch.float32 and torch.equal(got[key], torch.from_numpy(written[key]))
    if fmt == FUELLINE:
        assert got["record_id"] == written["record_id"]


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_every_sample_reads_back_exactly(cache, io):
    path, fmt, dtype, written = cache
    dataset = CacheDataset(path, io=io)
    assert len(dataset) == len(written)
    assert dataset.lengths.tolist() == [len(s["input_ids"]) for s in written]
    assert dataset.target_layer_ids == [2, 5, 9] and dataset.hidden_size == 8
    for i in reversed(range(len(dataset))):  # backwards: shards reopened out of order
        assert_sample_equal(dataset[i], written[i], fmt, dtype)
    assert_sample_equal(dataset[-1], written[-1], fmt, dtype)
    for bad in (len(dataset), -len(dataset) - 1):
        with pytest.raises(IndexError):
            dataset[bad]


def test_version_2_reads_unaligned_fields_by_copying(tmp_path):
    written = write_cache(tmp_path, fmt=DEEPSPEC_V2, num_samples=14, num_shards=2, hidden_size=7)
    index = np.fromfile(tmp_path / INDEX, dtype=V2_INDEX)
    assert (index["input_ids"] % 4 != 0).any() and (index["input_ids"] % 4 == 0).any()  # both paths taken
    dataset = CacheDataset(tmp_path)
    for i in range(len(dataset)):
        assert_sample_equal(dataset[i], written[i], DEEPSPEC_V2, BF16)


def test_mmap_reads_do_not_copy_and_never_write_the_file(tmp_path):
    write_cache(tmp_path, num_samples=6, num_shards=2)
    mapped, copied = CacheDataset(tmp_path), CacheDataset(tmp_path, io="pread")
    first, again = mapped[4], mapped[4]
    one, other = copied[4], copied[4]
    for key in ("input_ids", *HIDDEN):
        assert first[key].untyped_storage().data_ptr() == again[key].untyped_storage().data_ptr()
        assert one[key].untyped_storage().data_ptr() != other[key].untyped_storage().data_ptr()
    shard = tmp_path / shard_name(1)
    before = shard.read_bytes()
    first["target_hidden_states"].fill_(1.0)  # private copy-on-write pages: the file is untouched
    assert shard.read_bytes() == before
    assert not torch.equal(CacheDataset(tmp_path)[4]["target_hidden_states"], first["target_hidden_states"])


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_at_most_max_open_shards_stay_open(tmp_path, io):
    write_cache(tmp_path, num_samples=20, num_shards=5)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    dataset = CacheDataset(tmp_path, io=io, max_open_shards=2)
    baseline = fds()  # the index's map is open already
    for i in list(range(20)) + list(range(19, -1, -3)):
        dataset[i]
        shard = int(dataset.index["shard_id"][i])
        assert len(dataset._shards) <= 2 and next(reversed(dataset._shards)) == shard
        assert fds() - baseline <= 2  # a descriptor per open shard (a mapping holds one too)
    dataset.close()
    assert fds() == baseline


def test_pickled_datasets_read_in_spawned_dataloader_workers(tmp_path):
    written = write_cache(tmp_path, fmt=FUELLINE, hidden_dtype=FP8, num_samples=16, num_shards=3)
    dataset = CacheDataset(tmp_path)
    dataset[0]  # open shards and the index must not travel
    clone = pickle.loads(pickle.dumps(dataset))
    assert_sample_equal(clone[15], written[15], FUELLINE, FP8)
    # spawn: each worker gets the dataset by pickle, as on macOS and with forkserver
    loader = DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=CacheCollator(), multiprocessing_context="spawn")
    seen = []
    for batch in loader:
        for row, record_id in enumerate(batch["record_ids"]):
            i = int(record_id.split("/")[1].split("·")[0])
            n = len(written[i]["input_ids"])
            assert batch["attention_mask"][row].sum() == n
            sample = {key: batch[key][row, :n] for key in ("input_ids", "loss_mask", *HIDDEN, *SCALES)}
            assert_sample_equal({**sample, "record_id": record_id}, written[i], FUELLINE, FP8)
            seen.append(i)
    assert sorted(seen) == list(range(16))


def test_collator_pads_with_zeros_and_masks_the_padding():
    def sample(n, fill):
        return {"input_ids": torch.full((n,), fill, dtype=torch.int32), "loss_mask": torch.ones(n, dtype=torch.uint8),
                "target_hidden_states": torch.full((n, 6), float(fill)).to(torch.float8_e4m3fn),
                "target_last_hidden_states": torch.full((n, 2), float(fill)).to(torch.float8_e4m3fn),
                "target_hidden_scales": torch.full((n, 3), float(fill)),
                "target_last_hidden_scales": torch.full((n,), float(fill)), "record_id": f"r{n}"}

    batch = CacheCollator()([sample(3, 7), sample(5, 2), sample(1, 4)])
    assert batch["record_ids"] == ["r3", "r5", "r1"]
    assert batch["attention_mask"].dtype == torch.int64
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert batch["input_ids"].dtype == torch.int32
    assert batch["input_ids"].tolist() == [[7, 7, 7, 0, 0], [2] * 5, [4, 0, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == batch["attention_mask"].tolist()
    hidden = batch["target_hidden_states"]
    assert hidden.dtype == torch.float8_e4m3fn and hidden.shape == (3, 5, 6)
    assert (hidden.float()[0, :3] == 7).all() and (hidden.view(torch.uint8)[0, 3:] == 0).all()
    assert (hidden.view(torch.uint8)[2, 1:] == 0).all() and (hidden.float()[1] == 2).all()
    assert batch["target_last_hidden_states"].shape == (3, 5, 2)
    assert batch["target_hidden_scales"].shape == (3, 5, 3) and (batch["target_hidden_scales"][2, 1:] == 0).all()
    assert batch["target_last_hidden_scales"].tolist()[0] == [7, 7, 7, 0, 0]

    padded = CacheCollator(pad_to_multiple_of=4)([sample(5, 1), sample(2, 1)])
    assert padded["input_ids"].shape == (2, 8) and padded["attention_mask"].sum(1).tolist() == [5, 2]
    assert "record_ids" in padded and padded["target_hidden_states"].view(torch.uint8)[:, 5:].eq(0).all()


def test_widen_hidden_is_within_the_fp8_error_bound(tmp_path):
    written = write_cache(tmp_path, hidden_dtype=FP8, num_samples=8, num_shards=2)
    dataset = CacheDataset(tmp_path)
    batch = CacheCollator()([dataset[i] for i in range(8)])
    exact = widen_hidden(batch, torch.float32)
    wide = widen_hidden(batch)
    assert not set(SCALES) & set(wide) and wide["target_hidden_states"].dtype == torch.bfloat16
    assert torch.equal(wide["input_ids"], batch["input_ids"]) and wide["record_ids"] == batch["record_ids"]
    for row, sample in enumerate(written):
        n = len(sample["input_ids"])
        for key, source, scales in (("target_hidden_states", "source_hidden", "target_hidden_scales"),
                                    ("target_last_hidden_states", "source_last", "target_last_hidden_scales")):
            x = torch.from_numpy(sample[source])
            s = torch.from_numpy(sample[scales]).reshape(n, -1)
            bound = error_bound(x, s)
            assert ((exact[key][row, :n] - x).abs() <= bound).all()
            # widening to bf16 rounds the dequantized value once more: ≤ |x̂| / 256
            assert ((wide[key][row, :n].float() - x).abs() <= bound + (x.abs() + bound) / 256).all()
            assert (wide[key][row, n:] == 0).all()  # padding widens to zeros
    write_cache(tmp_path / "bf16", num_samples=3)
    bf16 = CacheCollator()([CacheDataset(tmp_path / "bf16")[0]])
    assert widen_hidden(bf16) is bf16


def test_prefetcher_applies_the_transform_without_cuda(tmp_path):
    write_cache(tmp_path, hidden_dtype=FP8, num_samples=10, num_shards=2)
    loader = DataLoader(CacheDataset(tmp_path), batch_size=4, collate_fn=CacheCollator())
    direct = list(loader)
    got = list(CUDAPrefetcher(loader, "cpu", transform=widen_hidden))
    assert len(got) == len(direct) == 3
    for batch, raw in zip(got, direct):
        assert batch["target_hidden_states"].dtype == torch.bfloat16 and "target_hidden_scales" not in batch
        expected = widen_hidden(raw)
        for key in expected:
            if isinstance(expected[key], torch.Tensor):
                assert torch.equal(batch[key], expected[key])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetcher_widens_on_the_gpu(tmp_path):
    write_cache(tmp_path, hidden_dtype=FP8, num_samples=10, num_shards=2)
    loader = DataLoader(CacheDataset(tmp_path), batch_size=4, collate_fn=CacheCollator())
    expected = [widen_hidden(batch) for batch in loader]
    got = list(CUDAPrefetcher(loader, "cuda", transform=widen_hidden))
    assert len(got) == len(expected) == 3
    for batch, on_cpu in zip(got, expected):
        assert "target_hidden_scales" not in batch and batch["record_ids"] == on_cpu["record_ids"]
        for key in HIDDEN:
            assert batch[key].is_cuda and batch[key].dtype == torch.bfloat16
            assert torch.equal(batch[key].cpu(), on_cpu[key])


def padded_tokens(batch, lengths):
    return len(batch) * int(lengths[batch].max())


def test_sampler_covers_every_index_once_within_the_token_budget():
    lengths = np.random.default_rng(1).integers(1, 400, 1000)
    sampler = LengthGroupedBatchSampler(lengths, max_tokens=2048, seed=3, group_size=256)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(1000))
        assert all(padded_tokens(b, lengths) <= 2048 for b in batches)
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    sampler.set_epoch(0)
    assert list(sampler) == epochs[0]  # deterministic for (seed, epoch)
    assert list(LengthGroupedBatchSampler(lengths, max_tokens=2048, seed=3, group_size=256)) == epochs[0]
    # grouping by length pads far less than random batches of the same sizes
    padding = sum(padded_tokens(b, lengths) for b in epochs[0]) - lengths.sum()
    order = np.random.default_rng(0).permutation(1000)
    cuts = np.cumsum([len(b) for b in epochs[0]])[:-1]
    random_padding = sum(padded_tokens(b, lengths) for b in np.split(order, cuts)) - lengths.sum()
    assert padding < random_padding / 4


def test_sampler_by_batch_size_and_drop_last():
    lengths = np.arange(1, 24)
    batches = list(LengthGroupedBatchSampler(lengths, batch_size=5, seed=0))
    assert sorted(len(b) for b in batches) == [3, 5, 5, 5, 5] and sorted(sum(batches, [])) == list(range(23))
    dropped = list(LengthGroupedBatchSampler(lengths, batch_size=5, seed=0, drop_last=True))
    assert len(dropped) == 4 and all(len(b) == 5 for b in dropped)
    exact = LengthGroupedBatchSampler(np.arange(1, 21), batch_size=5, drop_last=True)
    assert len(exact) == 4  # nothing partial to drop
    both = list(LengthGroupedBatchSampler(lengths, batch_size=4, max_tokens=40, seed=0))
    assert all(len(b) <= 4 and padded_tokens(b, lengths) <= 40 for b in both)
    ordered = list(LengthGroupedBatchSampler(lengths, batch_size=5, shuffle=False))
    assert ordered[0] == [22, 21, 20, 19, 18] and ordered[-1] == [2, 1, 0]  # longest first, unshuffled
    alone = list(LengthGroupedBatchSampler([50, 3, 3], max_tokens=10, shuffle=False))
    assert alone == [[0], [1, 2]]  # too long for the budget: a batch of its own
    with pytest.raises(ValueError):
        LengthGroupedBatchSampler(lengths)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: CacheCollator(pad_to_multiple_of=0.5), "^pad_to_multiple_of must be a whole number, not 0.5"),
    (lambda: LengthGroupedBatchSampler([3, 4], batch_size=float("nan")), "^batch_size must be a whole number, not nan"),
    (lambda: LengthGroupedBatchSampler([3, 4], max_tokens=0), "^max_tokens must be at least 1, found 0"),
    (lambda: LengthGroupedBatchSampler([3, 4], batch_size=2, group_size=True), "^group_size must be a whole number")])
def test_the_cache_readers_refuse_an_odd_number_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        make()
