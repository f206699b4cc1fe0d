"""CUDAPrefetcher on a machine without CUDA: the README's `CUDAPrefetcher(loader, "cuda")`."""

import pytest
import torch

from fuelline.loader import CUDAPrefetcher, TokenDataset, make_loader

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")


def test_asking_for_cuda_without_cuda_passes_batches_through_and_resumes(packed_poems):
    loader = make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0)
    prefetcher = CUDAPrefetcher(loader, "cuda")
    direct = list(make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0))
    seen = []
    for batch in prefetcher:
        seen.append(batch)
        if len(seen) == 3:
            state = prefetcher.state_dict()
    assert len(seen) == len(direct)
    for got, expected in zip(seen, direct):
        assert got.keys() == expected.keys()
        for key in got:  # the same tensors, on the CPU, in their own dtype
            assert got[key].device.type == "cpu" and got[key].dtype == expected[key].dtype
            assert torch.equal(got[key], expected[key])
    assert state == {**loader.state_dict(), "position": 3 * 4}  # nothing fetched ahead
    resumed = CUDAPrefetcher(make_loader(TokenDataset(packed_poems / "train", 64), 4, seed=0), "cuda")
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed))["input_ids"], direct[3]["input_ids"])
