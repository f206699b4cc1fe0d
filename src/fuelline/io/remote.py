"""Inputs and outputs named by fsspec URLs: `s3://`, `gs://`, `file://`, `memory://`, …

Every reader of fuelline works on local files (pread, mmap, Parquet's random access), so a URL
input is fetched once into a per-machine cache and read there (`local_copy`); messages and
`_plan.json` still name the URL. A stage whose output is a URL writes into a local staging
directory and uploads each finished file (`RemoteDir.put`); see `fuelline.pipeline.executor`.
fsspec and a URL's backend (s3fs for s3://, …) are imported on first use.

The cache (`cache_root()`: `$FUELLINE_CACHE_DIR`, else `~/.cache/fuelline`) holds, under
`remote/`, one copy per input URL, named by a hash of the URL and by the size and version (ETag,
generation or mtime, whichever the backend reports): a changed remote file is fetched again and
its older copy removed. A copy is written to a temp name and renamed, so processes of one machine
that fetch the same file at once are safe, and each node of a cluster fetches what its shards read.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from fuelline.io.atomic import is_temp_name, naming_disk_full, temp_name

URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")  # a one-letter scheme would be a Windows drive
# What a backend reports as a file's version, most specific first (S3, GCS, Azure, local, memory).
VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "version_id", "mtime", "LastModified", "last_modified",
                "updated", "created")
# Backends whose upload of an object becomes visible whole, at once: no temp name is needed.
ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "memory"}
REMOTE_CACHE, STAGING = "remote", "staging"


def is_url(text: str | os.PathLike) -> bool:
    """Whether `text` is `SCHEME://…` (a `Path` never is: it collapses `//` into `/`)."""
    return isinstance(text, str) and URL.match(text) is not None


def cache_root() -> Path:
    """fuelline's per-machine cache directory: `$FUELLINE_CACHE_DIR`, else `~/.cache/fuelline`."""
    env = os.environ.get("FUELLINE_CACHE_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fuelline"


def url_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:24]


def refuse_url(path: str | os.PathLike, what: str) -> None:
    """Raise unless `path` is local: `what` (e.g. "pack") writes local files only."""
    if is_url(path):
        raise ValueError(f"{what} writes to a local directory; {path} is a URL (stage outputs may be URLs: "
                         "docs/io.md, \"Object storage and other URLs\")")


def filesystem(url: str):
    """(fsspec filesystem, path within it) of `url`; a missing or unknown backend is a one-line error."""
    protocol = URL.match(url).group(1)
    try:
        from fsspec.core import url_to_fs
        from fsspec.registry import known_implementations
    except ImportError:
        raise RuntimeError(f"{url}: URLs need fsspec: pip install fsspec") from None
    try:
        return url_to_fs(url)
    except ImportError as e:
        package = known_implementations.get(protocol, {}).get("class", "").split(".")[0] or "its fsspec backend"
        raise RuntimeError(f"{url}: {protocol}:// needs the package {package}, which is not installed: "
                           f"pip install {package} ({e})") from None
    except ValueError:
        if protocol not in known_implementations:
            raise ValueError(f"{url}: unknown URL protocol {protocol}://; fsspec has no backend by that name "
                             "(s3:// needs s3fs, gs:// needs gcsfs, az:// needs adlfs)") from None
        raise


def canonical(url: str) -> str:
    """`url` as its filesystem writes it (`memory://a` and `memory:///a` are one file)."""
    fs, path = filesystem(url)
    return fs.unstrip_protocol(path)


def file_version(info: dict) -> str:
    """What changes when a remote file is rewritten, as its backend reports it."""
    return next((str(info[k]) for k in VERSION_KEYS if info.get(k) is not None), "")


def _file_info(url: str):
    fs, path = filesystem(url)
    info = fs.info(path)
    if info["type"] != "file":
        raise IsADirectoryError(f"{url}: is a directory, not a file")
    return fs, path, info


def describe_url(url: str) -> dict:
    """Identity of a URL input for the resume check: the URL, its size and its version."""
    _, _, info = _file_info(url)
    return {"path": url, "size": info["size"], "version": file_version(info)}


def local_copy(url: str) -> Path:
    """A local copy of the file at `url`, fetched once per version into the cache, then reused."""
    fs, path, info = _file_info(url)
    folder = cache_root() / REMOTE_CACHE / url_hash(fs.unstrip_protocol(path))
    version = url_hash(f"{info['size']}\0{file_version(info)}")
    target = folder / f"{version}-{path.rstrip('/').rsplit('/', 1)[-1]}"  # keeps the suffixes: the format
    if target.is_file() and target.stat().st_size == info["size"]:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / temp_name(target.name)
    try:
        with naming_disk_full(target):
            fs.get_file(path, os.fspath(temp))
        if temp.stat().st_size != info["size"]:
            raise RuntimeError(f"{url}: fetched {temp.stat().st_size:,} bytes where {info['size']:,} were listed; "
                          "did it change while being read? Run again")
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    for old in folder.iterdir():  # copies of earlier versions (a temp file is another fetch under way)
        if old != target and not is_temp_name(old.name):
            old.unlink(missing_ok=True)
    return target


def staging_dir(url: str) -> Path:
    """The local directory a stage writes into before its files go up to output `url`."""
    return cache_root() / STAGING / url_hash(canonical(url))


class RemoteDir:
    """A directory named by a URL: list, read, upload and delete its files by relative name.

    Picklable (for worker processes and Ray tasks): the filesystem is opened where it is used.
    """

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._opened = None  # (filesystem, path of the directory in it)

    def __getstate__(self):
        return {"url": self.url, "_opened": None}

    def _open(self):
        if self._opened is None:
            fs, path = filesystem(self.url)
            self._opened = fs, path.rstrip("/")
        return self._opened

    def _full(self, name: str) -> str:
        return f"{self._open()[1]}/{name}"

    def sizes(self) -> dict[str, int]:
        """{relative name: size} of every file under the directory now (one recursive listing)."""
        fs, path = self._open()
        fs.invalidate_cache(path)  # other processes may have written since the last listing
        try:
            found = fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        prefix = len(path) + 1
        return {name[prefix:]: info["size"] for name, info in found.items()
                if info["type"] == "file" and len(name) > prefix}

    def read(self, names: list[str]) -> dict[str, bytes]:
        """The contents of the files `names` (fetched together), by name."""
        if not names:
            return {}
        fetched = self._open()[0].cat([self._full(n) for n in names])
        return {name: fetched[self._full(name)] for name in names}

    def put(self, local: Path, name: str) -> None:
        """Upload `local` as `name`: it appears whole or not at all (through a temp name and a move
        where the backend could show a half-written file, as a local file system would)."""
        fs, target = self._open()[0], self._full(name)
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        if ATOMIC_PUT.intersection(protocols):
            fs.put_file(os.fspath(local), target)
            return
        parent, _, base = target.rpartition("/")
        fs.makedirs(parent, exist_ok=True)
        temp = f"{parent}/{temp_name(base)}"
        fs.put_file(os.fspath(local), temp)
        fs.mv(temp, target)

    def remove(self, names: list[str]) -> None:
        if names:
            self._open()[0].rm([self._full(n) for n in names])
