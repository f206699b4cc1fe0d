"""Compact batches: what DataLoader workers hand over (3 bytes a token), widened to the item contract."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fuelline.loader import CUDAPrefetcher, TokenDataset, make_loader  # noqa: E402
from fuelline.loader.dataset import widen  # noqa: E402


@pytest.mark.parametrize("document_aware", [False, True])
def test_a_compact_batch_widens_to_the_same_batch(packed_poems, document_aware):
    wide = TokenDataset(packed_poems / "train", 128, document_aware=document_aware)
    compact = TokenDataset(packed_poems / "train", 128, document_aware=document_aware, compact=True)
    indices = [5, 0, 17, 3]
    small = compact.__getitems__(indices)
    assert small["input_ids"].dtype == np.uint16 and small["label_bits"].shape == (4, 16)  # 128 bits a window
    assert "labels" not in small
    assert all(isinstance(v, np.ndarray) for v in small.values())  # pickled through the pipe, not shared tensors
    expected = wide.__getitems__(indices)
    on_device = {k: torch.from_numpy(v) for k, v in small.items()}  # the prefetcher's path, after the copy
    for got in (widen(small), widen(on_device)):
        assert set(got) == set(expected)
        for key in expected:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_deliver_what_the_main_process_delivers(packed_poems, workers):
    dataset = TokenDataset(packed_poems / "train", 256)
    inline = list(make_loader(dataset, 8, seed=1))
    loader = make_loader(dataset, 8, seed=1, num_workers=workers)
    assert loader.dataset.compact and not dataset.compact  # the caller's dataset is left as it was
    with_workers = list(loader)
    assert len(with_workers) == len(inline)
    for a, b in zip(inline, with_workers):
        assert b["input_ids"].dtype == torch.int64
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])


def test_the_prefetcher_without_cuda_sees_widened_batches(packed_poems):
    loader = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0, num_workers=1)
    batch = next(iter(CUDAPrefetcher(loader, device="cpu")))
    assert batch["input_ids"].dtype == torch.int64 and "labels" in batch and "label_bits" not in batch
