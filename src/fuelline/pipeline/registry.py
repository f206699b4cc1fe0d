"""Step names to classes. Imported lazily so `fuelline --help` stays instant."""

from __future__ import annotations

import importlib

from fuelline.pipeline.stage import Stage
from fuelline.pipeline.step import Step

# Record stages: run shard by shard by the executor (`RecordStep`); each has a generated command.
STAGES: dict[str, str] = {
    "ingest": "fuelline.ingest:IngestStage",
    "boilerplate": "fuelline.clean.boilerplate:BoilerplateStage",
    "clean": "fuelline.clean.stage:CleanStage",
    "dedup": "fuelline.dedup.stage:DedupStage",
    "decontaminate": "fuelline.decontaminate.stage:DecontaminateStage",
    "chat-prepare": "fuelline.chat.prepare:ChatPrepareStage",
    "chat-from-poetry": "fuelline.chat.from_poetry:ChatFromPoetryStage",
}

# Steps that run over their inputs themselves, not shard by shard (they have commands of their own).
STEPS: dict[str, str] = {
    "tokenizer": "fuelline.tokenizer.step:TokenizerStep",
    "pack": "fuelline.pack.step:PackStep",
    "report": "fuelline.report.step:ReportStep",
    "regenerate": "fuelline.chat.regenerate_step:RegenerateStep",
    "cache": "fuelline.cache.step:CacheStep",
    "specforge-export": "fuelline.cache.export_specforge:SpecForgeExportStep",
    "speculators-export": "fuelline.cache.export_speculators:SpeculatorsExportStep",
    "vocab-map": "fuelline.cache.vocab_map:VocabMapStep",
}


def step_class(name: str) -> type[Stage] | type[Step]:
    """The class of the record stage or step called `name`: its `Config`, `description` and, for a
    step, `run`."""
    try:
        target = {**STAGES, **STEPS}[name]
    except KeyError:
        raise ValueError(f"unknown step {name!r}; available: {', '.join(sorted({**STAGES, **STEPS}))}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def make_step(name: str, config) -> Step:
    """The pipeline step `name` with options `config`; a record stage becomes its `RecordStep`."""
    from fuelline.pipeline.executor import RecordStep  # not on `fuelline --help`'s path

    cls = step_class(name)
    return RecordStep(cls(config)) if name in STAGES else cls(config)
