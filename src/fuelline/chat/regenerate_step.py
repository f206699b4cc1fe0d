"""Regeneration as a pipeline step: the chat records of the step before, through the configured servers.

The step's directory holds `regenerated.jsonl`, its `.errors` file and `stats.json`; an
interrupted step resumes where it stopped (by id), a finished one is skipped, and other options
than those it was run with are refused unless the pipeline runs with --restart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fuelline.chat.regenerate import OutputPaths, RegenerateConfig, regenerate, resolve_servers
from fuelline.model_source import CONFIG_ONLY, resolve_model
from fuelline.pipeline.options import group
from fuelline.pipeline.step import Step
from fuelline.pipeline.workers import RunOptions
from fuelline.serve.launcher import ServeConfig, ServerGroup


@dataclass
class PipelineRegenerateConfig(RegenerateConfig):
    """The regenerate command's options, and (`serve_*`: `fuelline serve`'s options) the servers a
    pipeline step may start for itself, and stop after it; without `serve_model` it starts none
    (the command connects to servers started with `fuelline serve`)."""

    serve: ServeConfig = group(ServeConfig, prefix="serve_")


class RegenerateStep(Step):
    """Regenerate every assistant answer with the target model through OpenAI-compatible servers."""

    name, Config, produces_records = "regenerate", PipelineRegenerateConfig, True

    def check(self) -> None:
        if self.config.serve.model:  # the servers it would start: their model must exist
            resolve_model(self.config.serve.model, CONFIG_ONLY)

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        step_dir = self.work_dir(output, inputs)
        if options.restart:
            step_dir.discard()
        if (done := step_dir.finished()) is not None:  # refused when other options finished here
            return done
        cfg = self.config
        if not cfg.serve.model:
            return self._regenerate(inputs, output, *resolve_servers(cfg.model, cfg.servers, cfg.servers_file),
                                    options.progress)

        # logs and servers.json under _servers/: a directory read of the step's output skips it
        with ServerGroup.of(cfg.serve, log_dir=output / "_servers") as group:
            return self._regenerate(inputs, output, cfg.model or group.model, list(cfg.servers) + group.urls,
                                    options.progress)

    def _regenerate(self, inputs, output: Path, model: str, urls: list[str], progress: bool) -> dict:
        paths = OutputPaths.of(output)
        resume = any(p.exists() and p.stat().st_size for p in (paths.records, paths.errors))
        return regenerate(inputs, output, urls, replace(self.config, model=model), resume=resume, progress=progress,
                          step_dir=self.work_dir(output, inputs))
