"""What of an output directory a step wrote, by the names it declares: all that `--restart` (and
the replacing of another run's unfinished output) may delete.

A step declares its layout once, as patterns relative to its output directory (`part-*`,
`_rejects/part-*`, `train/tokens.bin`): a pattern is matched component by component (`*` never
crosses a `/`), and one that names a directory covers everything under it. The temp files of an
atomic write are every step's, wherever they lie. What matches no pattern is not the step's: a
user's `notes.txt` refuses the deletion before anything is deleted, while hidden entries (a
`.DS_Store`, a `.gitkeep`: what tools leave in a directory, never data) are kept and refuse nothing,
as they make no directory a step's output either (`WorkDir.is_empty`).
"""

from __future__ import annotations

import shutil
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Sequence

from fuelline.io.atomic import is_temp_name


class ForeignFiles(ValueError):
    """An output to be deleted holds a file its step did not write: the one-line refusal to delete
    `where`, naming `refusal` (what would delete it) and `first`, the first such file in it."""

    def __init__(self, refusal: str, where: str | Path, first: str):
        super().__init__(f"{refusal} would delete {where}, which also holds {first} that fuelline did not write; "
                         "move it away or choose another output")
        self.refusal, self.where, self.first = refusal, where, first

    def by(self, refusal: str) -> ForeignFiles:
        """The same refusal, naming what the user typed (a pipeline's `--restart-from STEP`)."""
        return ForeignFiles(refusal, self.where, self.first)


class Layout:
    """A step's declared patterns, asked of one relative name at a time."""

    def __init__(self, patterns: Sequence[str]):
        self.patterns = [PurePosixPath(p).parts for p in patterns]

    def written(self, parts: tuple[str, ...]) -> bool:
        """Whether the entry at `parts` (a file, or a directory with all under it) is the step's."""
        return is_temp_name(parts[-1]) or any(len(p) <= len(parts) and _matches(parts, p) for p in self.patterns)

    def above(self, parts: tuple[str, ...]) -> bool:
        """Whether the step writes something below the directory at `parts`."""
        return any(len(p) > len(parts) and _matches(parts, p) for p in self.patterns)


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return all(fnmatchcase(part, glob) for part, glob in zip(parts, pattern))


def is_foreign(name: str, patterns: Sequence[str]) -> bool:
    """Whether the file at relative `name` (a listing's, a URL's) is neither the step's nor hidden."""
    layout, parts = Layout(patterns), PurePosixPath(name).parts
    return not any(layout.written(parts[:k]) or parts[k - 1].startswith(".") for k in range(1, len(parts) + 1))


def sort_out(directory: Path, patterns: Sequence[str]) -> tuple[list[Path], list[Path], list[Path]]:
    """(the entries the step wrote, the non-hidden ones it did not, the directories holding both
    kinds), under `directory`; each of the first a whole file or directory."""
    layout = Layout(patterns)
    written: list[Path] = []
    foreign: list[Path] = []
    mixed: list[Path] = []

    def walk(folder: Path, above: tuple[str, ...]) -> None:
        for entry in sorted(folder.iterdir()):
            parts = (*above, entry.name)
            if layout.written(parts):
                written.append(entry)
            elif entry.is_dir() and not entry.is_symlink() and layout.above(parts):
                mixed.append(entry)
                walk(entry, parts)
            elif not entry.name.startswith("."):
                foreign.append(entry)

    if directory.is_dir():
        walk(directory, ())
    return written, foreign, mixed


def delete_written(directory: Path, patterns: Sequence[str], refusal: str | None) -> None:
    """Delete what the step wrote in `directory` (the directory too, when nothing else is left).
    `refusal`: what deletes it ("--restart"), named in the `ForeignFiles` raised before anything is
    deleted when `directory` also holds a file the step did not write; None: keep such a file
    (a failed run removing its own output)."""
    written, foreign, mixed = sort_out(directory, patterns)
    if not written:
        return
    if foreign and refusal is not None:
        raise ForeignFiles(refusal, directory, foreign[0].relative_to(directory).as_posix())
    for entry in written:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for folder in [*reversed(mixed), directory]:  # deepest first: a folder emptied here goes too
        if not any(folder.iterdir()):
            folder.rmdir()
