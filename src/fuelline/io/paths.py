"""Turn what a user typed (files, directories, globs) into an ordered list of input files.

Each may be a local path or an fsspec URL (`s3://bucket/corpus/`, `memory://x/*.jsonl`): a local
file comes back as a `Path`, a file at a URL as its URL (a `str`), which the readers fetch
through the cache of `fuelline.io.remote` when they open it. A directory a stage wrote is read
as its part files (`fuelline.io.stage_layout`): a further output's parts in a folder of it are
not the first output's records.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Iterable

from fuelline.io.atomic import is_temp_name
from fuelline.io.remote import filesystem, is_url
from fuelline.io.stage_layout import BOOKKEEPING_FILES, DONE_DIR, STAGE_PART_PREFIX

COMPRESSIONS = (".gz", ".zst", ".zstd", ".bz2", ".xz")
LINE_FORMATS = (".jsonl", ".ndjson")
DATA_SUFFIXES = LINE_FORMATS + (".json", ".parquet")


def split_suffixes(path: str | os.PathLike) -> tuple[str, str | None]:
    """Return (data format suffix, compression suffix or None), e.g. ('.jsonl', '.zst')."""
    name = Path(path).name.lower()
    compression = next((c for c in COMPRESSIONS if name.endswith(c)), None)
    if compression:
        name = name[: -len(compression)]
    fmt = next((s for s in DATA_SUFFIXES if name.endswith(s)), "")
    return fmt, compression


def is_data_file(path: str | os.PathLike) -> bool:
    name = Path(path).name
    if name.startswith((".", "_")) or is_temp_name(name):
        return False
    fmt, compression = split_suffixes(name)
    return bool(fmt) and not (fmt == ".parquet" and compression)


def _data_files(relatives: list[str], stage: bool) -> list[str]:
    """The data files among `relatives` (names under a directory, `/`-separated), in the order of
    sorted local Paths: of a stage's directory (`stage`: it holds `_done/`) its part files only, else
    those outside hidden and `_` folders, bookkeeping left out."""
    if stage:
        chosen = [r for r in relatives if "/" not in r and r.startswith(STAGE_PART_PREFIX) and is_data_file(r)]
    else:
        chosen = [r for r in relatives if not any(d.startswith((".", "_")) for d in r.split("/")[:-1])
                  and is_data_file(r) and r.rsplit("/", 1)[-1] not in BOOKKEEPING_FILES]
    return sorted(chosen, key=lambda r: tuple(r.split("/")))


def _files_in_directory(directory: Path) -> list[Path]:
    relatives = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]  # skipped whole, not listed
        relatives += [Path(root, f).relative_to(directory).as_posix() for f in files]
    return [directory / r for r in _data_files(relatives, (directory / DONE_DIR).is_dir())]


def _files_at_url_directory(fs, directory: str) -> list[str]:
    """The data files under a directory of an fsspec filesystem, as URLs."""
    directory = directory.rstrip("/")
    found = fs.find(directory, detail=True)
    files = {name[len(directory) + 1:]: name for name, info in found.items()
             if info["type"] == "file" and name.startswith(directory + "/")}
    stage = any(r.startswith(f"{DONE_DIR}/") for r in files)
    return [fs.unstrip_protocol(files[r]) for r in _data_files(list(files), stage)]


def _url_files(url: str) -> list[str]:
    """What `expand_inputs` finds for one URL: a file, a directory or a glob."""
    fs, path = filesystem(url)
    if glob.has_magic(url):
        matched = []
        for hit, info in sorted(fs.glob(path, detail=True).items()):
            if info["type"] == "directory":
                matched.extend(_files_at_url_directory(fs, hit))
            elif is_data_file(hit):
                matched.append(fs.unstrip_protocol(hit))
        return matched
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file or directory") from None
    if info["type"] != "directory":
        _check_data_file(url)
        return [url]
    return _files_at_url_directory(fs, path)


def _local_files(text: str) -> list[Path]:
    """What `expand_inputs` finds for one local path: a file, a directory or a glob."""
    path = Path(text)
    if path.is_dir():
        return _files_in_directory(path)
    if glob.has_magic(text):
        matched = []
        for hit in map(Path, sorted(glob.glob(text, recursive=True))):
            matched.extend(_files_in_directory(hit) if hit.is_dir() else [hit] if is_data_file(hit) else [])
        return matched
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    _check_data_file(path)
    return [path]


def _check_data_file(name: str | os.PathLike) -> None:
    if not is_data_file(name):
        raise ValueError(
            f"{name}: unsupported file type; expected one of "
            f"{', '.join(DATA_SUFFIXES)} (optionally {', '.join(COMPRESSIONS)}, except for parquet)"
        )


def expand_inputs(sources: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path | str]:
    """Files for `sources`, in the order given; directories and globs expand in sorted order.

    A file named explicitly must exist and have a supported suffix; a glob or directory that
    matches nothing is an error, so a typo never turns into an empty run. A local file is a
    `Path`; a file at a URL is its URL.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files: list[Path | str] = []
    for source in sources:
        text = os.fspath(source)
        matched = _url_files(text) if is_url(text) else _local_files(text)
        if not matched:
            raise FileNotFoundError(f"{text}: matched no data files")
        files.extend(matched)
    return files
