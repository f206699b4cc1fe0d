"""Packing as a pipeline step: the documents of the last record step, with a tokenizer step's output."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fuelline.pack.packer import PackConfig, pack
from fuelline.pipeline.stage import StageConfig
from fuelline.pipeline.task import Task, options_for, resolve_step


@dataclass
class PackStepConfig(StageConfig):
    tokenizer: str = field(default="@tokenizer", metadata={"help": "tokenizer directory, or @STEP for a step's output"})
    template: str = field(default="poetry", metadata={
        "help": "document template, or chat for chat records", "choices": ["poetry", "plain", "chat"]})
    chat_template: str = field(default="chatml", metadata={"help": "template chat: the chat template"})
    max_length: int = field(default=0, metadata={"help": "template chat: cut longer conversations (0: no limit)"})
    min_loss_tokens: int = field(default=1, metadata={"help": "template chat: fewest supervised tokens kept"})
    metadata_dropout: float = field(default=0.25, metadata={"help": "share of documents packed without metadata"})
    val_fraction: float = field(default=0.05, metadata={"help": "share of documents in val/"})
    seed: int = field(default=42, metadata={"help": "decides split and dropout per document"})
    dtype: str = field(default="auto", metadata={"help": "token dtype", "choices": ["auto", "uint16", "uint32"]})
    threads: int = field(default=0, metadata={"help": "tokenizer threads per worker (0: the library's default)"})


class PackTask(Task):
    name = "pack"
    description = "Tokenize documents into train/ and val/ token datasets."
    Config = PackStepConfig
    parallel = True

    def run(self, inputs, output: Path, *, workers, steps, restart, progress, executor, ray_address) -> dict:
        cfg = self.config
        return pack(inputs, resolve_step(cfg.tokenizer, steps), output, options_for(PackConfig, cfg), workers=workers,
                    threads=cfg.threads or None, restart=restart, progress=progress, executor=executor,
                    ray_address=ray_address)
