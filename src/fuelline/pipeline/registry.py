"""Stage names to classes. Imported lazily so `fuelline --help` stays instant."""

from __future__ import annotations

import importlib

from fuelline.pipeline.stage import Stage

STAGES: dict[str, str] = {
    "ingest": "fuelline.ingest:IngestStage",
    "boilerplate": "fuelline.clean.boilerplate:BoilerplateStage",
    "clean": "fuelline.clean.stage:CleanStage",
    "dedup": "fuelline.dedup.stage:DedupStage",
    "chat-prepare": "fuelline.chat.prepare:ChatPrepareStage",
    "chat-from-poetry": "fuelline.chat.from_poetry:ChatFromPoetryStage",
}


# Steps a pipeline file can use that are not record stages (they have CLI commands of their own).
TASKS: dict[str, str] = {
    "tokenizer": "fuelline.tokenizer.task:TokenizerTask",
    "pack": "fuelline.pack.task:PackTask",
    "report": "fuelline.report.task:ReportTask",
    "regenerate": "fuelline.chat.task:RegenerateTask",
    "cache": "fuelline.cache.task:CacheTask",
}


def stage_class(name: str) -> type[Stage]:
    """The class of a record stage or task called `name`."""
    try:
        target = {**STAGES, **TASKS}[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; available: {', '.join(sorted({**STAGES, **TASKS}))}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
