"""Packing as a pipeline step: the documents of the last record step, with a tokenizer step's output."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fuelline.pack.packer import PackConfig, pack
from fuelline.pipeline.step import Step, resolve_step
from fuelline.pipeline.workers import RunOptions


class PackStep(Step):
    """Tokenize documents (or chat records) into train/ and val/ token datasets with a loss mask."""

    name, Config, uses_workers = "pack", PackConfig, True

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        return pack(inputs, resolve_step(self.config.tokenizer, steps), output, self.config, **asdict(options))
