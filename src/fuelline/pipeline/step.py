"""What a pipeline step is: one protocol for every step `fuelline run` drives.

A step has a name, a typed `Config` (a dataclass of `option` fields, `fuelline.pipeline.options`:
the command's options, the pipeline file's keys and the identity are generated from it), says
whether later steps read its output as records, and runs: inputs in, one output out, under the
one resume contract of `fuelline.pipeline.workdir` (lock, plan marker, identity, stats.json),
whether a pipeline or its command runs it.

Record stages (`fuelline.pipeline.stage`) are steps through `fuelline.pipeline.executor.RecordStep`,
which runs them shard by shard; the other steps (`fuelline.pipeline.registry.STEPS`) implement `run`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from fuelline.io.paths import expand_inputs
from fuelline.io.remote import is_url
from fuelline.pipeline.options import identity_history, identity_values, read_paths
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions


class Step:
    """Subclasses set `name` and `Config`; their docstring is the command's help (`description`)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type]  # a dataclass of `option` fields
    produces_records: ClassVar[bool] = False  # True: later steps read its output by default
    needs_input: ClassVar[bool] = True
    uses_workers: ClassVar[bool] = False  # True: how it runs follows the run's workers, executor and Ray address
    # what it writes in a directory output, beside the markers (`fuelline.io.step_files`): all --restart deletes
    writes: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.description = " ".join((cls.__doc__ or "").split())

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    def identity(self, inputs: list[str]) -> dict[str, Any]:
        """What a finished run is recognized by: the options that decide the output, and the inputs."""
        return {"task": self.name, "config": identity_values(self.config),
                "inputs": describe_inputs(expand_inputs(inputs)) if inputs else []}

    def work_dir(self, output: Path, inputs: list[str]) -> WorkDir:
        """The step's output directory with this run's identity (`fuelline.pipeline.workdir`)."""
        return WorkDir(output, self.identity(inputs), **identity_history(self.Config), reads=self.reads(inputs),
                       writes=self.writes)

    def reads(self, inputs: list[str]) -> list[str]:
        """What the step reads, for the overlap rule: its inputs and the paths its options name."""
        return [*inputs, *read_paths(self.config)]

    def check(self) -> None:
        """Raise on what is known to be wrong before anything runs (a model that does not exist), so
        that a pipeline file is refused when it is loaded, not when its step is reached."""

    def run(self, inputs: list[str], output: Path, options: RunOptions, steps: dict[str, Path]) -> dict:
        """Write `output` and its stats.json; return the stats. `steps`: the output directory of each
        earlier step by name (for `@NAME` options). `options` change how it runs, never what it writes."""
        raise NotImplementedError


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
