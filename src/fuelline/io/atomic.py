"""Atomic file writes: a reader never sees a half-written file under its final name.

Every file goes to a hidden temp name in the same directory, is fsynced, then renamed over the
final name, and the directory entry is fsynced too. A crash leaves at most a `.NAME.tmp-*` file,
which directory listings of fuelline ignore and the stage runner deletes on resume.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

TEMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """A binary file open under a temp name until `commit()` moves it to its final path."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.temp_path = self.path.with_name(
            f".{self.path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        )
        self.file: IO[bytes] = open(self.temp_path, "wb")

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp_path, self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        self.file.close()
        self.temp_path.unlink(missing_ok=True)


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Write a binary file atomically: committed on clean exit, removed on any exception."""
    target = AtomicFile(path)
    try:
        yield target.file
    except BaseException:
        target.abort()
        raise
    target.commit()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path) as f:
        f.write(data)


def remove_temp_files(directory: Path) -> int:
    """Delete temp files left by a crashed writer under `directory`; return how many."""
    removed = 0
    for p in directory.rglob(f".*{TEMP_MARK}*"):
        if p.is_file():
            p.unlink()
            removed += 1
    return removed
