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
from fuelline.io.streams import blocks, decompression_errors, head_without_bom, open_binary
from fuelline.io.suffixes import COMPRESSIONS, DATA_SUFFIXES, split_suffixes

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


def as_sources(sources: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str | os.PathLike]:
    """One source, or several, as a list."""
    return [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)


def expand_inputs(sources: str | os.PathLike | Iterable[str | os.PathLike], *, empty_ok: bool = False
                  ) -> list[Path | str]:
    """Files for `sources`, in the order given; directories and globs expand in sorted order.

    A file named explicitly must exist and have a supported suffix; a glob or directory that
    matches nothing is an error, so a typo never turns into an empty run, and so is a source whose
    local files hold no records (`_holds_records`): an empty run would only fail steps later. A
    file found twice (`-i a.jsonl -i a.jsonl`, a file and its directory, a symlink and its
    target, two globs) is refused: read twice it would double its records. A local file is a
    `Path`; a file at a URL is its URL. `empty_ok`: for what reads a step's own output back, which
    may hold no records, not an input a user named.
    """
    files: dict[str, tuple[Path | str, str]] = {}  # {where it is: (the file, the source that named it)}
    for source in as_sources(sources):
        text = os.fspath(source)
        matched = _url_files(text) if is_url(text) else _local_files(text)
        if not matched:
            raise FileNotFoundError(f"{text}: matched no data files")
        local = [f for f in matched if isinstance(f, Path)]
        if local and not empty_ok and not any(map(_holds_records, local)):
            raise ValueError(f"{text}: empty, no records to read" if local == [Path(text)] else
                             f"{text}: its {len(local)} data file(s) are empty, no records to read")
        for file in matched:
            where = file if isinstance(file, str) else os.path.realpath(file)
            if where in files:
                raise ValueError(f"{file} is among the inputs twice (from {files[where][1]} and from {text}); "
                                 "name each input once")
            files[where] = (file, text)
    return [file for file, _ in files.values()]


def _holds_records(path: Path) -> bool:
    """Whether a local data file has anything to read: rows (Parquet), or more than whitespace and
    an empty JSON array once decompressed (a damaged file is the reader's to name)."""
    if path.stat().st_size == 0:
        return False
    if split_suffixes(path)[0] == ".parquet":
        import pyarrow
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(path).num_rows > 0
        except pyarrow.ArrowInvalid as e:
            raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    seen = b""
    with decompression_errors(path), open_binary(path) as stream:
        for block in blocks(stream, head_without_bom(stream)):
            seen += block.translate(None, b" \t\r\n")
            if len(seen) > 2:
                return True
    return seen not in (b"", b"[]")
