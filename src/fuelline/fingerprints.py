"""Fingerprints: what a resume check or a manifest compares to know an input is the one it was made from.

Kept apart from the modules that make the inputs (training a tokenizer imports `tokenizers`), so
that a step which only checks an identity imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tokenizer_fingerprint(directory: str | os.PathLike) -> str:
    """The sha256 of the directory's tokenizer.json: ids depend on nothing else of it."""
    return hashlib.sha256((Path(directory) / "tokenizer.json").read_bytes()).hexdigest()
