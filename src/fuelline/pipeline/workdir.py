"""A step's output directory: the one resume contract every step keeps.

A step is recognized by its identity: the options that decide its bytes, its inputs, and the
fingerprints of what it reads (a tokenizer, a model). The identity goes into the directory when
work begins (a plan) and into stats.json when it ends. Running the step again then
- finds a finished output with the same identity and returns its stats, marked resumed;
- resumes an unfinished one with the same identity, keeping what was finished;
- replaces an unfinished one with another identity while nothing of it has finished (a run that
  stopped on bad input has nothing worth keeping);
- refuses anything else, naming what differs: `--restart` discards the directory, or the user
  chooses another one. A directory that is not a step's output is never touched.
An output made by an earlier version is read in today's terms: an option added since stands for
its default (`defaults`), one renamed since is read under its new name (`renamed`), and one that
is no longer part of the identity (removed, or moved to the run options as pack's shard_size) is
left out; so an output made before such a change is still found again when the options it was
made with are today's.
The directory's lock (`fuelline.io.lock`) is held while the step runs, so a second run into it
is refused at once.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.lock import exclusive_output
from fuelline.io.stage_layout import STATS_FILE
from fuelline.pipeline.stats import StepStats, read_stats, resumed

STARTED_FILE = "_started.json"  # the identity of a step that keeps no plan of its own (`run_once`)


class StepOutputMismatch(RuntimeError):
    """The output directory holds the result of different options or inputs, or is no step's output."""


def mismatch(where: str | os.PathLike, existing: dict[str, Any], identity: dict[str, Any]) -> StepOutputMismatch:
    """The refusal for an output made from another identity, naming what differs (`config.vocab_size`;
    fingerprints shortened)."""
    named = [f"{k} ({str(old)[:12]}… there, {str(new)[:12]}… now)" if k.endswith("fingerprint") else k
             for k, old, new in _differences(existing, identity)]
    return StepOutputMismatch(f"{where} holds the output of a run with different {', '.join(named)}; "
                              "pass --restart to delete it and run again, or choose another output directory")


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    found = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found


def not_a_step_output(where: str | os.PathLike) -> StepOutputMismatch:
    return StepOutputMismatch(f"{where} exists, is not empty and is not a fuelline stage output; "
                              "choose another output directory")


class WorkDir:
    """The output directory of one step run with one identity."""

    def __init__(self, path: str | os.PathLike, identity: dict[str, Any], name: str | None = None,
                 defaults: dict[str, Any] | None = None, renamed: dict[str, str] | None = None):
        self.path = Path(path)
        self.identity = identity
        self.defaults = defaults or {}  # identity["config"] values an older output's identity may lack
        self.renamed = renamed or {}  # {earlier name: name now} of identity["config"] keys
        self.name = name or os.fspath(self.path)  # what messages call it: a URL whose staging directory is `path`
        self.started = time.perf_counter()

    def lock(self):
        return exclusive_output(self.path)

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def is_empty(self) -> bool:
        """Nothing here but hidden files (a `.DS_Store`; a cache build keeps its work in `.build/`)."""
        return not self.path.exists() or all(p.name.startswith(".") for p in self.path.iterdir())

    def finished(self, stats_file: str = STATS_FILE) -> dict[str, Any] | None:
        """The stats of a finished run with this identity, marked resumed; None when the step has
        not finished here; refused when another identity finished here."""
        stats = read_stats(self.path / stats_file)
        if stats is None:
            return None
        existing = self._completed(stats.get("identity") or {})
        if existing != self.identity:
            raise mismatch(self.name, existing, self.identity)
        return resumed(stats, self.started)

    def _completed(self, existing: dict[str, Any]) -> dict[str, Any]:
        """`existing` in today's terms: renamed options under their names now, the defaults of the
        options it predates, without the options no longer in the identity."""
        config, now = existing.get("config"), self.identity.get("config")
        if not isinstance(config, dict) or not isinstance(now, dict):
            return existing
        config = {self.renamed.get(k, k): v for k, v in config.items()}
        config = {**{k: v for k, v in self.defaults.items() if k not in config}, **config}
        return {**existing, "config": {k: v for k, v in config.items() if k in now}}

    def resumes(self, existing: dict[str, Any], *, anything_finished: bool) -> bool:
        """Whether to resume the unfinished work recorded here with identity `existing`: True when it is
        this run's; False when it is another's of which nothing finished (the caller discards it);
        refused when it is another's with finished parts."""
        existing = self._completed(existing)
        if existing == self.identity:
            return True
        if not anything_finished:
            return False
        raise mismatch(self.name, existing, self.identity)

    def run_once(self, work: Callable[[], StepStats], *, restart: bool) -> dict[str, Any]:
        """For a step that is done in one go (nothing to resume inside it): its stats when it
        finished here with this identity, else `work()` run into an empty directory and its stats
        written, identity included."""
        with self.lock():
            if restart:
                self.discard()
            if (done := self.finished()) is not None:
                return done
            started = read_stats(self.path / STARTED_FILE)
            if started is None and not self.is_empty():
                raise not_a_step_output(self.path)
            if started is not None and not self.resumes(started, anything_finished=False):
                self.discard()
            self.path.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.path / STARTED_FILE, orjson.dumps(self.identity, option=orjson.OPT_SORT_KEYS))
            stats = work()
            stats.identity = self.identity
            stats.wall_seconds = time.perf_counter() - self.started
            return stats.write(self.path)

