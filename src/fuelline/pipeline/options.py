"""A step's options declared once, as the fields of its Config dataclass.

The CLI options, the pipeline-file keys and the identity a finished step is recognized by are all
read from here (docs/design.md, "The step protocol"). A group (`group()`) takes flat names
(`concurrency`, not `client.concurrency`) or its prefix (`serve_model` is `fuelline serve`'s
`model`). A Config derives from `Options`, so that its choices and ranges are checked where it is
built, from the CLI, a pipeline file or Python alike: declared once, checked once.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import numbers
import os
import typing
from collections.abc import Callable
from typing import Any

NO_DEFAULT = dataclasses.MISSING
INT64_LIMIT = 1 << 63


def option(default: Any = NO_DEFAULT, help: str = "", *, factory: Callable[[], Any] | None = None,
           choices: list[str] | tuple[str, ...] | None = None, identity: bool = True,
           step_ref: bool = False, flag: str | None = None, short: str | None = None, comma_list: bool = False,
           existing_file: bool = False, size: bool = False, user: bool = True,
           min: float | None = None, max: float | None = None, required: bool = False,
           replaces: tuple[str, str] | None = None, was: str | None = None,
           reads: bool | Callable[[str], str] = False) -> Any:
    """A Config field. `step_ref`: a directory that a pipeline file may name as @STEP (an earlier
    step's output, the default there); the CLI requires it and checks that it exists. `flag`: the
    CLI flag when it is not the field's name (`--server` for `servers`), `short` its one-letter
    alias (`-w`); `comma_list`: a list given on the CLI as one comma-separated value
    (`--finish-reasons stop,length`); `existing_file`: the CLI checks that the file exists;
    `size`: a byte count, that the CLI also takes as 64GiB.
    `min`/`max`: the smallest and largest value that makes sense (inclusive), refused otherwise on
    the CLI and in pipeline files alike (`bound_problem`); `required`: the step cannot run without
    it (the CLI marks it so). `replaces`: (old name, how to write it now), an earlier spelling of
    this option that is refused with that hint. `was`: the earlier name of this very option (same
    values): refused with the new name, and read as this option in the identity of an output made
    before the rename. `user=False`: a tuning knob for tests and benchmarks, neither a CLI option
    nor a pipeline key. `reads`: its value (each, for a list) may name a file the step reads (a
    callable: the file it names, `NAME=FILE:FIELD`'s FILE), which its outputs must keep away from
    as from its inputs (`read_paths`)."""
    metadata = {"help": help, "identity": identity, "step_ref": step_ref, "flag": flag, "short": short,
                "comma_list": comma_list, "existing_file": existing_file, "size": size, "user": user, "min": min,
                "max": max, "required": required, "replaces": replaces, "was": was, "reads": reads}
    if choices:
        metadata["choices"] = list(choices)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def group(cls: type, prefix: str = "") -> Any:
    """A field holding another Config's options (`cls`), named `PREFIX + name` among the step's own."""
    return dataclasses.field(default_factory=cls, metadata={"prefix": prefix})


def bound_problem(field: dataclasses.Field, value: Any) -> str | None:
    """Why `value` is outside the range `field` declares (`min`, `max`), or None; None and lists pass."""
    low, high = field.metadata.get("min"), field.metadata.get("max")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value:  # NaN compares false with every bound
        return "must be a number, not nan"
    if isinstance(value, int) and not -INT64_LIMIT <= value < INT64_LIMIT:  # stats.json, numpy, Rust: 64 bits
        return f"is out of range: {value} does not fit in 64 bits"
    return _range_problem(value, low, high)


def _range_problem(value: float, low: float | None, high: float | None) -> str | None:
    if (low is not None and value < low) or (high is not None and value > high):
        return f"must be {_range_text(low, high)}, found {value}"
    return None


def check_number(name: str, value: Any, *, min: float | None = None, max: float | None = None, whole: bool = True,
                 optional: bool = False) -> None:
    """A library entry point's numeric argument, refused at the call with a ValueError naming `name`
    and `value` unless it is a (`whole`) finite number in [min, max], or None where `optional`:
    a batch size of 0 or 2.5 caught here, not as a ZeroDivisionError or a torch error steps later."""
    if value is None and optional:
        return
    if not (_is_whole(value) if whole else _is_number(value) and math.isfinite(value)):
        raise ValueError(f"{name} must be {'a whole' if whole else 'a finite'} number, not {value!r}")
    if (problem := _range_problem(value, min, max)) is not None:
        raise ValueError(f"{name} {problem}")


def check_declared(cls: type, name: str, value: Any, *, optional: bool = False) -> None:
    """`check_number` with the range Config `cls` declares for its option `name`: a library function
    taking the same quantity as an option keeps the option's bound, stated once."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    check_number(name, value, min=field.metadata.get("min"), max=field.metadata.get("max"),
                 whole=name in _whole_fields(cls), optional=optional)


def _is_whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@functools.cache
def _whole_fields(cls: type) -> frozenset[str]:
    """The options of Config `cls` typed as whole numbers (int, int | None)."""
    hints = typing.get_type_hints(cls)
    return frozenset(f.name for f in dataclasses.fields(cls) if hints.get(f.name) in (int, int | None, typing.Optional[int]))


def option_problem(field: dataclasses.Field, value: Any) -> str | None:
    """Why `value` is not one of `field`'s declared choices or is outside its range, or None."""
    choices = field.metadata.get("choices")
    if choices and isinstance(value, str) and value not in choices:
        return f"must be one of {', '.join(choices)}, not {value!r}"
    return bound_problem(field, value)


class Options:
    """Base of every Config of options: its choices and ranges are checked when it is built, from
    the CLI, a pipeline file or Python alike. A Config with checks across options (`bands` and
    `rows` together) adds a `__post_init__` that calls this one first."""

    def __post_init__(self):
        whole = _whole_fields(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in whole and value is not None and not _is_whole(value):  # 2.5 or True for a count
                raise ValueError(f"{f.name} must be a whole number, not {value!r}")
            if (problem := option_problem(f, value)) is not None:
                raise ValueError(f"{f.name} {problem}")


def bounds_text(field: dataclasses.Field) -> str:
    """The declared range in words ("at least 1", "between 0 and 1"), or ""."""
    return _range_text(field.metadata.get("min"), field.metadata.get("max"))


def _range_text(low: float | None, high: float | None) -> str:
    low, high = _number(low), _number(high)
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}" if high is not None else ""


def _number(value: float | None) -> str | None:
    """1, 2,147,483,647, 0.1: a bound as a user reads it."""
    if value is None:
        return None
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def flag_of(field: dataclasses.Field) -> str:
    """The CLI flag of an option: its declared `flag`, else its name (`--shard-size`)."""
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def replaced_names(cls: type) -> dict[str, tuple[str, str]]:
    """{old name: (its option now, how to write it)} of the earlier spellings `cls`'s options replace."""
    found = {}
    for f, _ in option_fields(cls):
        if f.metadata.get("replaces"):
            found[f.metadata["replaces"][0]] = (f.name, f.metadata["replaces"][1])
        if f.metadata.get("was"):
            found[f.metadata["was"]] = (f.name, f"the same option under its new name: {f.name} = … ({flag_of(f)} …)")
    return found


def parse_size(text: str) -> int:
    """`64GiB`, `500MB`, `1e9`, `2T`: a byte count (binary units for KiB…TiB and K…T, decimal for KB…TB)."""
    units = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
             "GIB": 1 << 30, "T": 1 << 40, "TIB": 1 << 40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    raw = text.strip().upper().replace("_", "").replace(",", "")
    number = raw.rstrip("KMGTIB")
    try:
        value = float(number) * units[raw[len(number):]]
    except (KeyError, ValueError):
        raise ValueError(f"not a size: {text!r} (examples: 64GiB, 500MB, 1e9)") from None
    if value <= 0:
        raise ValueError(f"a size must be positive, not {text!r}")
    return int(value)


def size_text(n: int) -> str:
    """`n` bytes as parse_size reads them back, in the largest binary unit that divides it: 64GiB."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def default_of(field: dataclasses.Field) -> Any:
    """The default of `field` (its factory's value for a list), or NO_DEFAULT."""
    if field.default_factory is not NO_DEFAULT:
        return field.default_factory()
    return field.default


def _groups(cls: type) -> dict[str, tuple[type, str]]:
    """The fields of `cls` that are groups of options: the group's class and its options' prefix."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata.get("prefix", "")) for f in dataclasses.fields(cls)
            if dataclasses.is_dataclass(hints[f.name])}


def _own_first(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls`, those it declares itself before those of a base it shares options with
    (`ChatEncoding`): `--help` lists first what the command is about."""
    depth = {}
    for level, klass in enumerate(cls.__mro__):
        for name in vars(klass).get("__annotations__", {}):
            depth.setdefault(name, level)
    return sorted(dataclasses.fields(cls), key=lambda f: depth.get(f.name, 0))


def option_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """(field, type hint) of every user option of Config class `cls`, those of its groups included
    (a prefixed group's fields under their prefixed names)."""
    hints, groups = typing.get_type_hints(cls), _groups(cls)
    found = []
    for f in _own_first(cls):
        if f.name in groups:
            group_cls, prefix = groups[f.name]
            for inner, hint in option_fields(group_cls):
                named = copy.copy(inner)
                named.name = prefix + inner.name
                found.append((named, hint))
        elif f.metadata.get("user", True):
            found.append((f, hints[f.name]))
    return found


def build_config(cls: type, values: dict[str, Any]):
    """`cls` from flat option values: a group's options go to the group, the others keep their defaults."""
    values = dict(values)
    for name, (group_cls, prefix) in _groups(cls).items():
        own = {prefix + f.name for f, _ in option_fields(group_cls)}
        values[name] = build_config(group_cls, {k[len(prefix):]: values.pop(k) for k in list(values) if k in own})
    return cls(**values)


def identity_values(config) -> dict[str, Any]:
    """The options of `config` that decide what the step writes, as plain values."""
    plain, values = dataclasses.asdict(config), {}
    for f in dataclasses.fields(config):
        if dataclasses.is_dataclass(getattr(config, f.name)):
            prefix = f.metadata.get("prefix", "")
            values.update({prefix + k: v for k, v in identity_values(getattr(config, f.name)).items()})
        elif f.metadata.get("identity", True):
            values[f.name] = plain[f.name]
    return values


def read_paths(config) -> list[str]:
    """The paths `config`'s `reads` options name beside the inputs, those of its groups included; a
    value that names no existing path (a template's or a layout's name, `@STEP`) is none."""
    found = []
    for f in dataclasses.fields(config):
        value, reads = getattr(config, f.name), f.metadata.get("reads")
        if dataclasses.is_dataclass(value):
            found += read_paths(value)
        elif reads and value:
            for one in value if isinstance(value, (list, tuple)) else [value]:
                path = reads(one) if callable(reads) else one
                if isinstance(path, str) and os.path.lexists(os.path.expanduser(path)):
                    found.append(path)
    return found


def identity_history(cls: type) -> dict[str, dict[str, Any]]:
    """`WorkDir(…, **identity_history(Config))`: `defaults`, what an option added since an output was made
    stands for there, and `renamed`, {earlier name: name now} of the options renamed since (`was`)."""
    fields = option_fields(cls)
    return {"defaults": {f.name: default_of(f) for f, _ in fields if f.metadata.get("identity", True)},
            "renamed": {f.metadata["was"]: f.name for f, _ in fields if f.metadata.get("was")}}
