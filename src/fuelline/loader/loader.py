"""`make_loader`: a DataLoader over a TokenDataset whose position can be saved and restored."""

from __future__ import annotations

from fuelline.loader.dataset import as_tensors, widen
from fuelline.loader.sampler import WindowSampler
from fuelline.pipeline.options import check_number


def _already_batched(batch):
    """The dataset's __getitems__ returns whole batches: nothing left to collate."""
    return batch


def accelerator_present() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator.is_available()) if accelerator is not None else torch.cuda.is_available()


class ResumableLoader:
    """Iterates batches; `state_dict()` says how many were delivered, so a resumed run continues
    with the next one, whatever the number of workers or how far they had prefetched.

    With workers, the dataset gathers compact batches (`TokenDataset(compact=True)`: ~2 bytes a
    token, as numpy arrays, cross from the worker instead of two int64 tensors) and the loader
    widens them in the main process,
    so the batches it yields are the usual int64 ones. `defer_widening = True` yields them
    compact instead: `CUDAPrefetcher` sets it, copies the compact batch and widens on the GPU."""

    def __init__(self, dataset, sampler: WindowSampler, **dataloader_options):
        import copy

        from torch.utils.data import DataLoader

        if dataloader_options.get("num_workers") and hasattr(dataset, "compact"):
            dataset = copy.copy(dataset)
            dataset.compact = True
        self.dataset, self.sampler = dataset, sampler
        self.defer_widening = False
        sampler.tracked_by_loader = True
        self._loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=_already_batched, **dataloader_options)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        start = self.sampler.position
        delivered = 0
        try:
            for batch in self._loader:
                delivered += 1
                self.sampler.position = start + delivered * self.sampler.batch_size
                yield as_tensors(batch) if self.defer_widening else widen(batch)
        finally:
            # Workers may have drawn batches that were never delivered: they come again.
            self.sampler.position = start + delivered * self.sampler.batch_size

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def make_loader(dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0, world_size: int = 1,
                num_workers: int = 0, pin_memory: bool | None = None, prefetch_factor: int | None = None) -> ResumableLoader:
    """A resumable loader; pinned memory is on exactly when an accelerator is present (pinning
    without one only warns and costs a copy). A number out of range (a batch size of 0, a float)
    is a ValueError naming it, here, before any batch."""
    sampler = WindowSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
    return ResumableLoader(dataset, sampler, **_dataloader_options(num_workers, pin_memory, prefetch_factor))


def _dataloader_options(num_workers: int, pin_memory: bool | None, prefetch_factor: int | None) -> dict:
    """Workers persist from epoch to epoch: starting them again costs ~0.2 s, an eighth of an epoch
    of the packed poetry corpus at 32 x 1024. The order stays the main process's (the sampler)."""
    check_number("num_workers", num_workers, min=0)
    check_number("prefetch_factor", prefetch_factor, min=1, optional=True)
    options = {"num_workers": num_workers, "pin_memory": accelerator_present() if pin_memory is None else pin_memory}
    if num_workers > 0:
        options["persistent_workers"] = True
        if prefetch_factor is not None:
            options["prefetch_factor"] = prefetch_factor
    return options


def make_mixture_loader(datasets: list, weights: list[float], batch_size: int, *, shuffle: bool = True,
                        seed: int = 0, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                        pin_memory: bool | None = None) -> ResumableLoader:
    """A resumable loader over several TokenDatasets, drawing from each by exact weights."""
    from fuelline.loader.mixture import MixtureDataset, MixtureSampler

    sampler = MixtureSampler([len(d) for d in datasets], weights, batch_size, shuffle=shuffle, seed=seed,
                             rank=rank, world_size=world_size)
    return ResumableLoader(MixtureDataset(datasets), sampler, **_dataloader_options(num_workers, pin_memory, None))
