"""A step's options declared once, as the fields of its Config dataclass.

Each field carries its default, its help text, its choices, and whether it is part of what the
step makes (`identity`): `--threads` or `--concurrency` change how fast, never what, so a run
that differs only in them resumes. The CLI options (cli.py), the pipeline-file keys
(pipeline/config.py) and the identity a finished step is recognized by are all read from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

NO_DEFAULT = dataclasses.MISSING


def option(default: Any = NO_DEFAULT, help: str = "", *, factory: Callable[[], Any] | None = None,
           choices: list[str] | tuple[str, ...] | None = None, identity: bool = True,
           step_ref: bool = False) -> Any:
    """A Config field. `step_ref`: a directory that a pipeline file may name as @STEP (an earlier
    step's output, the default there); the CLI requires it and checks that it exists."""
    metadata = {"help": help, "identity": identity, "step_ref": step_ref}
    if choices:
        metadata["choices"] = list(choices)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def default_of(field: dataclasses.Field) -> Any:
    """The default of `field` (its factory's value for a list), or NO_DEFAULT."""
    if field.default_factory is not NO_DEFAULT:
        return field.default_factory()
    return field.default


def identity_values(config) -> dict[str, Any]:
    """The fields of `config` that decide what the step writes, as plain values."""
    values = dataclasses.asdict(config)
    return {f.name: values[f.name] for f in dataclasses.fields(config) if f.metadata.get("identity", True)}
