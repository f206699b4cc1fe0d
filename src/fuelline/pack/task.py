"""Packing as a pipeline step: the documents of the last record step, with a tokenizer step's output."""

from __future__ import annotations

from pathlib import Path

from fuelline.pack.packer import PackConfig, pack
from fuelline.pipeline.task import Task, resolve_step


class PackTask(Task):
    name = "pack"
    description = "Tokenize documents (or chat records) into train/ and val/ token datasets with a loss mask."
    Config = PackConfig
    parallel = True

    def run(self, inputs, output: Path, *, workers, steps, restart, progress, executor, ray_address) -> dict:
        return pack(inputs, resolve_step(self.config.tokenizer, steps), output, self.config, workers=workers,
                    restart=restart, progress=progress, executor=executor, ray_address=ray_address)
