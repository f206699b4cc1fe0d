"""stats.json: what every step says of its run, in one shape, so the funnel report reads any step alike.

The funnel's numbers are the same for every step: records in and out, drops by reason (with the
first dropped record of each reason), counters, and seconds. A step adds what only it knows
(`details`: pack's splits, the cache's tokens, regenerate's servers), and the identity it is
recognized by when a pipeline runs again (`fuelline.pipeline.workdir`). The file is written last
and atomically: a step with a stats.json is finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.stage_layout import STATS_FILE


@dataclass
class StepStats:
    stage: str  # the step's kind (`Step.name`): the report groups and names steps by it
    records_in: int
    records_out: int
    dropped: dict[str, int] = field(default_factory=dict)
    drop_examples: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    wall_seconds: float | None = None
    identity: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)  # the step's own numbers, top-level keys of the file

    def to_json(self) -> dict[str, Any]:
        funnel = {"stage": self.stage, "records_in": self.records_in, "records_out": self.records_out,
                  "dropped": dict(sorted(self.dropped.items())), "drop_examples": dict(sorted(self.drop_examples.items())),
                  "counters": dict(sorted(self.counters.items()))}
        clash = sorted(set(funnel) & set(self.details))
        if clash:
            raise ValueError(f"step {self.stage!r}: details may not redefine {', '.join(clash)}")
        stats = {**funnel, **self.details}
        if self.identity is not None:
            stats["identity"] = self.identity
        if self.wall_seconds is not None:
            stats["wall_seconds"] = round(self.wall_seconds, 3)
        return stats

    def write(self, directory: Path, name: str = STATS_FILE) -> dict[str, Any]:
        """Write DIRECTORY/stats.json (the step's last write); return what was written."""
        stats = self.to_json()
        write_json(directory / name, stats)
        return stats


def dropped_text(dropped: dict[str, int]) -> str:
    """A step's drops as the CLI prints them: "reason 1,234, other 5", or "none"."""
    return ", ".join(f"{reason} {n:,}" for reason, n in dropped.items()) or "none"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A step's bookkeeping file (stats.json, a plan or shard marker), atomically, keys sorted."""
    write_bytes_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def read_stats(path: Path, what: str = "stats.json") -> dict[str, Any] | None:
    """The stats of a finished step (or another bookkeeping file, `what`), or None when there is none."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: not a {what} fuelline wrote ({e}); pass --restart to redo the step") from None


def resumed(stats: dict[str, Any], started: float) -> dict[str, Any]:
    """The stats of a finished step found again: marked resumed, with this run's time, not the original's."""
    return {**stats, "resumed": True, "original_wall_seconds": stats.get("wall_seconds"),
            "wall_seconds": round(time.perf_counter() - started, 3)}


def dominant_drop(stats: dict[str, Any], share: float = 0.5) -> str | None:
    """The commonest drop reason when it took at least `share` of the records, with its first
    record's reason in words; else None.

    The reason ("keys text match no chat schema") is otherwise only in the rejects file, and a
    run that drops most of its input is usually a mistake in the input or the options."""
    total = stats.get("records_in", 0)
    if not total or not stats.get("dropped"):
        return None
    reason, count = max(stats["dropped"].items(), key=lambda item: item[1])
    if count < share * total:
        return None
    example = stats.get("drop_examples", {}).get(reason)
    return f"{count:,} of {total:,} records ({count / total:.0%}) dropped as {reason}" + (
        f"; the first: {example}" if example else "")


def require_kept(stats: dict[str, Any]) -> None:
    """A step that kept nothing of a non-empty input failed (its output trains nothing): a ValueError
    saying why (the CLI's one-line error, exit 2)."""
    if not stats.get("records_in", 0) or stats.get("records_out", 0):
        return
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in stats["dropped"].items())
    detail = dominant_drop(stats, share=0)
    raise ValueError(f"{stats['stage']} kept none of its {stats['records_in']:,} records"
                     + (f" (dropped: {reasons}); {detail}" if detail else ""))
