"""Regeneration as a step, for `fuelline chat regenerate` and pipelines.

Its output (`regenerate_files.OutputPaths`) keeps the one resume contract
(`fuelline.pipeline.workdir`), its identity the model, every option that decides the answers
and the inputs: running again resumes by id, retries what failed, returns a finished output with
nothing left to retry as it is, and refuses another identity, naming it, unless `--restart`.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from fuelline.chat.regenerate import Regenerator
from fuelline.chat.regenerate_config import RegenerateConfig, resolve_servers
from fuelline.chat.regenerate_files import ERRORS_SUFFIX, RECORDS_FILE, OutputPaths, begun
from fuelline.model_source import CONFIG_ONLY, resolve_model
from fuelline.pipeline.options import group
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions
from fuelline.serve.launcher import ServeConfig, ServerGroup

SERVERS_DIR = "_servers"  # logs and servers.json of the servers a step started: a directory read skips it


@dataclass
class PipelineRegenerateConfig(RegenerateConfig):
    """The regenerate command's options, and (`serve_*`: `fuelline serve`'s options) the servers a
    pipeline step may start for itself, and stop after it; without `serve_model` it starts none
    (the command connects to servers started with `fuelline serve`)."""

    serve: ServeConfig = group(ServeConfig, prefix="serve_")


class RegenerateStep(Step):
    """Regenerate every assistant answer with the target model through OpenAI-compatible servers."""

    name, Config, produces_records = "regenerate", PipelineRegenerateConfig, True
    writes = (RECORDS_FILE, f"{RECORDS_FILE}{ERRORS_SUFFIX}", SERVERS_DIR)  # into a directory output
    warn = staticmethod(functools.partial(print, file=sys.stderr))  # a warning about the input (a repeated id)

    def check(self) -> None:
        if self.config.serve.model:  # the servers it would start: their model must exist
            resolve_model(self.config.serve.model, CONFIG_ONLY)

    def work_dir(self, output: Path, inputs: list[str]) -> WorkDir:
        step_dir = super().work_dir(output, inputs)
        paths = OutputPaths.of(output)
        if paths.records == Path(output):  # OUT.jsonl, with its errors and stats beside it
            return WorkDir(output, step_dir.identity, defaults=step_dir.defaults, renamed=step_dir.renamed,
                           beside=[paths.errors], reads=self.reads(inputs))
        return step_dir

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        step_dir = self.work_dir(output, inputs)
        with step_dir.lock():
            if options.restart:
                step_dir.restart()
            done = step_dir.finished()  # refused when other options finished here
            if done is not None and not done["dropped"].get("failed"):
                return done
            paths = OutputPaths.of(output)
            step_dir.begin(anything_finished=lambda: begun(paths))
            cfg = self.config
            if not cfg.serve.model:
                model, urls = resolve_servers(cfg.model, cfg.servers, cfg.servers_file)
                return step_dir.finish(self._regenerate(inputs, output, model, urls, options.progress))
            with ServerGroup.of(cfg.serve, log_dir=output / SERVERS_DIR) as group:
                stats = self._regenerate(inputs, output, cfg.model or group.model, list(cfg.servers) + group.urls,
                                         options.progress)
            return step_dir.finish(stats)

    def _regenerate(self, inputs, output: Path, model: str, urls: list[str], progress: bool):
        return Regenerator(inputs, output, urls, replace(self.config, model=model), resume=True, progress=progress,
                           warn=self.warn).run()
