"""The output lock: one run per output, and no `.NAME.lock` left behind by a run that ends."""

import fcntl
import os

import pytest

from fuelline.io import lock
from fuelline.io.lock import OutputBusy, exclusive_output, lock_path


def test_a_second_run_is_refused_naming_the_holder_and_the_lock_goes_with_the_run(tmp_path):
    out = tmp_path / "out"
    with exclusive_output(out):
        assert f"pid {os.getpid()}" in lock_path(out).read_text()
        with pytest.raises(OutputBusy, match=rf"being written by another fuelline run \(pid {os.getpid()}"):
            with exclusive_output(out):
                pass
        assert lock_path(out).exists()  # the refused run removes nothing of the holder's
    assert not lock_path(out).exists()
    with pytest.raises(RuntimeError, match="boom"):  # a run that fails ends too
        with exclusive_output(out):
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_locked_a_removed_lock_file_takes_the_new_one(tmp_path, monkeypatch):
    """The race of removing the file: a run opens it, the holder ends (removes it, unlocks), the run
    gets its lock on a file no longer at the path. It must see so and lock the path's file, or a
    third run creating a new file would hold the lock alongside it."""
    out, real_flock, calls = tmp_path / "out", fcntl.flock, []

    def holder_ends_first(fd, operation):
        if not calls:  # between this run's open and its flock, the holder removes the file and exits
            lock_path(out).unlink()
        calls.append(fd)
        return real_flock(fd, operation)

    lock_path(out).write_text("pid 1, started earlier\n")
    monkeypatch.setattr(lock.fcntl, "flock", holder_ends_first)
    with exclusive_output(out):
        assert len(calls) == 2  # retried once, on the new file
        assert lock_path(out).exists() and f"pid {os.getpid()}" in lock_path(out).read_text()
        with pytest.raises(OutputBusy):  # and that file is the one a third run meets locked
            with exclusive_output(out):
                pass
    assert not lock_path(out).exists()
