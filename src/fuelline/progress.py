"""Progress bars for terminals and for log files.

On a terminal a bar redraws itself in place with carriage returns. Written to a file (`cmd 2>
run.log`, nohup, a batch scheduler's log) the same bar would become one megabyte-long line of
`\\r`-separated redraws, so there it prints a plain line instead, at most every LOG_INTERVAL
seconds and once at the end: a log of a 10-hour run then holds ~1,200 readable lines.
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import IO, Any, Iterator

from tqdm import tqdm

LOG_INTERVAL = 30.0  # seconds between progress lines in a log file
_CURSOR_MOVES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # tqdm's moves between bars at several positions


class _LineWriter:
    """A file that turns tqdm's in-place redraws into one line per redraw."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> int:
        for redraw in _CURSOR_MOVES.sub("", text).replace("\n", "\r").split("\r"):
            if redraw.strip():
                self.stream.write(redraw.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(*, disable: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr: redrawn in place on a terminal, as log lines anywhere else."""
    if disable or sys.stderr.isatty():
        return tqdm(disable=disable, **kwargs)
    kwargs.update(file=_LineWriter(sys.stderr), mininterval=LOG_INTERVAL, maxinterval=LOG_INTERVAL,
                  leave=True, position=None, dynamic_ncols=False, ncols=100)
    return tqdm(**kwargs)


@contextmanager
def transformers_bars(progress: bool) -> Iterator[None]:
    """transformers' own bars ("Loading weights") kept only when progress is wanted, on a terminal."""
    from transformers.utils import logging

    if progress and sys.stderr.isatty():
        yield
        return
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
