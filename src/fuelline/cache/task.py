"""The target cache as a pipeline step: the conversations of the step before, through the target.

The step's directory is the cache itself (manifest, index, shards, stats.json). A finished
cache with the same options and inputs is found again, an interrupted one resumes, one built
with other options is refused unless the pipeline runs with --restart. One process: for
several GPUs run `torchrun … -m fuelline cache build` on the step's input instead.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fuelline.cache.plan import CacheConfig
from fuelline.formats.target_cache import FORMATS, FUELLINE
from fuelline.pipeline.stage import StageConfig
from fuelline.pipeline.task import Task, options_for


@dataclass
class CacheStepConfig(StageConfig):
    model: str = field(default="", metadata={"help": "the target model's directory"})
    layers: list[int] = field(default_factory=list, metadata={"help": "layer ids to capture, ascending"})
    chat_template: str = field(default="auto", metadata={"help": "chat template (auto: the tokenizer's own)"})
    max_length: int = field(default=4096, metadata={"help": "longest conversation in tokens"})
    min_loss_tokens: int = field(default=14, metadata={"help": "drop conversations with fewer supervised tokens"})
    format: str = field(default=FUELLINE, metadata={"help": "cache format", "choices": list(FORMATS)})
    hidden_dtype: str = field(default="bf16", metadata={"help": "bf16 or fp8", "choices": ["bf16", "fp8"]})
    batch_tokens: int = field(default=16384, metadata={"help": "padded tokens per forward batch"})
    max_shard_bytes: int = field(default=64 << 30, metadata={"help": "largest shard file, in bytes"})
    min_shards: int = field(default=8, metadata={"help": "at least this many shards"})
    device: str = field(default="auto", metadata={"help": "auto, cuda or cpu"})


class CacheTask(Task):
    name = "cache"
    description = "Run the target model once over the conversations and store its hidden states."
    Config = CacheStepConfig

    def run(self, inputs, output: Path, *, workers, steps, restart, progress) -> dict:
        from fuelline.cache.build import build_cache

        cfg = self.config
        if not cfg.model or not cfg.layers:
            raise ValueError("the cache step needs 'model' (the target's directory) and 'layers'")
        if restart and output.exists():
            shutil.rmtree(output)
        return build_cache(cfg.model, inputs, output, options_for(CacheConfig, cfg), progress=progress)
