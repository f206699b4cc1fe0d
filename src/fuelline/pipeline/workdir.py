"""A step's output: the one resume contract every step keeps (record stages, tokenizer, pack,
regenerate, cache build, cache export, vocab-map, report). Its markers (the lock beside the output,
`_plan.json` written first, `stats.json` last) and the five states a run can find under the lock
are in docs/design.md, "Resume contract"; docs/io.md says it for users.

An output that holds something but no plan marker is no step's and is never touched, unless it
holds a marker of an earlier fuelline (`EARLIER_MARKERS`): its work is neither resumed nor
reused, and the refusal names the marker and `--restart`. The identity of an output made by an
earlier version is read in today's terms (`_completed`), so that adding, renaming or dropping an
option does not orphan it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from fuelline.io.lock import exclusive_output
from fuelline.io.overlap import check_outputs
from fuelline.io.step_files import delete_written
from fuelline.io.stage_layout import PLAN_FILE, STATS_FILE
from fuelline.pipeline.stats import StepStats, read_stats, resumed, write_json

RESTART = "--restart"  # what deletes a step's output in `WorkDir.discard`'s refusals, unless told otherwise
RESTART_HINT = f"pass {RESTART} to delete it and run again, or choose another output directory"
# The plan markers of outputs that an earlier fuelline left unfinished: pack's shards under `_work/`,
# a cache build's `.build/`, the identity of a step done in one go (tokenizer, export, vocab-map).
EARLIER_MARKERS = ("_work/plan.json", ".build/plan.json", "_started.json")


_CHECKING = contextvars.ContextVar("fuelline_checking_outputs", default=False)


class Checked(BaseException):
    """Raised, under `checking()`, where a step's run would go on past reading its output: `writes`
    False when the output is finished with this identity, True when the run would write or delete.
    A BaseException, so that no step's own `except Exception` takes it for a failure."""

    def __init__(self, writes: bool):
        super().__init__("writes" if writes else "finished")
        self.writes = writes


@contextlib.contextmanager
def checking():
    """Run a step only as far as its output's state: refused (StepOutputMismatch), finished or would
    write (`Checked`). A pipeline checks every step this way before it writes anything, so that a
    refusal of its fourth step leaves the first three as they were."""
    token = _CHECKING.set(True)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def _would_write() -> None:
    if _CHECKING.get():
        raise Checked(writes=True)


class StepOutputMismatch(RuntimeError):
    """The output holds the result of different options or inputs, or is no step's output."""

    def in_pipeline(self, step: str) -> StepOutputMismatch:
        """The refusal as a pipeline says it: which option of `fuelline run` redoes this step alone."""
        return StepOutputMismatch(str(self).replace(RESTART_HINT, (
            f"pass --restart-from {step} to redo this step and the ones after it, keeping those before "
            "(--restart redoes every step)")))


def mismatch(where: str | os.PathLike, existing: dict[str, Any], identity: dict[str, Any]) -> StepOutputMismatch:
    """The refusal for an output made from another identity, naming what differs (`config.vocab_size`;
    fingerprints shortened)."""
    differences = _differences(existing, identity)
    named = [f"{k} ({str(old)[:12]}… there, {str(new)[:12]}… now)" if k.endswith("fingerprint") else k
             for k, old, new in differences]
    return StepOutputMismatch(f"{where} holds the output of a run with different {', '.join(named)}; {RESTART_HINT}")


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
    """The output of one step run with one identity: a directory, of which the step writes what
    `writes` names (its layout, `fuelline.io.step_files`; the markers are added here), or (`beside`
    given) the file `path` with the files beside it that belong to it (`OUT.jsonl.errors`).

    Made before anything is locked, created or deleted, it refuses an output that overlaps what the
    step reads (`reads`: its inputs as given, files, directories or globs, and what else it reads)
    or the step's other outputs (`also`), by the one rule of `fuelline.io.overlap`."""

    def __init__(self, path: str | os.PathLike, identity: dict[str, Any], name: str | None = None,
                 defaults: dict[str, Any] | None = None, renamed: dict[str, str] | None = None,
                 beside: Sequence[Path] | None = None, *, reads: Sequence[str | os.PathLike],
                 writes: Sequence[str] = (), also: Sequence[str | os.PathLike] = ()):
        self.path = Path(path)
        self.identity = identity
        self.defaults = defaults or {}  # identity["config"] values an older output's identity may lack
        self.renamed = renamed or {}  # {earlier name: name now} of identity["config"] keys
        self.name = name or os.fspath(self.path)  # what messages call it: a URL whose staging directory is `path`
        self.started = time.perf_counter()
        self.is_file = beside is not None
        if self.is_file:
            self.plan_path = self.path.with_name(f".{self.path.name}.plan.json")
            self.stats_path = self.path.with_name(f"{self.path.stem}.{STATS_FILE}")
            self.members = [self.path, *beside, self.stats_path, self.plan_path]
        else:
            self.plan_path, self.stats_path = self.path / PLAN_FILE, self.path / STATS_FILE
        # an earlier fuelline's marker is fuelline's; the rest of an earlier layout is its step's own
        self.writes = [PLAN_FILE, STATS_FILE, *EARLIER_MARKERS, *writes]
        check_outputs([self.name, *(self.members[1:] if self.is_file else ()), *also], reads)
        self.resumed = False  # set by `begin`: the plan found was this run's

    def lock(self):
        """Held from before the output is read or deleted to the end of the run; beside the output."""
        return exclusive_output(self.path, name=self.name)

    def discard(self, by: str | None = RESTART) -> None:
        """Delete what the step wrote of the output (`--restart`, or another identity's unfinished
        work): refused, before anything is deleted, when it also holds a file the step does not write
        (`by` names what would delete it; None: such a file is kept, a failed run's own output goes);
        a failure to delete says so."""
        _would_write()
        try:
            if not self.is_file:
                delete_written(self.path, self.writes, by)
                return
            for member in self.members:
                member.unlink(missing_ok=True)
        except OSError as e:
            raise RuntimeError(f"could not delete {e.filename or self.path} ({e.strerror or e}) to start "
                               f"{self.name} over; nothing was run") from None

    def restart(self) -> None:
        """`--restart`: delete the output when it is a step's (a plan marker, an earlier fuelline's
        included, or stats.json); one that is not is refused, never deleted."""
        if not (self.plan_path.exists() or self.stats_path.exists() or self.earlier_marker() or self.is_empty()):
            raise not_a_step_output(self.name)
        self.discard()

    def earlier_marker(self) -> str | None:
        """The marker of an earlier fuelline in this directory output, if it holds one."""
        return next((m for m in EARLIER_MARKERS if not self.is_file and (self.path / m).exists()), None)

    def is_empty(self) -> bool:
        """Nothing here but hidden files (a `.DS_Store`; a cache build's `.build/`)."""
        if self.is_file:
            return not any(m.exists() for m in self.members)
        return not self.path.exists() or all(p.name.startswith(".") for p in self.path.iterdir())

    def finished(self) -> dict[str, Any] | None:
        """The stats of a finished run with this identity, marked resumed; None when the step has
        not finished here; refused when another identity finished here."""
        stats = read_stats(self.stats_path)
        if stats is None:
            return None
        existing = self._completed(stats.get("identity") or {})
        if existing != self.identity:
            raise mismatch(self.name, existing, self.identity)
        if _CHECKING.get():
            raise Checked(writes=False)
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

    def read_plan(self) -> dict[str, Any] | None:
        """The plan marker, or None; a plan written before the identity had a key of its own (a
        record stage's) is its own identity."""
        plan = read_stats(self.plan_path, "plan")
        if plan is not None and "identity" not in plan:
            plan = {"identity": {k: v for k, v in plan.items() if k != "shards"}, **plan}
        return plan

    def begin(self, anything_finished: Callable[[], bool], plan: Callable[[], dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        """Make the output this run's, once `finished` said it is not (see the module doc): the plan
        found when it is this identity's (`resumed` True), else a new one written, with `plan()`'s
        keys, after another identity's unfinished output is discarded. `anything_finished`: whether
        the existing output holds finished work (asked only of another identity's)."""
        existing = self.read_plan()
        if existing is not None:
            if (found := self._completed(existing["identity"])) == self.identity:
                _would_write()  # the run goes on with the work left
                self.resumed = True
                return existing
            if anything_finished():
                raise mismatch(self.name, found, self.identity)
            self.discard("replacing the unfinished output of other options")
        elif marker := self.earlier_marker():  # its plan is not today's: resuming it could mix two formats
            raise StepOutputMismatch(f"{self.name} was left unfinished by an earlier fuelline version ({marker} "
                                     f"there, no {PLAN_FILE}) and cannot be resumed; {RESTART_HINT}")
        elif not self.is_empty():
            raise not_a_step_output(self.name)
        _would_write()
        new = {"identity": self.identity, **(plan() if plan is not None else {})}
        write_json(self.plan_path, new)
        self.resumed = False
        return new

    def finish(self, stats: StepStats) -> dict[str, Any]:
        """Write stats.json, the run's last write, with the identity and the wall time; return it."""
        _would_write()
        stats.identity = self.identity
        stats.wall_seconds = time.perf_counter() - self.started
        return stats.write(self.stats_path.parent, self.stats_path.name)

    def run_once(self, work: Callable[[], StepStats], *, restart: bool, derived: bool = False) -> dict[str, Any]:
        """For a step done in one go (nothing to resume inside it): its stats when it finished here
        with this identity, else `work()` run into the output and its stats written. `derived`: an
        output fuelline names and makes from a run's other outputs (RUN/report), rewritten when they
        changed, whatever it holds, never refused."""
        with self.lock():
            if restart:
                self.restart()
            try:
                if (done := self.finished()) is not None:
                    return done
            except StepOutputMismatch:
                if not derived:
                    raise
            if derived:
                self.discard("rewriting it")
            fresh = self.is_empty()
            self.begin(anything_finished=lambda: False)
            try:
                stats = work()
            except BaseException:
                if fresh:  # nothing of a failed run is worth keeping, and nothing was there before it
                    self.discard(None)
                raise
            return self.finish(stats)
