"""Stage names to classes. Imported lazily so `fuelline --help` stays instant."""

from __future__ import annotations

import importlib

from fuelline.pipeline.stage import Stage

STAGES: dict[str, str] = {
    "ingest": "fuelline.ingest:IngestStage",
    "boilerplate": "fuelline.clean.boilerplate:BoilerplateStage",
    "clean": "fuelline.clean.stage:CleanStage",
    "dedup": "fuelline.dedup.stage:DedupStage",
}


def stage_class(name: str) -> type[Stage]:
    try:
        target = STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; available: {', '.join(sorted(STAGES))}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
