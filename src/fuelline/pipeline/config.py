"""Typed step options, and pipeline files: an ordered list of steps in TOML.

    [defaults]              # run options for every step (each may override them)
    workers = 2
    on_error = "skip"       # also pack's and the cache's own on_error, unless their table sets it
    executor = "ray"        # optional: Ray tasks instead of local processes (docs/ray.md)
    ray_address = "auto"    #   on the cluster at this address (none: one started for the run)

    [[step]]
    use = "ingest"          # a registered step
    input = "corpus/*.jsonl.zst"   # first step only; later steps read the one before
    text_key = "paragraphs" # the step's own options

Each step writes RUN_DIR/NN-NAME/; running the file again resumes where it stopped. `[[stage]]`,
the tables' earlier name, is still read, so that older files run as they did; a file that mixes
both is refused, as its order of steps would be ambiguous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.lock import exclusive_output
from fuelline.io.overlap import check_outputs
from fuelline.io.paths import expand_inputs
from fuelline.io.remote import refuse_url
from fuelline.io.stage_layout import PIPELINE_FILE
from fuelline.io.step_files import ForeignFiles
from fuelline.pipeline.options import build_config, option_fields, option_problem, replaced_names
from fuelline.pipeline.ray_executor import RayExecutor
from fuelline.pipeline.registry import make_step, step_class
from fuelline.pipeline.step import Step, resolve_step
from fuelline.pipeline.workdir import RESTART, Checked, StepOutputMismatch, checking
from fuelline.pipeline.workers import RunOptions

RUN_OPTION_KEYS = {f.name for f, _ in option_fields(RunOptions)}  # restart and progress are the command line's
STEP_TABLES = ("step", "stage")  # [[stage]]: the earlier name, still read


def _check_type(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_check_type(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_check_type(v, item) for v in value)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
PLURAL_WORDS = {int: "integers", float: "numbers", bool: "true or false values", str: "strings"}


def describe_type(hint: Any) -> str:
    """`hint` in a user's words: `float` is "a number", `list[str] | None` is "a list of strings"."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [h for h in typing.get_args(hint) if h is not type(None)]
        return " or ".join(describe_type(h) for h in members) if members else "nothing"
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return f"a list of {PLURAL_WORDS.get(item, describe_type(item))}" if item is not Any else "a list"
    if hint in TYPE_WORDS:
        return TYPE_WORDS[hint]
    return getattr(hint, "__name__", str(hint))


def build_dataclass(cls: type, values: dict[str, Any], where: str):
    """An instance of dataclass `cls` from `values` (its options, pipeline/options.py), refusing
    unknown keys, earlier spellings, wrong types, and values outside an option's declared choices or range:
    the one check of what the CLI and a pipeline file give."""
    fields = {f.name: (f, hint) for f, hint in option_fields(cls)}
    for old, (name, hint) in replaced_names(cls).items():
        if old in values:
            raise ValueError(f"{where}: option {old!r} is now {name!r}: {hint}")
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
    for key, value in values.items():
        field_, hint = fields[key]
        if not _check_type(value, hint):
            raise ValueError(f"{where}: option {key!r} must be {describe_type(hint)}, found {value!r}")
        if problem := option_problem(field_, value):
            raise ValueError(f"{where}: option {key!r} {problem}")
    try:
        return build_config(cls, values)
    except ValueError as e:  # a check across options (`bands` with `rows`), or a chat template that does not exist
        raise ValueError(f"{where}: {e}") from None


@dataclass
class PipelineStep:
    name: str
    step: Step
    run_options: RunOptions
    input: list[str] = field(default_factory=list)


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None


def load_pipeline(path: str | os.PathLike) -> list[PipelineStep]:
    path = Path(path)
    doc = read_toml(path)
    unknown = sorted(set(doc) - {"defaults", *STEP_TABLES})
    if unknown:
        raise ValueError(f"{path}: unknown table(s) {', '.join(unknown)}; expected [defaults] and [[step]]")
    if all(key in doc for key in STEP_TABLES):
        raise ValueError(f"{path}: both [[step]] and [[stage]] tables, whose order together is ambiguous; "
                         "write every step as [[step]] ([[stage]] is its earlier name)")
    key = next((key for key in STEP_TABLES if key in doc), "step")
    defaults = doc.get("defaults", {})
    build_dataclass(RunOptions, defaults, f"{path} [defaults]")
    if not doc.get(key):
        raise ValueError(f"{path}: no [[step]] tables")
    steps, names = [], set()
    for i, table in enumerate(doc[key], start=1):
        where = f"{path} [[{key}]] #{i}"
        table = dict(table)
        if "use" not in table:
            raise ValueError(f"{where}: missing key 'use' (the step to run)")
        use = table.pop("use")
        cls = step_class(use)
        name = table.pop("name", cls.name)
        if name in names:
            raise ValueError(f"{where}: step name {name!r} is used twice; give one a distinct 'name'")
        names.add(name)
        inputs = table.pop("input", [])
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        own = {f.name for f, _ in option_fields(cls.Config)}  # pack's and the cache's on_error are their own
        run_values = {**defaults, **{k: table.pop(k) for k in list(table) if k in RUN_OPTION_KEYS - own}}
        options = build_dataclass(RunOptions, run_values, where)
        shared = {k: v for k, v in defaults.items() if k in own}  # [defaults] on_error = "skip" reaches them too
        config = build_dataclass(cls.Config, {**shared, **table}, f"{where} ({cls.name})")
        step = make_step(use, config)
        try:
            step.check()
        except (ValueError, FileNotFoundError) as e:
            raise type(e)(f"{where} ({cls.name}): {e}") from None
        steps.append(PipelineStep(name, step, options, inputs))
    return steps


def run_pipeline(steps: list[PipelineStep], run_dir: str | os.PathLike, *, input: list[str] | None = None,
                 workers: int | None = None, executor: str | None = None, ray_address: str | None = None,
                 restart: bool = False, restart_from: str | None = None, progress: bool = True,
                 reads: Sequence[str | os.PathLike] = ()) -> list[dict]:
    """Run the steps in order; return their stats. `restart`: every step starts over;
    `restart_from`: the step of that name and those after it, the earlier ones resume; `reads`: what
    else the run reads (its pipeline file), kept out of the run directory as its inputs are.

    A step reads its `input` (paths, or `@NAME` for an earlier step's output), else the output of
    the last step that produced records (so `pack` after `tokenizer` still reads documents); the
    first step reads `--input` when given. `workers`, `executor` and `ray_address` (the command
    line's) override the file's; an executor given as local drops the file's Ray address.
    """
    refuse_url(run_dir, "a pipeline")  # its steps' inputs may be URLs, and `fuelline <stage>` may write to one
    run_dir = Path(run_dir)
    first_inputs = list(input or []) or [i for i in (steps[0].input if steps else []) if not i.startswith("@")]
    if first_inputs:
        expand_inputs(first_inputs)  # a missing input stops the run before it creates anything
    check_outputs([run_dir], [*first_inputs, *reads])  # it holds every step's output; each step checks its own inputs too
    given = {"workers": workers, "executor": executor, "ray_address": ray_address}
    overrides = {key: value for key, value in given.items() if value is not None}
    if executor == "local":
        overrides.setdefault("ray_address", None)
    names = [step.name for step in steps]
    if restart_from is not None and restart_from not in names:
        raise ValueError(f"--restart-from {restart_from}: the pipeline has no step of that name (its steps: "
                         f"{', '.join(names)})")
    first_restarted = 0 if restart else names.index(restart_from) if restart_from is not None else len(steps)
    options = [dataclasses.replace(step.run_options, restart=i >= first_restarted, progress=progress, **overrides)
               for i, step in enumerate(steps)]  # a contradiction (a Ray address for local) stops the run here
    with exclusive_output(run_dir):
        planned = _plan_steps(steps, run_dir, input)
        _check_outputs(planned, options)  # a refusal here leaves the run directory as it was
        with _one_ray_instance(steps, options):
            run_dir.mkdir(parents=True, exist_ok=True)
            _write_layout(run_dir, planned)
            by = f"--restart-from {restart_from}" if restart_from is not None and not restart else RESTART
            return _run_steps(planned, options, by)


def _one_ray_instance(steps: list[PipelineStep], step_options: list[RunOptions]):
    """When the steps on Ray all run without an address, one Ray instance started here for all of
    them (each step's executor would start and stop one of its own: seconds a step)."""
    on_ray = [o for step, o in zip(steps, step_options) if o.executor == "ray" and step.step.uses_workers]
    if not on_ray or any(o.ray_address is not None for o in on_ray):
        return contextlib.nullcontext()
    return RayExecutor(None, max(o.resolved_workers(1 << 30) for o in on_ray))


@dataclass
class PlannedStep:
    """A step of a run with where it reads and writes: `steps`, the earlier steps' outputs by name."""
    step: PipelineStep
    inputs: list[str]
    output: Path
    steps: dict[str, Path]


def _plan_steps(steps: list[PipelineStep], run_dir: Path, input: list[str] | None) -> list[PlannedStep]:
    """Each step's inputs and output directory, known before any step runs: RUN/NN-NAME."""
    outputs: dict[str, Path] = {}
    last_records: list[str] = []
    planned = []
    for i, step in enumerate(steps, start=1):
        if i == 1 and input:
            inputs = list(input)
        elif step.input:
            inputs = [os.fspath(resolve_step(s, outputs)) for s in step.input]
        else:
            inputs = last_records
        if not inputs and step.step.needs_input:
            raise ValueError(f"step {step.name!r} has no input: give --input or set 'input' in the pipeline file")
        out = run_dir / f"{i:02d}-{step.name}"
        planned.append(PlannedStep(step, inputs, out, dict(outputs)))
        outputs[step.name] = out
        if step.step.produces_records:
            last_records = [os.fspath(out)]
    return planned


def _check_outputs(planned: list[PlannedStep], step_options: list[RunOptions]) -> None:
    """Refuse the run, before it writes anything, when a step's output holds another identity's work:
    every step is run only as far as its output's state (`workdir.checking`). A step after one that
    will write may not be checkable yet (its input is not there): its own run decides."""
    writes = False
    for planned_step, options in zip(planned, step_options):
        try:
            with checking():
                planned_step.step.step.run(planned_step.inputs, planned_step.output, options, planned_step.steps)
        except Checked as e:
            writes = writes or e.writes
        except StepOutputMismatch as e:
            raise e.in_pipeline(planned_step.step.name) from None
        except Exception:
            if not writes:  # the run would stop here too, with nothing written before it
                raise


def _write_layout(run_dir: Path, planned: list[PlannedStep]) -> None:
    """RUN/pipeline.json, the steps in order (the report's), written only when it changed."""
    layout = [{"name": p.step.name, "stage": p.step.step.name, "dir": p.output.name} for p in planned]
    data = orjson.dumps({"stages": layout}, option=orjson.OPT_INDENT_2) + b"\n"
    path = run_dir / PIPELINE_FILE
    if not path.is_file() or path.read_bytes() != data:
        write_bytes_atomic(path, data)


def _run_steps(planned: list[PlannedStep], step_options: list[RunOptions], restarted_by: str) -> list[dict]:
    """Run each step; `restarted_by`: the option, as typed, that restarts steps (a step's refusal to
    delete a user's file names it, not the step's own --restart)."""
    all_stats = []
    for planned_step, options in zip(planned, step_options):
        step = planned_step.step
        try:
            all_stats.append(step.step.run(planned_step.inputs, planned_step.output, options, planned_step.steps))
        except StepOutputMismatch as e:
            raise e.in_pipeline(step.name) from None
        except ForeignFiles as e:
            if e.refusal != RESTART:  # replacing another run's unfinished output: not an option's doing
                raise
            raise e.by(restarted_by) from None
    return all_stats
