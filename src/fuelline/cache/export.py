"""`fuelline cache export --to TRAINER`: a target cache as a trainer's offline files, one a sample.

What a trainer reads is an `ExportTarget`: where sample i's file goes, its bytes, which other files
in OUT its walker would take, and the small files beside (`fuelline.cache.export_specforge`:
SpecForge's `rows_*/data_i.ckpt`; `fuelline.cache.export_speculators`: speculators' `data_i.pt`
with `sample_lengths.json`, or its Arrow dataset with `hidden_states/hs_i.safetensors`). Everything
else is here, the same for every trainer; what the files, the journal and the reruns promise is
told in docs/cache.md ("Training with SpecForge"). How they are kept:

- **Files.** Each is written under a hidden temp name (`.data_7.ckpt.tmp-…`, which no trainer's
  walker lists: SpecForge's takes names ending in .ckpt and .ckpt.gz, speculators' names ending in
  pt). The bytes depend on the sample and the options only (each target says how: torch.save into
  a file object, gzip with mtime 0, safetensors' sorted header).
- **Parallel.** `workers` threads each read, widen and write one sample at a time; reading
  (page faults in torch's copies), widening, zlib and the writes release the GIL. On 2 cores
  (200 samples of 1 to 512 tokens, hidden 1024, 3 layers), 1 → 2 threads: SpecForge gzip 6.2 →
  12.4 files/s (zlib is the whole cost), plain bf16 61 → 80 files/s (fsync-bound), plain fp8 48 → 52.
- **Resume and recheck.** Every run, finished or not, checks every file against the journal
  (`export_files`), removes the strays it wrote and refuses one it did not, and rewrites the small
  files where they differ from what the cache and the options make them; the identity (`WorkDir`)
  is the step's, the cache's (`cache_identity`) and the options. stats.json is written last: an
  OUT with a stats.json is finished.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import orjson

from fuelline.cache.export_files import JOURNAL, check_files, digest, journal_bytes, journal_line, read_journal, strays
from fuelline.formats.target_cache import BF16, INDEX, checksum, manifest_digest
from fuelline.io.atomic import atomic_write, remove_temp_files, write_bytes_atomic
from fuelline.io.stage_layout import STATS_FILE
from fuelline.io.step_files import Layout
from fuelline.pipeline.options import Options, check_declared, identity_history, identity_values, option
from fuelline.pipeline.stats import StepStats, read_stats
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions
from fuelline.progress import progress_bar

MANIFEST_FILE, RECORD_IDS_FILE = "fuelline_export.json", "record_ids.txt"
NONFINITE = ("error", "skip")


@dataclass
class ExportOptions(Options):
    """The options every export has; a trainer's Config adds its own. All of them decide the files."""

    limit: int | None = option(None, "export only the first N samples of the cache", min=1)
    nonfinite: str = option("error", "a NaN or Inf in a hidden state: error (stop, naming the sample) or skip "
                                     "(no file for it; listed in the export's manifest)", choices=NONFINITE)


class ExportTarget:
    """One trainer's offline files, made from `config` (its `ExportOptions`). A subclass says where
    each sample's file goes and what it holds, which files of OUT are the trainer's, and what the
    small files beside hold; the export does the rest."""

    trainer = ""  # what `--to` names it
    export_format = ""  # fuelline_export.json's "format"
    sample_name = "data_{i}"  # sample i's file, as messages and the manifest name it

    def __init__(self, config: ExportOptions):
        self.config = config

    def writes(self) -> tuple[str, ...]:
        """Its samples' files and the small files beside them, as patterns under OUT
        (`fuelline.io.step_files`), of every layout it may write (--restart may change it): with the
        export's own, all that --restart deletes."""
        raise NotImplementedError

    def file_path(self, output: Path, sample: int) -> Path:
        raise NotImplementedError

    def is_data_file(self, output: Path, path: Path) -> bool:
        """Whether `path`, a file under `output`, is one the trainer would read or that lies in the
        export's own folders: one that no sample of this export names is a stray, removed when the
        export wrote it, else refused (`_Run._strays`)."""
        raise NotImplementedError

    def file_bytes(self, item: dict, where: tuple[Path, int]) -> tuple[memoryview | bytes, dict]:
        """(the bytes of the file of `item`, a `CacheDataset` sample; fields its journal line adds).
        `where`: (cache, sample), what an error names. Raises `NonFiniteState` for a NaN or Inf."""
        raise NotImplementedError

    def small_files(self, output: Path, dataset, entries: dict[int, dict], exported: list[int]) -> dict[str, bytes]:
        """The trainer's files beside the samples' (`sample_lengths.json`, an Arrow table), from the
        journal's `entries` and the files of the `exported` samples, already checked."""
        return {}

    def manifest_head(self) -> dict:
        """What fuelline_export.json says of the trainer's format and options, after "version"."""
        return {}

    def files_note(self) -> str:
        """Where sample i's file is, in words (fuelline_export.json's "files")."""
        raise NotImplementedError

    def details(self) -> dict:
        """The trainer's options as the stats show them (stats.json's "export")."""
        return {}

    def summary(self) -> str:
        """What the files are for, after "N of M samples exported" (`fuelline cache export`'s summary)."""
        raise NotImplementedError


def cache_identity(cache) -> dict:
    """What identifies a cache's content without reading its shards: digests of its manifest and of
    its index (a fuelline index holds every record's checksum), and its build's identity."""
    build = read_stats(cache.path / STATS_FILE)
    index = (cache.path / INDEX).read_bytes()
    return {"manifest_digest": f"{manifest_digest(cache.manifest):016x}", "index_digest": f"{checksum(index):016x}",
            "build": build.get("identity") if build else None}


def export_cache(cache: str | os.PathLike, output: str | os.PathLike, target: ExportTarget, *, step: str,
                 workers: int | None = None, progress: bool = True, restart: bool = False,
                 verify: bool = True) -> dict:
    """Export `cache` into `output` as `target`'s files (see the module docstring); return the stats
    written. `step`: the step's name, part of the identity. A rerun checks every file (`verify`: their
    checksums too, else their sizes) and repairs what it finds."""
    from fuelline.cache.dataset import CacheDataset

    check_declared(RunOptions, "workers", workers, optional=True)
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise NotADirectoryError(f"{output} is a file; the export needs a directory")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    dataset = CacheDataset(cache)  # every check that reads no record: a non-cache fails here
    identity = {"task": step, "config": identity_values(target.config), "cache": cache_identity(dataset)}
    step_dir = WorkDir(output, identity, **identity_history(type(target.config)), reads=[cache],
                       writes=[MANIFEST_FILE, RECORD_IDS_FILE, JOURNAL, *target.writes()])
    with step_dir.lock():
        if restart:
            step_dir.restart()
        done = step_dir.finished()
        if done is None:
            theirs = partial(target.is_data_file, output)  # a file the trainer would read, or of the export's folders
            step_dir.begin(anything_finished=lambda: bool(strays(output, set(), theirs)))
        run = _Run(dataset, step_dir, target, workers or len(os.sched_getaffinity(0)), progress, verify, step)
        return run.export(done)


class _Run:
    """One run of an export: check what OUT holds against the journal (`export_files`), refuse a
    user's file the trainer would read, write what is missing or wrong, remove the export's own
    strays, write the small files, then stats.json."""

    def __init__(self, dataset, step_dir: WorkDir, target: ExportTarget, workers: int, progress: bool, verify: bool,
                 step: str):
        self.dataset, self.step_dir, self.target, self.output = dataset, step_dir, target, step_dir.path
        self.workers, self.progress, self.verify, self.step = workers, progress, verify, step

    def export(self, done: dict | None) -> dict:
        """`done`: the stats of the finished export found here, returned as they are when nothing needed repair."""
        dataset, target, output = self.dataset, self.target, self.output
        count = min(len(dataset), target.config.limit or len(dataset))
        if count == 0:
            raise ValueError(f"{dataset.path}: the cache holds no samples: nothing to export")
        paths = {i: target.file_path(output, i) for i in range(count)}
        entries, intact = read_journal(output)
        if dataset.fuelline:  # a line without the record id its sample has names no file of this export
            entries = {i: e for i, e in entries.items() if isinstance(e.get("record_id"), str)}
        found = check_files(paths, entries, verify=self.verify, workers=self.workers)
        left = self._strays(set(paths.values()), entries, finished=done is not None)
        remove_temp_files(output)  # of files a killed export left half written (we hold the lock)
        pending = sorted(sample for samples in found.values() for sample in samples)
        began = time.perf_counter()
        self._write(pending, entries, count)
        seconds = time.perf_counter() - began
        skipped = {i: entries[i]["skipped"] for i in range(count) if "skipped" in entries[i]}
        if len(skipped) == count:
            first = min(skipped)
            raise ValueError(f"{dataset.path}: no file exported: all {count:,} samples were skipped (the first, "
                             f"sample {first}: {skipped[first]})")
        exported = [i for i in range(count) if i not in skipped]
        removed = self._remove([*left, *(paths[i] for i in skipped if paths[i].is_file())])  # a skipped sample's name
        # as the journal has them: each read with its sample, its record checksummed (None: the format has no ids)
        ids = [entries[i]["record_id"] for i in range(count)] if dataset.fuelline else None
        small = {JOURNAL: journal_bytes(entries, count),
                 **target.small_files(output, dataset, entries, exported),
                 MANIFEST_FILE: orjson.dumps(self._manifest(count, len(exported), skipped, ids),
                                             option=orjson.OPT_INDENT_2) + b"\n"}
        if ids is not None:
            small[RECORD_IDS_FILE] = "".join(f"{i}\n" for i in ids).encode("utf-8")
        rewritten = _rewrite_changed(output, small)
        if done is not None and not intact:
            rewritten.insert(0, JOURNAL)  # damaged or edited after the export finished (a rerun appends to it)
        repairs = _repairs(found, removed, rewritten, finished=done is not None)
        if done is not None and not repairs:
            return done
        return self._finish(count, {i: entries[i]["bytes"] for i in exported}, skipped, ids, pending, seconds, repairs)

    def _finish(self, count: int, sizes: dict[int, int], skipped: dict[int, str], ids: list[str] | None,
                pending: list[int], seconds: float, repairs: dict) -> dict:
        """Write stats.json, last: `sizes`, each exported sample's file size; `pending`, the samples this run
        wrote (or found skipped) in `seconds`."""
        written = [i for i in pending if i in sizes]
        written_bytes = sum(sizes[i] for i in written)
        first = min(skipped, default=None)
        return self.step_dir.finish(StepStats(
            self.step, count, len(sizes), {"nonfinite": len(skipped)} if skipped else {},
            {"nonfinite": f"sample {first}: {skipped[first]}"} if skipped else {}, details={"export": {
                **self.target.details(), "files": len(sizes), "bytes": sum(sizes.values()), "workers": self.workers,
                "widened_from_fp8": self.dataset.manifest["hidden_dtype"] != BF16,
                "record_ids": RECORD_IDS_FILE if ids is not None else None, "journal": JOURNAL,
                # this run's writing (a resumed export wrote only the missing files)
                "written_files": len(written), "written_bytes": written_bytes, "seconds": round(seconds, 3),
                "files_per_second": round(len(written) / seconds, 2) if seconds else 0.0,
                "gb_per_second": round(written_bytes / seconds / 1e9, 4) if seconds else 0.0,
                "repaired": repairs, "checked": "checksums" if self.verify else "sizes"}}))

    def _write(self, pending: list[int], entries: dict[int, dict], count: int) -> None:
        """Write the files of `pending`, each journaled (and put in `entries`) as it is renamed into place; the
        journal is flushed line by line, and fsynced when the export rewrites it at the end."""
        writer = _Writer(self.dataset, self.output, self.target)
        with (open(self.output / JOURNAL, "ab") as journal,
              progress_bar(disable=not self.progress, total=count, initial=count - len(pending), unit="file",
                           desc=f"export: {self.target.trainer}") as bar):
            for sample, entry in _run(writer, pending, self.workers, bar):
                entries[sample] = entry
                journal.write(journal_line(entry))
                journal.flush()

    def _strays(self, expected: set[Path], entries: dict[int, dict], *, finished: bool) -> list[Path]:
        """The files under OUT the trainer would read as data that no sample of this export has: each
        one the export wrote (its journal names it; or its declared layout does, and the export is
        unfinished), to remove once the files are written. One it did not write (a user's `notes.pt`)
        refuses the run, before anything is written or deleted."""
        output, target = self.output, self.target
        journaled = {target.file_path(output, sample) for sample in entries}
        layout = Layout(self.step_dir.writes)
        found = strays(output, expected, partial(target.is_data_file, output))
        for path in found:
            if path not in journaled and (finished or not layout.written(path.relative_to(output).parts)):
                raise ValueError(f"{path}: not written by this export, and {target.trainer} would read it as "
                                 "training data; move it away and run the same command again")
        return found

    def _remove(self, found: list[Path]) -> list[str]:
        """Remove `found`, the export's strays (and the folders they leave empty); their names."""
        output = self.output
        for path in sorted(found):
            path.unlink()
            if path.parent != output and not any(path.parent.iterdir()):
                path.parent.rmdir()
        return [path.relative_to(output).as_posix() for path in sorted(found)]

    def _manifest(self, count: int, exported: int, skipped: dict[int, str], ids: list[str] | None) -> dict:
        dataset, manifest, config = self.dataset, self.dataset.manifest, self.target.config
        return {
            "format": self.target.export_format, "version": 1, **self.target.manifest_head(),
            "files": self.target.files_note(),
            "samples": count, "exported": exported, "limit": config.limit, "nonfinite": config.nonfinite,
            "skipped": [{"sample": i, "record_id": ids[i] if ids else None, "reason": reason}
                        for i, reason in sorted(skipped.items())],
            "record_ids": RECORD_IDS_FILE if ids is not None else None,
            "record_ids_note": (f"line i + 1 holds the record id of sample i ({self.target.sample_name.format(i='i')})"
                                if ids is not None else
                                f"a {dataset.layout.format} cache stores no record ids"),
            "cache": {"name": dataset.path.name, "format": dataset.layout.format,
                      "target_model_name_or_path": manifest.get("target_model_name_or_path"),
                      "target_layer_ids": manifest["target_layer_ids"], "hidden_size": manifest["hidden_size"],
                      "num_samples": len(dataset), "hidden_dtype": manifest["hidden_dtype"],
                      "widened_from_fp8": manifest["hidden_dtype"] != BF16, "exported_dtype": "bfloat16",
                      "manifest_digest": f"{manifest_digest(manifest):016x}"},
        }


def _rewrite_changed(output: Path, files: dict[str, bytes]) -> list[str]:
    """Write each of `files` whose bytes on disk differ (missing, short, edited); the names of those
    that existed and were wrong. A record_ids.txt the cache cannot have (deepspec-v2) is a stray."""
    rewritten = []
    for name, data in files.items():
        path = output / name
        try:
            existed, same = True, path.read_bytes() == data
        except FileNotFoundError:
            existed = same = False
        if not same:
            write_bytes_atomic(path, data)
            if name != JOURNAL:  # appended to by this run: said only when it was damaged (the caller)
                rewritten.append(name if existed else f"{name} (missing)")
    if RECORD_IDS_FILE not in files and (output / RECORD_IDS_FILE).exists():
        (output / RECORD_IDS_FILE).unlink()
        rewritten.append(f"{RECORD_IDS_FILE} (removed: the cache stores no record ids)")
    return rewritten


def _repairs(found: dict[str, list[int]], removed: list[str], rewritten: list[str], *, finished: bool) -> dict:
    """What this run found wrong and put right. An unfinished export's missing or unjournaled
    files, and its small files not yet written, are the work left, not damage."""
    ordinary = () if finished else ("missing", "unjournaled")
    repairs = {kind: items[:20] + ([f"… {len(items) - 20:,} more"] if len(items) > 20 else [])
               for kind, items in {**found, "strays_removed": removed}.items() if items and kind not in ordinary}
    files = [name for name in rewritten if finished or not name.endswith("(missing)")]
    if files:
        repairs["rewritten"] = files
    return repairs


class _Writer:
    """Writes one sample's file; each thread reads through a copy of the dataset of its own (the
    dataset's open-shard LRU is not thread-safe; a pickled copy reopens shards lazily)."""

    def __init__(self, dataset, output: Path, target: ExportTarget):
        self.dataset, self.output, self.target = dataset, output, target
        self.local = threading.local()
        self.copy = pickle.dumps(dataset)

    def __call__(self, sample: int) -> dict:
        """Write sample's file; its journal entry (`export_files`): its record id, its size and xxh3, or
        why it was skipped."""
        from fuelline.cache.trainer_states import NonFiniteState

        if not hasattr(self.local, "dataset"):
            self.local.dataset = pickle.loads(self.copy)
        item = self.local.dataset[sample]
        ids = {"record_id": item["record_id"]} if "record_id" in item else {}  # for record_ids.txt and the manifest
        if "\n" in ids.get("record_id", "") or "\r" in ids.get("record_id", ""):
            raise ValueError(f"{self.dataset.path}: sample {sample}: its record id {ids['record_id']!r} holds a line "
                             f"break, which {RECORD_IDS_FILE} (one id per line) cannot hold")
        try:
            data, extra = self.target.file_bytes(item, (self.dataset.path, sample))
        except NonFiniteState as e:
            if self.target.config.nonfinite == "skip":
                return {"sample": sample, **ids, "skipped": f"{e.key} holds {e.count:,} NaN or Inf value(s)"}
            e.add_note("pass --nonfinite skip to leave such samples out (they are listed in the export's manifest)")
            raise
        with atomic_write(self.target.file_path(self.output, sample)) as f:
            f.write(data)
        return {"sample": sample, **ids, "bytes": len(data), "xxh3": digest(data), **extra}


def _run(write: _Writer, samples: list[int], workers: int, bar):
    """(sample, journal entry) of each of `samples` as its file is written, on `workers` threads with
    a few tasks queued per thread. The first error stops the export; the files written stay."""
    todo, running = iter(samples), set()
    with ThreadPoolExecutor(workers, thread_name_prefix="export") as pool:
        try:
            while True:
                while len(running) < 4 * workers and (sample := next(todo, None)) is not None:
                    future = pool.submit(write, sample)
                    future.sample = sample
                    running.add(future)
                if not running:
                    return
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.sample, future.result()
                    bar.update()
        except BaseException as e:
            for future in running:
                future.cancel()
            e.add_note("the files written so far are kept: the same command resumes")
            raise


class TrainerExportStep(Step):
    """The base of the export steps: a subclass names its `Target` (an `ExportTarget` class) and Config."""

    Target: type[ExportTarget]
    verify = True  # a rerun checks every file's checksum; `fuelline cache export --no-verify`: sizes only

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        if len(inputs) != 1:
            raise ValueError(f"{self.name} exports one target cache; it was given {len(inputs)} inputs")
        return export_cache(inputs[0], output, self.Target(self.config), step=self.name, workers=options.workers,
                            progress=options.progress, restart=options.restart, verify=self.verify)
