"""Regeneration as a pipeline step: the chat records of the step before, through the configured servers.

The step's directory holds `regenerated.jsonl`, its `.errors` file and `stats.json`; an
interrupted step resumes where it stopped (by id), a finished one is skipped, and other options
than those it was run with are refused unless the pipeline runs with --restart.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fuelline.chat.regenerate import PRESETS, TAKEN_FINISH_REASONS, OutputPaths, RegenerateConfig, regenerate, resolve_servers
from fuelline.pipeline.stage import StageConfig
from fuelline.pipeline.task import Task
from fuelline.serve.client import ClientConfig


@dataclass
class RegenerateStepConfig(StageConfig):
    model: str = field(default="", metadata={"help": "model name sent with each request (default: the servers file's)"})
    servers: list[str] = field(default_factory=list, metadata={"help": "HOST:PORT or URL of each server"})
    servers_file: str = field(default="", metadata={"help": "servers file written by `fuelline serve`"})
    preset: str = field(default="none", metadata={"help": "recommended sampling of the target family (qwen3, gemma4; none: the server's)",
                                                  "choices": list(PRESETS)})
    temperature: float | None = field(default=None, metadata={"help": "overrides the preset"})
    top_p: float | None = field(default=None, metadata={"help": "overrides the preset"})
    top_k: int | None = field(default=None, metadata={"help": "overrides the preset"})
    min_p: float | None = field(default=None, metadata={"help": "overrides the preset"})
    max_tokens: int = field(default=4096, metadata={"help": "longest answer"})
    disable_thinking: bool = field(default=False, metadata={"help": "chat_template_kwargs enable_thinking false"})
    drop_truncated: bool = field(default=False, metadata={"help": "drop conversations with a truncated answer"})
    keep_empty_answers: bool = field(default=False, metadata={"help": "take empty and whitespace-only answers "
                                                                      "(default: failures, retried)"})
    finish_reasons: list[str] = field(default_factory=lambda: list(TAKEN_FINISH_REASONS),
                                      metadata={"help": "finish reasons of the answers taken; an answer ending "
                                                        "otherwise (abort, ...) is a failure, retried"})
    concurrency: int = field(default=64, metadata={"help": "requests in flight per server"})
    request_timeout: float = field(default=600.0, metadata={"help": "seconds per request"})
    attempts: int = field(default=5, metadata={"help": "tries per request"})
    all_down_timeout: float = field(default=300.0, metadata={"help": "seconds without any server answering "
                                                                     "before the step stops"})
    serve_model: str = field(default="", metadata={"help": "start `fuelline serve` servers of this model directory "
                                                            "for the step, and stop them after it"})
    serve_engine: str = field(default="transformers", metadata={"help": "engine of the servers started",
                                                                 "choices": ["sglang", "vllm", "transformers"]})
    serve_ports: str = field(default="30000", metadata={"help": "ports of the servers started: 30000, "
                                                                 "30000-30007 or 30000,30001"})
    serve_gpus_per_server: int = field(default=1, metadata={"help": "GPUs per server started (0: CPU)"})


HOW_NOT_WHAT = ("servers", "servers_file", "serve_engine", "serve_ports", "serve_gpus_per_server", "concurrency",
                "request_timeout", "attempts", "all_down_timeout")


class RegenerateTask(Task):
    name = "regenerate"
    description = "Regenerate every assistant answer with the target model through OpenAI-compatible servers."
    Config = RegenerateStepConfig
    produces_records = True

    def identity(self, inputs: list[str]) -> dict:
        """Which servers answer, and how many requests each takes at once, do not change the output."""
        identity = super().identity(inputs)
        identity["config"] = {k: v for k, v in identity["config"].items() if k not in HOW_NOT_WHAT}
        return identity

    def run(self, inputs, output: Path, *, workers, steps, restart, progress) -> dict:
        if not restart and (done := self.finished(output, inputs)):
            return done
        if restart and output.exists():
            shutil.rmtree(output)
        cfg = self.config
        if not cfg.serve_model:
            return self._regenerate(inputs, output, *resolve_servers(cfg.model, cfg.servers, cfg.servers_file),
                                    progress)
        from fuelline.serve.launcher import ServerGroup

        # logs and servers.json under _servers/: a directory read of the step's output skips it
        with ServerGroup(cfg.serve_engine, cfg.serve_model, cfg.serve_ports, log_dir=output / "_servers",
                         gpus_per_server=cfg.serve_gpus_per_server) as group:
            return self._regenerate(inputs, output, cfg.model or group.model, list(cfg.servers) + group.urls,
                                    progress)

    def _regenerate(self, inputs, output: Path, model: str, urls: list[str], progress: bool) -> dict:
        cfg = self.config
        config = RegenerateConfig(
            model=model, preset=cfg.preset, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            min_p=cfg.min_p, max_tokens=cfg.max_tokens, disable_thinking=cfg.disable_thinking,
            drop_truncated=cfg.drop_truncated, keep_empty_answers=cfg.keep_empty_answers,
            finish_reasons=tuple(cfg.finish_reasons),
            client=ClientConfig(concurrency=cfg.concurrency, request_timeout=cfg.request_timeout, attempts=cfg.attempts,
                                all_down_timeout=cfg.all_down_timeout))
        paths = OutputPaths.of(output)
        started_before = any(p.exists() and p.stat().st_size for p in (paths.records, paths.errors))
        if started_before and paths.stats.exists():
            raise ValueError(f"{output} holds a regeneration made with other options or inputs; "
                             "run the pipeline with --restart to redo it")
        return regenerate(inputs, output, urls, config, resume=started_before, progress=progress,
                          identity=self.identity(inputs))
