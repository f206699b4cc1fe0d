"""One run per output: an exclusive lock held for a run's whole life.

Two runs writing one directory break each other (the second removes the first one's temp files
as leftovers). A run therefore holds an `flock` on `.NAME.lock` beside its output NAME (a
directory or a file) from before it touches the output until it ends; the kernel releases it
when the holder dies, even by SIGKILL, so a crashed run never blocks the next one. The file
itself stays (removing it would race with a run opening it) and holds the holder's pid and
start time, for the message a second run gets. It sits beside the output, not inside, so that
`--restart` can delete the output without deleting the lock, and readers of the output never
see it (a hidden name). Children do not inherit the lock: Python opens files close-on-exec.
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
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "pid unknown"
            raise OutputBusy(f"{name or output} is being written by another fuelline run ({holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {datetime.now().isoformat(sep=' ', timespec='seconds')}\n"
                  .encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
