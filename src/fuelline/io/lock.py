"""One run per output: an exclusive lock held for a run's whole life.

Two runs writing one directory break each other (the second removes the first one's temp files
as leftovers). A run therefore holds an `flock` on `.NAME.lock` beside its output NAME (a
directory or a file) from before it touches the output until it ends; the kernel releases it
when the holder dies, even by SIGKILL, so a crashed run never blocks the next one. The file
holds the holder's pid and start time, for the message a second run gets. A run that ends
removes it while it still holds the lock; a run that opened the file before sees that the path
is gone or another inode and locks the path's new file, so two runs never both hold "the" lock.
Beside the output, not inside, so that `--restart` can delete the output without deleting the
lock, and readers of the output never see it. Children do not inherit it (close-on-exec).
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator


class OutputBusy(RuntimeError):
    """Another run holds the output's lock."""


def lock_path(output: str | os.PathLike) -> Path:
    output = Path(output).absolute()
    return output.parent / f".{output.name}.lock"


@contextmanager
def exclusive_output(output: str | os.PathLike, name: str | None = None) -> Iterator[None]:
    """Hold the lock of `output` for the duration of the block; `OutputBusy` if another run holds it.

    `name`: what the message calls the output, when it is not `output` itself (a URL whose local
    staging directory is locked)."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, name or output)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {datetime.now().isoformat(sep=' ', timespec='seconds')}\n"
                  .encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # still locked: a run that opened it sees it gone and starts again
        os.close(fd)  # releases the lock


def _acquire(path: Path, name) -> int:
    """An open descriptor of the lock file now at `path`, locked; OutputBusy if another run holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "pid unknown"
            os.close(fd)
            raise OutputBusy(f"{name} is being written by another fuelline run ({holder})") from None
        if _is_at(fd, path):
            return fd
        os.close(fd)  # the run that held it removed it on its way out: lock the path's new file


def _is_at(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)
