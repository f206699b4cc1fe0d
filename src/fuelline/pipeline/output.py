"""Where a stage's output lives: a local directory, or an fsspec URL its files are uploaded to.

The layout (`fuelline.io.stage_layout`) is the same for both. For a URL
(`s3://bucket/clean`) the run writes into a local staging directory under the cache
(`fuelline.io.remote.staging_dir`) and `RemoteOutput` uploads each finished shard's files, its
marker last, from the worker that wrote them; `_plan.json` goes up when it is written and
`stats.json` last. Resume reads the URL's markers and checks the sizes they record against the
files there; `_prepare/` stays in the staging directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

from fuelline.io.atomic import is_temp_name, write_bytes_atomic
from fuelline.io.lock import exclusive_output
from fuelline.io.remote import RemoteDir, canonical, is_url, staging_dir
from fuelline.io.step_files import ForeignFiles, is_foreign
from fuelline.pipeline.workdir import not_a_step_output
from fuelline.io.stage_layout import (
    DONE_DIR,
    PREPARE_DIR,
    PLAN_FILE,
    STATS_FILE,
)


class OutputStore:
    """Where a stage's finished files end up: here, the output directory the run writes into,
    with nothing more to do; `RemoteOutput`, a URL they are uploaded to from a local directory."""

    def __init__(self, directory: Path):
        self.directory = directory  # where the run writes its files

    def __str__(self) -> str:
        return os.fspath(self.directory)

    def lock(self):
        return exclusive_output(self.directory)

    def locations(self, locations: dict[str, str | os.PathLike] | None) -> dict[str, str | os.PathLike] | None:
        """`output_locations` of `run_stage` as directories to write into."""
        for name, location in (locations or {}).items():
            if is_url(location):
                raise ValueError(f"output {name!r} cannot go to the URL {location} when the stage directory "
                                 f"{self} is local; make both URLs, or both local")
        return locations

    def pull(self) -> None:
        """Bring what the store holds of `_plan.json` and `_done/` into `directory` (under the lock)."""

    def sizes(self) -> Callable[[str], int | None]:
        """The size of each finished file, by its name under the output, as the store holds it now."""
        return self._local_size

    def _local_size(self, name: str) -> int | None:
        path = self.directory / name
        return path.stat().st_size if path.is_file() else None

    def publish(self, names: list[str]) -> None:
        """Make files written under `directory` (names relative to it) part of the store, in order."""

    def discard(self, writes: Sequence[str], by: str | None) -> None:
        """Delete what the store holds beyond `directory`, which the run's `WorkDir` deletes (`restart`,
        or other options before any shard finished): what the stage writes (`writes`,
        `fuelline.io.step_files`), refused (`by`, as `WorkDir.discard`) when it holds more."""

    def finish(self) -> None:
        """Publish what the stage wrote beside its shards (e.g. dedup's audit), then stats.json."""


class RemoteOutput(OutputStore):
    """An output at a URL: the run writes into a staging directory of this machine's cache (one
    run per URL and machine holds its lock), and the files go up as they are finished.

    The staging directory mirrors the URL's `_plan.json` and `_done/` markers; its data files are
    removed once uploaded. It is reset when the URL holds another plan, so `_prepare/` is never
    one made for other options.
    """

    def __init__(self, url: str):
        super().__init__(staging_dir(url))
        self.url = url.rstrip("/")
        self.remote = RemoteDir(self.url)

    def __str__(self) -> str:
        return self.url

    def lock(self):
        """One run per URL and machine; object stores have no locks to keep two machines apart."""
        return exclusive_output(self.directory, name=f"{self.url} (staged in {self.directory})")

    def locations(self, locations):
        """A further output must stay inside the URL (`URL/NAME`): its files go up with the shards."""
        mapped, base = {}, canonical(self.url)
        for name, location in (locations or {}).items():
            text = canonical(location).rstrip("/") if is_url(location) else os.fspath(location)
            if not text.startswith(base + "/"):
                raise ValueError(f"with the stage output at the URL {self.url}, output {name!r} must be inside it "
                                 f"(e.g. {self.url}/{name}), not {location}")
            mapped[name] = self.directory / text[len(base) + 1:]
        return mapped

    def pull(self) -> None:
        listing = self.remote.sizes()
        self.remote.remove([n for n in listing if is_temp_name(n.rsplit("/", 1)[-1])])  # of a killed upload
        if PLAN_FILE not in listing:
            if any(not is_temp_name(n.rsplit("/", 1)[-1]) for n in listing):
                raise not_a_step_output(self.url)
            _remove(self.directory)
            return
        plan = self.remote.read([PLAN_FILE])[PLAN_FILE]
        local_plan = self.directory / PLAN_FILE
        if not local_plan.is_file() or local_plan.read_bytes() != plan:
            _remove(self.directory)
            write_bytes_atomic(local_plan, plan)
        self._mirror_markers(listing)

    def _mirror_markers(self, listing: dict[str, int]) -> None:
        """Make the staging directory's `_done/` what the URL's is."""
        remote = {n for n in listing if n.startswith(f"{DONE_DIR}/") and n.endswith(".json")}
        done = self.directory / DONE_DIR
        local = {f"{DONE_DIR}/{p.name}" for p in done.glob("*.json")} if done.is_dir() else set()
        for name in local - remote:  # written here, but never uploaded: the shard is not finished
            (self.directory / name).unlink()
        for name, data in self.remote.read(sorted(remote - local)).items():  # e.g. by another node
            write_bytes_atomic(self.directory / name, data)

    def sizes(self) -> Callable[[str], int | None]:
        listing = self.remote.sizes()
        self._mirror_markers(listing)
        return listing.get

    def publish(self, names: list[str]) -> None:
        for name in names:
            self.remote.put(self.directory / name, name)
        for name in names:  # data: no longer needed here; bookkeeping: the mirror of the URL's
            if name not in (PLAN_FILE, STATS_FILE) and not name.startswith(f"{DONE_DIR}/"):
                (self.directory / name).unlink()

    def discard(self, writes: Sequence[str], by: str | None) -> None:
        listing = sorted(self.remote.sizes())
        if by is not None and (foreign := [n for n in listing if is_foreign(n, writes)]):
            raise ForeignFiles(by, self.url, foreign[0])
        self.remote.remove([n for n in listing if not is_foreign(n, writes)])

    def finish(self) -> None:
        listing = self.remote.sizes()
        extra = []
        for path in sorted(p for p in self.directory.rglob("*") if p.is_file()):
            name = path.relative_to(self.directory).as_posix()
            if name.split("/")[0] in (PREPARE_DIR, DONE_DIR) or name in (PLAN_FILE, STATS_FILE) \
                    or is_temp_name(path.name):
                continue
            if listing.get(name) == path.stat().st_size:
                path.unlink()  # up already (a shard whose run stopped between its upload and this cleanup)
            else:
                extra.append(name)
        self.publish([*extra, STATS_FILE])


def open_output(output: str | os.PathLike) -> OutputStore:
    """The store of a stage's output: a local directory, or a URL (`RemoteOutput`)."""
    return RemoteOutput(output) if is_url(output) else OutputStore(Path(output))


def _remove(directory: Path) -> None:
    """Remove the local staging copy. One that cannot be removed is an error, not passed over: what it
    still held would be taken for this run's."""
    if directory.exists():
        shutil.rmtree(directory)
