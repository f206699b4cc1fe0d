import numpy as np
import pytest
import torch

from fuelline.formats.tokens import TokenDatasetWriter, TokenFiles
from fuelline.loader import (AlignmentError, CUDAPrefetcher, TokenDataset, causal_lm_loss, check_alignment,
                             make_loader)
from fuelline.tokenizer.train import SPECIAL_TOKENS

CONTENT = SPECIAL_TOKENS.index("<|content|>")


def stream(path):
    """The whole token stream and, from the documents' structure alone, which tokens are metadata."""
    files = TokenFiles(path)
    ids = np.asarray(files.tokens).astype(np.int64)
    prefix = np.zeros(len(ids), dtype=bool)
    for k in range(files.num_documents):
        start, stop = int(files.offsets[k]), int(files.offsets[k + 1])
        content = start + int(np.flatnonzero(ids[start:stop] == CONTENT)[0])
        prefix[start:content + 1] = True  # <s> … <|content|>
    return ids, prefix


def test_labels_align_with_inputs_and_mask_exactly_the_metadata_prefixes(packed_poems):
    ids, prefix = stream(packed_poems / "train")
    dataset = TokenDataset(packed_poems / "train", 128)
    rng = np.random.default_rng(0)
    windows = rng.integers(0, len(dataset), 200).tolist()
    batch = dataset.__getitems__(windows)
    check_alignment(batch)
    for row, w in enumerate(windows):
        span = slice(w * 128, (w + 1) * 128)
        assert batch["input_ids"][row].tolist() == ids[span].tolist()
        expected = np.where(prefix[span], -100, ids[span])
        assert batch["labels"][row].tolist() == expected.tolist()


def test_single_items_and_odd_window_lengths(packed_poems):
    ids, prefix = stream(packed_poems / "train")
    dataset = TokenDataset(packed_poems / "train", 77)  # windows do not start on a mask byte
    item = dataset[10]
    assert item["input_ids"].dtype == torch.int64 and item["input_ids"].shape == (77,)
    assert item["labels"].tolist() == np.where(prefix[770:847], -100, ids[770:847]).tolist()
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_document_aware_positions_restart_at_every_document(packed_poems):
    files = TokenFiles(packed_poems / "train")
    dataset = TokenDataset(packed_poems / "train", 256, document_aware=True)
    batch = dataset.__getitems__([3, 4])
    starts = set(np.asarray(files.offsets).tolist())
    for row, w in enumerate([3, 4]):
        positions = batch["position_ids"][row].tolist()
        for t, p in enumerate(positions):
            token = w * 256 + t
            assert p == 0 if (t == 0 or token in starts) else p == positions[t - 1] + 1
    cu = batch["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == 512 and cu == sorted(cu)
    assert len(cu) - 1 == int((batch["position_ids"] == 0).sum())


def test_check_alignment_catches_the_double_shift_and_masking_by_value(packed_poems):
    batch = TokenDataset(packed_poems / "train", 64).__getitems__([5, 6])
    shifted = dict(batch, labels=torch.cat([batch["labels"][:, 1:], torch.full((2, 1), -100)], dim=1))
    with pytest.raises(AlignmentError, match="double shift"):
        check_alignment(shifted)
    eos = SPECIAL_TOKENS.index("</s>")
    by_value = dict(batch, labels=torch.where(batch["input_ids"] == eos, -100, batch["labels"]))
    if bool((batch["input_ids"][:, :-8] == eos).any()):
        with pytest.raises(AlignmentError, match="pad id"):
            check_alignment(by_value, pad_id=eos)
    check_alignment(batch, pad_id=eos)  # the real labels train on </s>


def test_causal_lm_loss_shifts_once():
    torch.manual_seed(0)
    labels = torch.tensor([[5, 6, -100, 7]])
    logits = torch.full((1, 4, 10), -20.0)
    logits[0, 0, 6] = logits[0, 2, 7] = 20.0  # position t predicts the label at t + 1
    assert causal_lm_loss(logits, labels).item() < 1e-6
    # The same labels shifted before the model: position 1 is scored against 7, which it does not predict.
    assert causal_lm_loss(logits, torch.tensor([[6, -100, 7, -100]])).item() > 2


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_gives_the_uninterrupted_sequence(packed_poems, workers):
    dataset = TokenDataset(packed_poems / "train", 64)
    full = [b["input_ids"] for b in make_loader(dataset, 16, seed=3, num_workers=workers)]
    loader = make_loader(dataset, 16, seed=3, num_workers=workers)
    first = []
    for batch in loader:
        first.append(batch["input_ids"])
        if len(first) == 7:
            state = loader.state_dict()
            break
    resumed = make_loader(dataset, 16, seed=3, num_workers=workers)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(first) + len(rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(first + rest, full))
    assert set(state) >= {"position", "seed"} and all(isinstance(v, (int, bool)) for v in state.values())


def test_epochs_differ_and_ranks_partition_the_windows(packed_poems):
    dataset = TokenDataset(packed_poems / "train", 64)
    loader = make_loader(dataset, 8, seed=1)
    epoch_one = torch.cat([b["input_ids"][:, 0] for b in loader])
    epoch_two = torch.cat([b["input_ids"][:, 0] for b in loader])
    assert not torch.equal(epoch_one, epoch_two)
    samplers = [make_loader(dataset, 8, seed=1, rank=r, world_size=2).sampler for r in (0, 1)]
    seen = [set(s.indices(0, s.epoch_length).tolist()) for s in samplers]
    assert not seen[0] & seen[1]  # an epoch of rank 0 and one of rank 1 never share a window
    assert len(seen[0] | seen[1]) == 2 * samplers[0].epoch_length >= len(dataset) - 16


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_iterating_a_large_file_keeps_memory_flat(tmp_path):
    rng = np.random.default_rng(0)
    writer = TokenDatasetWriter(tmp_path / "big", dtype="uint16", vocab_size=50_000, bos_id=0, eos_id=1,
                                tokenizer={"fingerprint": "synthetic"}, with_mask=True)
    for _ in range(30):  # 30 × 1 M tokens = 60 MB of tokens
        lengths = np.full(1_000, 1_000)
        writer.add_documents(rng.integers(0, 50_000, 1_000_000), lengths, rng.random(1_000_000) < 0.8)
    writer.close()
    loader = make_loader(TokenDataset(tmp_path / "big", 1024), 64, seed=0)
    next(iter(loader))  # imports and compiled kernels are not the dataset's memory
    before = rss_mib()
    for _ in range(3):
        for _batch in loader:
            pass
    assert rss_mib() - before <= 50


def test_prefetcher_passes_batches_through_on_cpu(packed_poems):
    loader = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0)
    prefetched = list(CUDAPrefetcher(loader, "cpu"))
    direct = list(make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0))
    assert len(prefetched) == len(direct)
    assert all(torch.equal(a["labels"], b["labels"]) for a, b in zip(prefetched, direct))


def test_pinned_memory_only_with_an_accelerator(packed_poems, recwarn):
    loader = make_loader(TokenDataset(packed_poems / "train", 64), 4, num_workers=1)
    assert loader._loader.pin_memory == torch.cuda.is_available()
    next(iter(loader))
    assert not [w for w in recwarn if "pin_memory" in str(w.message)]


def test_mixture_weights_hold_over_every_prefix_and_resume(packed_poems):
    from fuelline.loader import make_mixture_loader
    from fuelline.loader.mixture import integer_weights

    train, val = TokenDataset(packed_poems / "train", 64), TokenDataset(packed_poems / "val", 64)
    loader = make_mixture_loader([train, val], [0.8, 0.2], 10, seed=2)
    picks = np.concatenate([loader.sampler.indices(0, 5_000) >= len(train)])  # True: from val
    counts = np.cumsum(picks)
    prefix = np.arange(1, len(picks) + 1)
    assert np.all(np.abs(counts - 0.2 * prefix) < 1)  # exact over every prefix, not on average
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 3:
            state = loader.state_dict()
        if len(batches) == 6:
            break
    resumed = make_mixture_loader([train, val], [0.8, 0.2], 10, seed=2)
    resumed.load_state_dict(state)
    again = [b for _, b in zip(range(3), resumed)]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches[3:], again))
    first = loader.sampler.indices(0, 10)
    expected = [train[int(i)] if i < len(train) else val[int(i) - len(train)] for i in first]
    assert torch.equal(batches[0]["labels"], torch.stack([e["labels"] for e in expected]))
    assert integer_weights([0.7, 0.3]).tolist() == [7, 3]
    with pytest.raises(ValueError, match="weights"):
        resumed.load_state_dict({**state, "weights": [1, 1]})


def test_prefetch_look_ahead_loses_no_batch_on_error_and_resumes_at_the_next_unseen_batch(packed_poems):
    # The CUDA path's look-ahead logic, driven on the CPU with an identity "copy".
    loader = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0)
    prefetcher = CUDAPrefetcher(loader, "cpu")

    def failing_after(n):
        for k, batch in enumerate(loader):
            if k == n:
                raise RuntimeError("disk gone")
            yield batch

    delivered = []
    with pytest.raises(RuntimeError, match="disk gone"):
        for batch in prefetcher._one_ahead(failing_after(5), lambda b: b):
            delivered.append(batch)
    assert len(delivered) == 5  # every good batch before the error is handed over

    fresh = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0)
    prefetcher = CUDAPrefetcher(fresh, "cpu")
    seen = []
    for batch in prefetcher._one_ahead(iter(fresh), lambda b: b):
        seen.append(batch)
        if len(seen) == 3:
            state = prefetcher.state_dict()
            break
    assert state["position"] == 3 * 4  # not 4 batches: the one fetched ahead is not counted
    resumed = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0)
    resumed.load_state_dict(state)
    reference = list(make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0))
    assert torch.equal(next(iter(resumed))["input_ids"], reference[3]["input_ids"])


def test_a_pack_output_instead_of_its_split_names_the_splits(packed_poems):
    from fuelline.formats.tokens import TokenFormatError

    with pytest.raises(TokenFormatError, match=r"a pack output, whose token datasets are its split directories "
                                               r"train, val; open one, e\.g\. .*train"):
        TokenDataset(packed_poems, seq_len=64)


@pytest.mark.parametrize(("argument", "value"), [
    ("batch_size", 0), ("batch_size", -4), ("batch_size", 2.5), ("batch_size", float("nan")), ("batch_size", True),
    ("world_size", 0), ("rank", 1.0), ("seed", 0.5), ("num_workers", -1), ("prefetch_factor", 0)])
def test_make_loader_refuses_an_odd_number_naming_it_before_any_batch(packed_poems, argument, value):
    dataset = TokenDataset(packed_poems / "train", 64)
    arguments = {"batch_size": 4, "num_workers": 1 if argument == "prefetch_factor" else 0, argument: value}
    with pytest.raises(ValueError, match=f"^{argument} must be .*{value!r}"):
        make_loader(dataset, **arguments)


@pytest.mark.parametrize("seq_len", [1, 64.0, float("inf")])
def test_a_token_dataset_refuses_an_odd_window_length(packed_poems, seq_len):
    with pytest.raises(ValueError, match="^seq_len must be"):
        TokenDataset(packed_poems / "train", seq_len)
