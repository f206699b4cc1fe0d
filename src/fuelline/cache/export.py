"""`fuelline cache export --to specforge`: a target cache as SpecForge's offline hidden-state files.

Sample i of the cache becomes `OUT/rows_{g}-{g+2000}/data_{i}.ckpt` (`.ckpt.gz` with
`--compress`), g = (i // 2000) * 2000, the layout and dict SpecForge's `prepare_hidden_states.py`
writes (`fuelline.cache.specforge` has the keys per method). What the files, the journal and the
reruns promise is told in docs/cache.md ("Training with SpecForge"); how they are kept:

- **Files.** Each is written under a hidden temp name (`.data_7.ckpt.tmp-…`, which SpecForge's
  walker, taking only names ending in .ckpt and .ckpt.gz, never lists). The bytes depend on the
  sample and the options only: `torch.save` into a file object names its archive `archive` and
  derives its serialization id from the content (saved to a *path*, the archive is named after
  the file, so the temp name would show), and gzip is written with mtime 0 and no file name.
- **Parallel.** `workers` threads each read, widen and write one sample at a time; reading
  (page faults in torch's copies), widening, zlib and the writes release the GIL. On 2 cores
  (200 samples of 1 to 512 tokens, hidden 1024, 3 layers), 1 → 2 threads: gzip 6.2 → 12.4
  files/s (zlib is the whole cost), plain bf16 61 → 80 files/s (fsync-bound), plain fp8 48 → 52.
- **Resume and recheck.** Every run, finished or not, checks every file against the journal
  (`export_files`) and rewrites the small files where they differ from what the cache and the
  options make them; the identity (`WorkDir`) is the cache's (`cache_identity`) and the options.
  stats.json is written last: an OUT with a stats.json is finished.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import orjson

from fuelline.cache.export_files import JOURNAL, check_files, digest, journal_bytes, journal_line, read_journal, strays
from fuelline.formats.specforge import METHODS
from fuelline.formats.target_cache import BF16, INDEX, checksum, manifest_digest
from fuelline.io.atomic import atomic_write, remove_temp_files, write_bytes_atomic
from fuelline.io.stage_layout import STATS_FILE
from fuelline.pipeline.options import Options, identity_history, identity_values, option
from fuelline.pipeline.stats import StepStats, read_stats
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions
from fuelline.progress import progress_bar

GROUP = 2000  # files per folder: SpecForge's --file-group-size default
MANIFEST_FILE, RECORD_IDS_FILE = "fuelline_export.json", "record_ids.txt"
EXPORT_FORMAT = "fuelline.specforge-export"
SPECFORGE_FORMAT = "specforge_hidden_states_v1"  # what SpecForge calls the offline files it reads
NONFINITE = ("error", "skip")


@dataclass
class ExportConfig(Options):
    """The options of `fuelline cache export --to specforge`; all of them decide the files."""

    method: str = option("eagle3", "the SpecForge method the files are for (eagle3: aux_hidden_state and "
                                   "hidden_state; dspark: hidden_states and target_last_hidden_states; "
                                   "dflash: hidden_states)", choices=METHODS)
    compress: bool = option(False, "gzip each file (.ckpt.gz), as SpecForge's --compress")
    compression_level: int = option(6, "gzip level, 1 (fast) to 9 (small), with --compress", min=1, max=9)
    limit: int | None = option(None, "export only the first N samples of the cache", min=1)
    nonfinite: str = option("error", "a NaN or Inf in a hidden state: error (stop, naming the sample) or skip "
                                     "(no file for it; listed in the export's manifest)", choices=NONFINITE)

    @property
    def extension(self) -> str:
        return ".ckpt.gz" if self.compress else ".ckpt"


def file_path(output: Path, sample: int, extension: str) -> Path:
    """Where SpecForge's preparation puts sample i: rows_{g}-{g+2000}/data_{i}{extension}."""
    group = sample // GROUP * GROUP
    return output / f"rows_{group}-{group + GROUP}" / f"data_{sample}{extension}"


def cache_identity(cache) -> dict:
    """What identifies a cache's content without reading its shards: digests of its manifest and of
    its index (a fuelline index holds every record's checksum), and its build's identity."""
    build = read_stats(cache.path / STATS_FILE)
    index = (cache.path / INDEX).read_bytes()
    return {"manifest_digest": f"{manifest_digest(cache.manifest):016x}", "index_digest": f"{checksum(index):016x}",
            "build": build.get("identity") if build else None}


def export_specforge(cache: str | os.PathLike, output: str | os.PathLike, config: ExportConfig, *,
                     workers: int | None = None, progress: bool = True, restart: bool = False,
                     verify: bool = True) -> dict:
    """Export `cache` into `output` (see the module docstring); return the stats written. A rerun
    checks every file (`verify`: their checksums too, else their sizes) and repairs what it finds."""
    from fuelline.cache.dataset import CacheDataset

    output = Path(output)
    if output.exists() and not output.is_dir():
        raise NotADirectoryError(f"{output} is a file; the export needs a directory")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    dataset = CacheDataset(cache)  # every check that reads no record: a non-cache fails here
    identity = {"task": ExportStep.name, "config": identity_values(config), "cache": cache_identity(dataset)}
    step_dir = WorkDir(output, identity, **identity_history(ExportConfig))
    with step_dir.lock():
        if restart:
            step_dir.restart()
        done = step_dir.finished()
        if done is None:
            step_dir.begin(anything_finished=lambda: any(output.glob("rows_*/data_*")))
        remove_temp_files(output)  # of files a killed export left half written (we hold the lock)
        return _export(dataset, step_dir, config, workers or len(os.sched_getaffinity(0)), progress, verify, done)


def _export(dataset, step_dir: WorkDir, config: ExportConfig, workers: int, progress: bool, verify: bool,
            done: dict | None) -> dict:
    """Check what OUT holds against the journal (`export_files`), write what is missing or wrong, remove
    strays; `done`: the stats of the finished export found here, returned as they are when nothing
    needed repair."""
    output = step_dir.path
    count = min(len(dataset), config.limit or len(dataset))
    if count == 0:
        raise ValueError(f"{dataset.path}: the cache holds no samples: nothing to export")
    paths = {i: file_path(output, i, config.extension) for i in range(count)}
    entries, intact = read_journal(output)
    if dataset.fuelline:  # a line without the record id its sample has names no file of this export
        entries = {i: e for i, e in entries.items() if isinstance(e.get("record_id"), str)}
    found = check_files(paths, entries, verify=verify, workers=workers)
    pending = sorted(sample for samples in found.values() for sample in samples)
    began = time.perf_counter()
    _write(_Writer(dataset, output, config), pending, entries, count, workers, progress)
    seconds = time.perf_counter() - began
    skipped = {i: entries[i]["skipped"] for i in range(count) if "skipped" in entries[i]}
    if len(skipped) == count:
        first = min(skipped)
        raise ValueError(f"{dataset.path}: no file exported: all {count:,} samples were skipped (the first, "
                         f"sample {first}: {skipped[first]})")
    removed = _remove_strays(output, {paths[i] for i in range(count) if i not in skipped})
    # as the journal has them: each read with its sample, its record checksummed (None: the format has no ids)
    ids = [entries[i]["record_id"] for i in range(count)] if dataset.fuelline else None
    rewritten = _rewrite_changed(output, _small_files(dataset, config, entries, count, skipped, ids))
    if done is not None and not intact:
        rewritten.insert(0, JOURNAL)  # damaged or edited after the export finished (a rerun appends to it)
    repairs = _repairs(found, removed, rewritten, finished=done is not None)
    if done is not None and not repairs:
        return done
    sizes = {i: entries[i]["bytes"] for i in range(count) if i not in skipped}
    written_bytes = sum(sizes[i] for i in pending if i in sizes)
    written = [i for i in pending if i in sizes]
    first = min(skipped, default=None)
    return step_dir.finish(StepStats(
        ExportStep.name, count, len(sizes), {"nonfinite": len(skipped)} if skipped else {},
        {"nonfinite": f"sample {first}: {skipped[first]}"} if skipped else {}, details={"export": {
            "method": config.method, "compressed": config.compress, "files": len(sizes),
            "bytes": sum(sizes.values()), "workers": workers, "widened_from_fp8": dataset.manifest["hidden_dtype"] != BF16,
            "record_ids": RECORD_IDS_FILE if ids is not None else None, "journal": JOURNAL,
            # this run's writing (a resumed export wrote only the missing files)
            "written_files": len(written), "written_bytes": written_bytes, "seconds": round(seconds, 3),
            "files_per_second": round(len(written) / seconds, 2) if seconds else 0.0,
            "gb_per_second": round(written_bytes / seconds / 1e9, 4) if seconds else 0.0,
            "repaired": repairs, "checked": "checksums" if verify else "sizes"}}))


def _write(writer: _Writer, pending: list[int], entries: dict[int, dict], count: int, workers: int,
           progress: bool) -> None:
    """Write the files of `pending`, each journaled (and put in `entries`) as it is renamed into place; the
    journal is flushed line by line, and fsynced when the export rewrites it at the end."""
    with (open(writer.output / JOURNAL, "ab") as journal,
          progress_bar(disable=not progress, total=count, initial=count - len(pending), unit="file",
                       desc="export: specforge") as bar):
        for sample, entry in _run(writer, pending, workers, bar):
            entries[sample] = entry
            journal.write(journal_line(entry))
            journal.flush()


def _small_files(dataset, config: ExportConfig, entries: dict[int, dict], count: int, skipped: dict[int, str],
                 ids: list[str] | None) -> dict[str, bytes]:
    """What the journal, the manifest and record_ids.txt of a finished export hold, from the cache and the options."""
    small = {JOURNAL: journal_bytes(entries, count),
             MANIFEST_FILE: orjson.dumps(_manifest(dataset, config, count, count - len(skipped), skipped, ids),
                                         option=orjson.OPT_INDENT_2) + b"\n"}
    if ids is not None:
        small[RECORD_IDS_FILE] = "".join(f"{i}\n" for i in ids).encode("utf-8")
    return small


def _remove_strays(output: Path, expected: set[Path]) -> list[str]:
    """Remove the strays of `export_files.strays` (and rows_* folders they leave empty); their names."""
    found = strays(output, expected)
    for path in found:
        path.unlink()
        if path.parent != output and not any(path.parent.iterdir()):
            path.parent.rmdir()
    return [path.relative_to(output).as_posix() for path in found]


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

    def __init__(self, dataset, output: Path, config: ExportConfig):
        self.dataset, self.output, self.config = dataset, output, config
        self.local = threading.local()
        self.copy = pickle.dumps(dataset)

    def __call__(self, sample: int) -> dict:
        """Write sample's file; its journal entry (`export_files`): its record id, its size and xxh3, or
        why it was skipped."""
        import torch

        from fuelline.cache.specforge import NonFiniteState, specforge_record

        if not hasattr(self.local, "dataset"):
            self.local.dataset = pickle.loads(self.copy)
        item = self.local.dataset[sample]
        ids = {"record_id": item["record_id"]} if "record_id" in item else {}  # for record_ids.txt and the manifest
        if "\n" in ids.get("record_id", "") or "\r" in ids.get("record_id", ""):
            raise ValueError(f"{self.dataset.path}: sample {sample}: its record id {ids['record_id']!r} holds a line "
                             f"break, which {RECORD_IDS_FILE} (one id per line) cannot hold")
        try:
            record = specforge_record(item, self.config.method, where=(self.dataset.path, sample))
        except NonFiniteState as e:
            if self.config.nonfinite == "skip":
                return {"sample": sample, **ids, "skipped": f"{e.key} holds {e.count:,} NaN or Inf value(s)"}
            e.add_note("pass --nonfinite skip to leave such samples out (they are listed in the export's manifest)")
            raise
        buffer = io.BytesIO()  # one file's bytes, checksummed for the journal before they are written
        if self.config.compress:  # mtime 0 and no file name: the same bytes on every run
            with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=self.config.compression_level,
                               mtime=0) as stream:
                torch.save(record, stream)
        else:
            torch.save(record, buffer)
        data = buffer.getbuffer()
        with atomic_write(file_path(self.output, sample, self.config.extension)) as f:
            f.write(data)
        return {"sample": sample, **ids, "bytes": len(data), "xxh3": digest(data)}


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


def _manifest(dataset, config: ExportConfig, count: int, exported: int, skipped: dict[int, str],
              ids: list[str] | None) -> dict:
    manifest = dataset.manifest
    return {
        "format": EXPORT_FORMAT, "version": 1, "specforge_format": SPECFORGE_FORMAT, "method": config.method,
        "compressed": config.compress, "compression_level": config.compression_level if config.compress else None,
        "files": f"rows_{{g}}-{{g+{GROUP}}}/data_{{i}}{config.extension}: i is the cache's sample index, "
                 f"g = i // {GROUP} * {GROUP}",
        "samples": count, "exported": exported, "limit": config.limit, "nonfinite": config.nonfinite,
        "skipped": [{"sample": i, "record_id": ids[i] if ids else None, "reason": reason}
                    for i, reason in sorted(skipped.items())],
        "record_ids": RECORD_IDS_FILE if ids is not None else None,
        "record_ids_note": ("line i + 1 holds the record id of sample i (data_i)" if ids is not None else
                            f"a {dataset.layout.format} cache stores no record ids"),
        "cache": {"name": dataset.path.name, "format": dataset.layout.format,
                  "target_model_name_or_path": manifest.get("target_model_name_or_path"),
                  "target_layer_ids": manifest["target_layer_ids"], "hidden_size": manifest["hidden_size"],
                  "num_samples": len(dataset), "hidden_dtype": manifest["hidden_dtype"],
                  "widened_from_fp8": manifest["hidden_dtype"] != BF16, "exported_dtype": "bfloat16",
                  "manifest_digest": f"{manifest_digest(manifest):016x}"},
    }


class ExportStep(Step):
    """Export a target cache (the step's one input) as SpecForge's offline hidden-state files."""

    name, Config = "specforge-export", ExportConfig
    verify = True  # a rerun checks every file's checksum; `fuelline cache export --no-verify`: sizes only

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        if len(inputs) != 1:
            raise ValueError(f"{self.name} exports one target cache; it was given {len(inputs)} inputs")
        return export_specforge(inputs[0], output, self.config, workers=options.workers, progress=options.progress,
                                restart=options.restart, verify=self.verify)
