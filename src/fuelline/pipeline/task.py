"""Pipeline steps that are not record-by-record: training a tokenizer, packing, the report.

A task reads its inputs whole (or another step's output) and writes its own directory, with a
`stats.json` like every stage, so the funnel report sees it. Re-running a pipeline skips a task
whose stats.json records the same options and inputs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson

from fuelline.io.paths import expand_inputs
from fuelline.io.remote import is_url
from fuelline.pipeline.options import identity_values
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.stage import StageConfig


class Task:
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type] = StageConfig  # a dataclass of `option` fields (pipeline/options.py)
    produces_records: ClassVar[bool] = False  # True: later steps read its output by default
    needs_input: ClassVar[bool] = True
    parallel: ClassVar[bool] = False  # True: runs on an executor; `run` takes `executor` and `ray_address` too

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    def identity(self, inputs: list[str]) -> dict[str, Any]:
        """What a finished run is recognized by: the options that decide the output, and the inputs."""
        return {"task": self.name, "config": identity_values(self.config),
                "inputs": describe_inputs(expand_inputs(inputs)) if inputs else []}

    def finished(self, output: Path, inputs: list[str]) -> dict | None:
        """The stats of an earlier run with the same options and inputs, if there is one."""
        path = output / "stats.json"
        if not path.exists():
            return None
        started = time.perf_counter()
        stats = orjson.loads(path.read_bytes())
        return resumed(stats, started) if stats.get("identity") == self.identity(inputs) else None

    def run(self, inputs: list[str], output: Path, *, workers: int | None, steps: dict[str, Path],
            restart: bool, progress: bool) -> dict:
        """Write `output` and its stats.json; a `parallel` task also takes `executor=` and `ray_address=`
        (`RunOptions`), which change how it runs, never what it writes."""
        raise NotImplementedError


def resumed(stats: dict, started: float) -> dict:
    """The stats of a finished step found again: marked resumed, with this run's time, not the original's."""
    return {**stats, "resumed": True, "original_wall_seconds": stats.get("wall_seconds"),
            "wall_seconds": round(time.perf_counter() - started, 3)}


def resolve_step(reference: str, steps: dict[str, Path]) -> Path | str:
    """A path, a URL (kept as it is), or `@NAME`: the output directory of the pipeline step called
    NAME, or `@NAME/OUTPUT`: a further named output of that step (e.g. `@chat-prepare/eval`)."""
    if reference.startswith("@"):
        name, _, output = reference[1:].partition("/")
        try:
            directory = steps[name]
        except KeyError:
            raise ValueError(f"no earlier step named {name!r} (known: {', '.join(steps) or 'none'})") from None
        return directory / output if output else directory
    if is_url(reference):
        return reference
    return Path(os.path.expanduser(reference))
