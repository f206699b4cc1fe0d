"""Where a cache build runs among its ranks, handed to `build_cache` by its caller.

The build never reads its rank from the environment (STYLE.md, habit 1): the CLI reads what
torchrun sets (`Ranks.from_env`), a pipeline step or a test builds on one rank (`Ranks()`).
The ranks talk only through the gloo backend (a barrier and a few small objects), so a CPU
run with 2 ranks behaves as a GPU run does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks (rank 0 of 1 by default). `torchrun`: started by
    torchrun, whose death must end this rank (it holds the output)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    torchrun: bool = False

    @classmethod
    def from_env(cls) -> Ranks:
        """What torchrun says of this process (RANK, WORLD_SIZE, LOCAL_RANK); for the CLI to call once."""
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")), "TORCHELASTIC_RUN_ID" in os.environ)

    def connect(self) -> None:
        """Join the other ranks (and die with torchrun) before the build starts."""
        if self.torchrun:
            from fuelline.pipeline.lifetime import die_with_parent

            die_with_parent(os.getppid())
        if self.world_size > 1:
            import torch.distributed as dist

            if not dist.is_initialized():  # ranks wait for each other through whole builds: no short timeout
                dist.init_process_group("gloo", timeout=timedelta(days=7))

    def share(self, value, source: int = 0):
        """`value` of rank `source`, on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=source)
        return box[0]

    def gather(self, value) -> list:
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def close(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
