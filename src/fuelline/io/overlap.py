"""The rule between what a command reads and what it writes, checked before a run locks, creates or
deletes anything (`fuelline.pipeline.workdir.WorkDir` applies it to every step).

An output is never an input, never inside one, and never holds one: a run would read back what it
wrote, and `--restart`, which deletes the output, would delete the input with it. No two outputs of
one command are one path, or one inside the other: the second written would replace the first.
Paths are compared as the places they name: relative and absolute spellings, symlinks and `..`
alike; a URL by its canonical spelling.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

from fuelline.io.remote import canonical, is_url


class PathOverlap(ValueError):
    """An output that is, holds or lies inside an input or another output of the same command."""


def check_outputs(outputs: Sequence[str | os.PathLike], reads: Iterable[str | os.PathLike]) -> None:
    """Refuse, naming both paths, an output that overlaps one of `reads` (files, directories, globs)
    or another of `outputs`."""
    placed = [(os.fspath(o), _place(o)) for o in outputs]
    for i, (output, place) in enumerate(placed):
        for other, other_place in placed[:i]:
            if relation := _relation(place, other_place):
                raise PathOverlap(f"output {output} {relation} the output {other}: two outputs of one command "
                                  "must not overlap; give each its own place")
    for source in reads:
        for read in _read_paths(os.fspath(source)):
            read_place = _place(read)
            for output, place in placed:
                if relation := _relation(place, read_place):
                    raise PathOverlap(f"output {output} {relation} the input {read}; write it outside the inputs "
                                      "(a run would read what it writes, and --restart would delete its input)")


def _place(path: str | os.PathLike) -> PurePosixPath | Path:
    text = os.fspath(path)
    if is_url(text):
        return PurePosixPath(canonical(text).rstrip("/"))
    return Path(os.path.realpath(os.path.expanduser(text)))


def _read_paths(source: str) -> list[str]:
    """What a source names: itself, or a glob's matches (files and directories) as they are now."""
    if not is_url(source) and glob.has_magic(source):
        return sorted(glob.glob(os.path.expanduser(source), recursive=True))
    return [source]


def _relation(output, read) -> str | None:
    """How the place `output` stands to the place `read`, in words, when they overlap."""
    if output == read:
        return "is"
    if output.is_relative_to(read):
        return "lies inside"
    if read.is_relative_to(output):
        return "contains"
    return None
