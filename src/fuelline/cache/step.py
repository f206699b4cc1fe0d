"""The target cache as a pipeline step: the conversations of the step before, through the target.

The step's directory is the cache itself (manifest, index, shards, stats.json). A finished
cache with the same options and inputs is found again, an interrupted one resumes, one built
with other options is refused unless the pipeline runs with --restart. One process: for
several GPUs run `torchrun … -m fuelline cache build` on the step's input instead.
"""

from __future__ import annotations

from pathlib import Path

from fuelline.cache.plan import CacheConfig
from fuelline.model_source import CONFIG_ONLY, resolve_model
from fuelline.pipeline.step import Step
from fuelline.pipeline.workers import RunOptions


class CacheStep(Step):
    """Run the target model once over the conversations and store its hidden states."""

    name, Config = "cache", CacheConfig  # the options of `fuelline cache build` too
    ranks = None  # under torchrun, `fuelline cache build` sets this process's (`fuelline.cache.ranks.Ranks`)

    def check(self) -> None:
        resolve_model(self.config.model, CONFIG_ONLY)

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        from fuelline.cache.build import build_cache

        return build_cache(self.config.model, inputs, output, self.config, progress=options.progress,
                           restart=options.restart, ranks=self.ranks)
