"""CLI options generated from a step's Config (pipeline/options.py), for `fuelline` and its sub-command
modules alike (`fuelline cache build` is one): an option is declared once, as a Config field."""

from __future__ import annotations

import dataclasses
import types
import typing

import click

from fuelline.pipeline.options import NO_DEFAULT, default_of, option_fields, parse_size, size_text


class Size(click.ParamType):
    """A byte count written as 64GiB, 500MB or 1e9."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


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


def _shown_default(field: dataclasses.Field) -> str:
    default = default_of(field)
    if field.metadata.get("size"):
        return size_text(default)
    return ",".join(map(str, default)) if isinstance(default, list) else default


def option_for(field: dataclasses.Field, hint) -> click.Option:
    """The CLI option of a Config field. Its default is None, "not given", so the Config's own
    default (or a --config file's value) applies; help shows the Config's default."""
    flag, name = field.metadata.get("flag") or "--" + field.name.replace("_", "-"), field.name
    help_text = field.metadata.get("help", "")
    if field.metadata.get("step_ref"):  # a pipeline's @STEP; here a directory that must exist
        return click.Option([flag, name], required=True, type=click.Path(exists=True, file_okay=False), help=help_text)
    shown = _shown_default(field)
    if shown not in (NO_DEFAULT, None, "") and not isinstance(shown, bool):
        help_text += f"  [default: {shown}]"
    if hint is bool or _optional_of(hint) is bool:
        return click.Option([f"{flag}/--no-{flag[2:]}", name], default=None, help=help_text)
    if field.metadata.get("comma_list"):
        (item,) = typing.get_args(hint)
        return click.Option([flag, name], default=None, help=help_text, callback=_comma_list(item))
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return click.Option([flag, name], multiple=True, type=item, help=f"{help_text} (repeatable)")
    choices = field.metadata.get("choices")
    if choices:
        kind = click.Choice(choices)
    elif field.metadata.get("existing_file"):
        kind = click.Path(exists=True, dir_okay=False)
    elif field.metadata.get("size"):
        kind = Size()
    else:  # `int | None` and the like: the non-None member
        kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    return click.Option([flag, name], type=kind, default=None, help=help_text)


def config_params(config_cls, names: set[str] | None = None) -> list[click.Option]:
    """One option per option of a step's Config (those of its groups included), or of those in `names`."""
    return [option_for(f, hint) for f, hint in option_fields(config_cls) if names is None or f.name in names]


def given(values: dict) -> dict:
    """The options given on the command line (None and () are "not given"), lists as lists."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items() if v is not None and v != ()}


def _optional_of(hint):
    """X for `X | None`, else None."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    members = [t for t in typing.get_args(hint) if t is not type(None)]
    return members[0] if len(members) == 1 else None
