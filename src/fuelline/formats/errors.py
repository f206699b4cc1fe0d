"""The one error every on-disk format raises: a file that is missing, unfinished, damaged or
inconsistent. Each format names its own subclass (`TokenFormatError`, `CacheFormatError`) so a
user can catch one format's problems, or all of them as `FormatError`; both are ValueErrors,
which the CLI prints as a message instead of a traceback."""

from __future__ import annotations

import os


class FormatError(ValueError):
    """A format's file is not what the format promises; the message starts with its path."""

    def __init__(self, path: str | os.PathLike, what: str):
        super().__init__(f"{os.fspath(path)}: {what}")
