"""CUDAPrefetcher: the next batch is copied to the GPU while the current one is computed on.

Each batch is staged into reused pinned host buffers and copied on a side CUDA stream with
`non_blocking=True`; an event recorded after the copy is what the compute stream waits on, and
`record_stream` tells the caching allocator the tensors are used on the compute stream, so
their memory is not handed out again while kernels may still read it. Token ids travel in
their narrow dtype (uint16/int32: half or a quarter of the bytes) and are widened to int64 on
the GPU. An exception in the loader is re-raised at the batch where it happened; no stale
batch is ever served.

Without CUDA the prefetcher passes batches through (only `transform` applied): for a CPU
device, and for a CUDA device on a machine where CUDA is not available (a torch CPU build, no
GPU), so one training script runs on a laptop and on a GPU node. Its `state_dict()` is the one to save either way: on
a GPU the loader has already counted the batch fetched ahead, which the prefetcher subtracts.
"""

from __future__ import annotations

from fuelline.loader.dataset import widen

WIDEN = ("input_ids", "labels", "position_ids")


class CUDAPrefetcher:
    """Iterates `loader`'s batches on `device`, one batch copied ahead.

    `transform(batch) -> batch` runs on each batch once it is on the device: on CUDA inside the
    side stream, so its kernels overlap the caller's compute, and in the pass-through path too,
    so a training script sees the same batch either way. For a target cache stored as fp8,
    `CUDAPrefetcher(loader, transform=widen_hidden)` (`fuelline.cache.dataset.widen_hidden`)
    copies half the bytes of bf16 and widens them on the GPU. Batches of a `make_loader` loader
    with workers travel compact and are widened on the GPU too (see `ResumableLoader`)."""

    def __init__(self, loader, device=None, transform=None):
        import torch

        self.loader, self.transform = loader, transform
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()
        # A ResumableLoader with workers then yields compact batches (~2 bytes a token), widened
        # here after the copy: 5x fewer bytes through pinned memory and over PCIe.
        self._widen_compact = self.enabled and hasattr(loader, "defer_widening")
        if self._widen_compact:
            loader.defer_widening = True
        # Two sets of pinned buffers, used in turn: one is read by the copy in flight while the
        # next batch is staged into the other.
        self._slots = [{"buffers": {}, "copied": None}, {"buffers": {}, "copied": None}]
        self._turn = 0
        self._in_flight = 0  # batches fetched from the loader but not yet handed to the caller

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self._in_flight = 0
        if not self.enabled:
            yield from (self.transform(batch) for batch in self.loader) if self.transform else self.loader
            return
        import torch

        stream = torch.cuda.Stream(device=self.device)
        for batch, ready in self._one_ahead(iter(self.loader), lambda host: self._launch(host, stream)):
            torch.cuda.current_stream(self.device).wait_event(ready)
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    value.record_stream(torch.cuda.current_stream(self.device))
            yield batch

    def _one_ahead(self, iterator, launch):
        """Yield launch(batch) for each batch, launching batch k+1 before batch k is handed over
        (so its copy overlaps the caller's compute). A loader error while fetching k+1 is raised
        only after k has been handed over, so no good batch is lost."""
        try:
            pending = launch(next(iterator))
        except StopIteration:
            return
        while True:
            error, following = None, None
            try:
                following = launch(next(iterator))
            except StopIteration:
                pass
            except Exception as e:  # re-raised right after the batch before it
                error = e
            self._in_flight = 0 if following is None else 1
            yield pending
            if error is not None:
                raise error
            if following is None:
                return
            pending = following

    def state_dict(self) -> dict:
        """The loader's state minus the batch fetched ahead and not yet handed over: resuming
        continues with the next batch the caller has not seen."""
        state = self.loader.state_dict()
        return {**state, "position": state["position"] - self._in_flight * state["batch_size"]}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def _launch(self, host: dict, stream):
        """Stage a host batch into pinned buffers and start its copy on the side stream."""
        import torch

        slot = self._slots[self._turn]
        self._turn ^= 1
        if slot["copied"] is not None:
            slot["copied"].synchronize()  # the copy that last read these pinned buffers is done
        with torch.cuda.stream(stream):
            batch = {}
            for key, value in host.items():
                if not isinstance(value, torch.Tensor):
                    batch[key] = value
                    continue
                on_device = self._stage(slot, key, value).to(self.device, non_blocking=True)
                batch[key] = on_device.long() if key in WIDEN and on_device.dtype != torch.int64 else on_device
            if self._widen_compact:
                batch = widen(batch)
            if self.transform is not None:
                batch = self.transform(batch)
            ready = torch.cuda.Event()
            ready.record(stream)
        slot["copied"] = ready
        return batch, ready

    @staticmethod
    def _stage(slot: dict, key: str, value):
        """Copy into this slot's reused pinned buffer (unless the loader already pinned it)."""
        import torch

        if value.is_pinned():
            return value
        buffer = slot["buffers"].get(key)
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            slot["buffers"][key] = buffer
        buffer.copy_(value)
        return buffer
