"""CLI options generated from a step's Config (pipeline/options.py), for `fuelline` and its sub-command
modules alike (`fuelline cache build` is one): an option is declared once, as a Config field."""

from __future__ import annotations

import dataclasses
import types
import typing

import click

from fuelline.pipeline.options import (NO_DEFAULT, bound_problem, bounds_text, default_of, flag_of, option_fields,
                                       parse_size, replaced_names, size_text)
from fuelline.pipeline.workers import RunOptions


class Size(click.ParamType):
    """A byte count written as 64GiB, 500MB or 1e9."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as e:  # one line (`error: …`), as every other refused value
            raise ValueError(f"{param.opts[0] if param else 'size'}: {e}") from None


def _comma_list(item: type):
    """A click callback: `1,9,17` as [1, 9, 17] (items of type `item`)."""
    def callback(_ctx, _param, value):
        if value is None:
            return None
        try:
            return [item(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated values such as 1,9,17, not {value!r}") from None
    return callback


def within_bounds(field: dataclasses.Field, flag: str, parse=None):
    """A click callback refusing a value outside `field`'s declared range, in one line
    (`fuelline` prints a ValueError as `error: …` and exits 2); `parse` first, when given."""
    def callback(ctx, param, value):
        value = parse(ctx, param, value) if parse is not None else value
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if (problem := bound_problem(field, item)) is not None:
                raise ValueError(f"{flag} {problem}")
        return value
    return callback


def at_least(low: float):
    """A click callback for an option declared in click alone: a value under `low` refused in one line."""
    def callback(_ctx, param, value):
        if value is not None and value < low:
            raise ValueError(f"{param.opts[0]} must be at least {low:g}, found {value}")
        return value
    return callback


def _help_with_default(field: dataclasses.Field, flag: str) -> str:
    """The field's help, then its default (for a flag pair, the flag that is the default) and its range."""
    default, notes = default_of(field), []
    if isinstance(default, bool):
        notes.append(f"default: {flag if default else '--no-' + flag[2:]}")
    elif default not in (NO_DEFAULT, None, "", []) and not field.metadata.get("required"):
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        notes.append(f"default: {size_text(default) if field.metadata.get('size') else shown}")
    if bounds := bounds_text(field):
        notes.append(bounds)
    return field.metadata.get("help", "") + (f"  [{'; '.join(notes)}]" if notes else "")


def option_for(field: dataclasses.Field, hint) -> click.Option:
    """The CLI option of a Config field. Its default is None, "not given", so the Config's own
    default (or a --config file's value) applies; help shows the Config's default, its range and
    whether it is required."""
    flag = flag_of(field)
    short = field.metadata.get("short")  # `-w`
    names = [short, field.name] if short else [field.name]
    if field.metadata.get("step_ref"):  # a pipeline's @STEP; here a directory that must exist
        return click.Option([flag, *names], required=True, type=click.Path(exists=True, file_okay=False),
                            help=field.metadata.get("help", ""))
    help_text = _help_with_default(field, flag)
    common = {"default": None, "help": help_text, "required": bool(field.metadata.get("required")),
              "callback": within_bounds(field, flag)}
    if hint is bool or _optional_of(hint) is bool:
        return click.Option([f"{flag}/--no-{flag[2:]}", *names], **common)
    if field.metadata.get("comma_list"):
        (item,) = typing.get_args(hint)
        return click.Option([flag, *names],
                            **{**common, "callback": within_bounds(field, flag, _comma_list(item))})
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return click.Option([flag, *names], multiple=True, type=item,
                            **{**common, "help": f"{help_text} (repeatable)"})
    choices = field.metadata.get("choices")
    if choices:
        kind = click.Choice(choices)
    elif field.metadata.get("existing_file"):
        kind = click.Path(exists=True, dir_okay=False)
    elif field.metadata.get("size"):
        kind = Size()
    else:  # `int | None` and the like: the non-None member
        kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    return click.Option([flag, *names], type=kind, **common)


def replaced_options(config_cls) -> list[click.Option]:
    """A hidden option for each earlier spelling a Config's options replace (`--disable-thinking`,
    `--reasoning keep`), passed on under its old name so that `build_dataclass` refuses it with the hint."""
    fields = {f.name: hint for f, hint in option_fields(config_cls)}
    options = []
    for old, (name, hint) in replaced_names(config_cls).items():
        flag, kind = "--" + old.replace("_", "-"), fields[name]
        takes_value = not (kind is bool or _optional_of(kind) is bool)
        options.append(click.Option([flag if takes_value else f"{flag}/--no-{flag[2:]}", old], default=None,
                                    hidden=True, help=f"replaced by --{name.replace('_', '-')}: {hint}"))
    return options


def config_params(config_cls, names: set[str] | None = None) -> list[click.Option]:
    """One option per option of a step's Config (those of its groups included), or of those in `names`."""
    return [option_for(f, hint) for f, hint in option_fields(config_cls) if names is None or f.name in names] + \
        (replaced_options(config_cls) if names is None else [])


def run_params(*names: str) -> list[click.Option]:
    """The run options (`RunOptions`) a command takes, all of them when no `names` are given, then
    --restart and --quiet: declared once, for every command that runs steps."""
    fields = {f.name: (f, hint) for f, hint in option_fields(RunOptions)}
    return [option_for(*fields[name]) for name in names or fields] + [restart_option(), quiet_option()]


def run_options(values: dict, *names: str) -> RunOptions:
    """The RunOptions of a command's values (`run_params(*names)`), taken out of `values`."""
    names = names or [f.name for f, _ in option_fields(RunOptions)]
    chosen = given({name: values.pop(name) for name in names})
    return RunOptions(**chosen, restart=values.pop("restart"), progress=not values.pop("quiet"))


def workers_option() -> click.Option:
    """`-w/--workers` alone (`RunOptions.workers`), for a command that runs no steps but works in parallel."""
    return run_params("workers")[0]


def restart_option(help: str = "discard what the output holds and start over") -> click.Option:
    return click.Option(["--restart"], is_flag=True, help=help)


def quiet_option(shows_progress: bool = True) -> click.Option:
    """`-q/--quiet`, which every command takes (tests/test_cli_options.py walks them all), so that a script
    can pass it to any; `shows_progress=False`: the command draws no progress bar, and the flag changes nothing."""
    return click.Option(["--quiet", "-q"], is_flag=True, expose_value=shows_progress,
                        help="no progress bars" if shows_progress else "accepted by every command; this one draws "
                                                                         "no progress bar")


def _refuse_progress(_ctx, _param, value):
    if value is not None:
        raise ValueError("--progress/--no-progress is now --quiet/-q (progress bars are on unless --quiet is given), "
                         "as on every other command")
    return value


def old_progress_option() -> click.Option:
    """The earlier `--progress/--no-progress` of the cache commands, refused in one line with its new spelling."""
    return click.Option(["--progress/--no-progress", "old_progress"], default=None, hidden=True,
                        expose_value=False, callback=_refuse_progress, help="replaced by --quiet")


def given(values: dict) -> dict:
    """The options given on the command line (None and () are "not given"), lists as lists."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items() if v is not None and v != ()}


def _optional_of(hint):
    """X for `X | None`, else None."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    members = [t for t in typing.get_args(hint) if t is not type(None)]
    return members[0] if len(members) == 1 else None
