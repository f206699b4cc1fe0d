"""Atomic file writes: a reader never sees a half-written file under its final name.

Every file goes to a hidden temp name in the same directory, is fsynced, then renamed over the
final name, and the directory entry is fsynced too. A crash leaves at most a `.NAME.tmp-*` file,
which directory listings of fuelline ignore and the stage runner deletes on resume.

A full disk is reported as `DiskFull`, naming the file that was being written (its final name):
the temp file is removed, what was committed before stays, and running the same command again
once there is space resumes.
"""

from __future__ import annotations

import errno
import io
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, NoReturn

import orjson

TEMP_MARK = ".tmp-"
# numpy's tofile (np.save to a real file) reports a full disk as a short write, with no errno.
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


class DiskFull(OSError):
    """No space left on the device while writing `path`; the message says how to go on."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        super().__init__(errno.ENOSPC, f"no space left on device while writing {self.path}; "
                                       "free space and re-run the same command to resume", self.path)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # travels intact from a worker process to the parent
        return type(self), (self.path,)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` says the disk is full: ENOSPC, or a short write that reports no errno."""
    if not isinstance(error, OSError):
        return False
    if error.errno == errno.ENOSPC:
        return True
    return error.errno is None and bool(_SHORT_WRITE.fullmatch(str(error)))


# OS errors that mean "nothing can be written there", in words; a full disk (or quota) is `DiskFull`'s.
CANNOT_WRITE = {errno.EROFS: "read-only file system: choose an output location that can be written",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


def write_refusal(error: BaseException) -> str | None:
    """The one-line message of an OS error that says the place cannot be written (full, over quota,
    read-only, not permitted), naming the path; None for any other error (a bug keeps its traceback)."""
    if not isinstance(error, OSError):
        return None
    path = error.filename or "the output"
    if isinstance(error, DiskFull):
        return str(error)
    if is_disk_full(error):
        return DiskFull(path).strerror
    if error.errno == errno.EDQUOT:
        return f"disk quota exceeded while writing {path}; free space and re-run the same command to resume"
    if error.errno in CANNOT_WRITE:
        return f"{path}: {CANNOT_WRITE[error.errno]}"
    return None


def reraise_naming(error: BaseException, path: str | os.PathLike) -> NoReturn:
    """Raise `error` again, as `DiskFull(path)` if it says the disk is full and names no file yet.

    From an `except` clause: hot write paths avoid `naming_disk_full`'s context manager per write.
    """
    if isinstance(error, DiskFull) or not is_disk_full(error):
        raise error
    raise DiskFull(path) from error


@contextmanager
def naming_disk_full(path: str | os.PathLike) -> Iterator[None]:
    """Turn a disk-full error raised inside the block into `DiskFull(path)`."""
    try:
        yield
    except OSError as e:
        reraise_naming(e, path)


def temp_name(name: str) -> str:
    """The hidden name a file called `name` is written under until it is complete."""
    return f".{name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _TempFile(io.BufferedWriter):
    """The temp file of an AtomicFile, a plain buffered file whose disk-full errors name the final path."""

    def __init__(self, temp_path: Path, final_path: Path):
        super().__init__(io.FileIO(temp_path, "wb"))
        self.final_path = final_path

    def write(self, data) -> int:
        try:
            return super().write(data)
        except OSError as e:
            reraise_naming(e, self.final_path)

    def flush(self) -> None:  # also what close() calls
        try:
            super().flush()
        except OSError as e:
            reraise_naming(e, self.final_path)


class AtomicFile:
    """A binary file open under a temp name until `commit()` moves it to its final path."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.temp_path = self.path.with_name(temp_name(self.path.name))
        with naming_disk_full(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file: IO[bytes] = _TempFile(self.temp_path, self.path)

    def commit(self, finish: Callable[[], None] | None = None) -> None:
        """Call `finish` (what a writer still buffers goes into the file), then move the file to its
        final name; if that fails (a full disk), the temp file is removed."""
        try:
            with naming_disk_full(self.path):
                if finish is not None:
                    finish()
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
                os.replace(self.temp_path, self.path)
        except BaseException:
            self.abort()
            raise
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        try:
            self.file.close()  # flushes what is buffered; on a full disk that fails, and does not matter
        except OSError:
            pass
        finally:
            self.temp_path.unlink(missing_ok=True)


class CommitOnExit:
    """A context manager for an atomic output with `close()` (commit) and `abort()` (remove): leaving
    the block normally commits, an exception removes."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Write a binary file atomically: committed on clean exit, removed on any exception.

    A disk-full error inside the block (numpy's np.save included) becomes `DiskFull(path)`.
    """
    target = AtomicFile(path)
    try:
        yield target.file
    except BaseException as e:
        target.abort()
        reraise_naming(e, target.path)
    target.commit()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path) as f:
        f.write(data)


def remove_temp_files(directory: Path) -> int:
    """Delete temp files left by a crashed writer under `directory`; return how many."""
    removed = 0
    for p in directory.rglob(f".*{TEMP_MARK}*"):
        if p.is_file():
            p.unlink()
            removed += 1
    return removed


def run_once(marker: Path, work: Callable[[], dict]) -> dict:
    """`work()` unless an earlier run finished it: its marker, written last, holds what it returned.

    For the tasks of a corpus-level pass, so that an interrupted pass redoes only unfinished ones.
    """
    if marker.exists():
        return orjson.loads(marker.read_bytes())
    result = work()
    write_bytes_atomic(marker, orjson.dumps(result))
    return result
