"""Issue 15, class 5: a full disk is one line naming the file, and the same command resumes.

It used to be a raw traceback (`OSError: 1599526 requested and 1155568 written`, `[Errno 28]`)
that named no file. Writes fail here on /dev/full (every write: ENOSPC) by pointing the temp
files of `fuelline.io.atomic` at it, and, where the tests run as root, on a real 200 KB tmpfs.
"""

import errno
import io
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import click
import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.io import (
    JsonlZstWriter,
    ParquetWriter,
    Rejects,
    atomic,
    atomic_write,
    read_records,
    write_bytes_atomic,
)
from fuelline.io.atomic import DiskFull, is_disk_full

MESSAGE = "no space left on device while writing {}; free space and re-run the same command to resume"


@pytest.fixture
def full_device(monkeypatch):
    """Every file written through fuelline.io.atomic from here on is written to /dev/full."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux) to fail writes with ENOSPC")
    monkeypatch.setattr(atomic, "io", types.SimpleNamespace(FileIO=lambda path, mode: io.FileIO("/dev/full", mode)))


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if atomic.is_temp_name(p.name)]


def _bytes(path):
    write_bytes_atomic(path, b"data")


def _npy(path):
    with atomic_write(path) as f:
        np.save(f, np.arange(1 << 20))


def _jsonl(path):
    with JsonlZstWriter(path) as writer:
        for i in range(100):
            writer.write({"n": i})


def _parquet(path):
    with ParquetWriter(path) as writer:
        writer.write({"n": 1})


def _rejects(path):
    rejects = Rejects(path)
    rejects.add("malformed_json", b"{oops", source="in.jsonl", line=1)
    rejects.close()


@pytest.mark.parametrize("write, name", [(_bytes, "stats.json"), (_npy, "a.npy"), (_jsonl, "part-00000.jsonl.zst"),
                                         (_parquet, "part-00000.parquet"), (_rejects, "_rejects/part-00000.jsonl.zst")])
def test_a_full_disk_names_the_file_being_written_and_keeps_earlier_files(tmp_path, request, write, name):
    earlier = tmp_path / "earlier.json"
    write_bytes_atomic(earlier, b"kept")
    request.getfixturevalue("full_device")
    target = tmp_path / name
    with pytest.raises(DiskFull) as error:
        write(target)
    assert str(error.value) == MESSAGE.format(target)
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(target)
    assert isinstance(error.value.__cause__, OSError) and error.value.__cause__.errno == errno.ENOSPC
    assert not target.exists() and temp_files(tmp_path) == []
    assert earlier.read_bytes() == b"kept"


def test_enospc_from_a_compressor_or_a_numpy_short_write_names_the_file(tmp_path):
    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")

    writer = JsonlZstWriter(tmp_path / "out.jsonl.zst")
    writer._stream = Full()
    with pytest.raises(DiskFull, match=r"no space left on device while writing .*out\.jsonl\.zst; free space"):
        writer.write({"a": 1})
    writer.abort()
    with (pytest.raises(DiskFull, match=r"while writing .*tokens\.npy; free space and re-run the same command"),
          atomic_write(tmp_path / "tokens.npy")):
        raise OSError("1599526 requested and 1155568 written")  # numpy's tofile on a full disk: no errno
    assert list(tmp_path.iterdir()) == []


def test_other_os_errors_are_not_taken_for_a_full_disk(tmp_path):
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EIO, "Input/output error"))
    assert not is_disk_full(OSError("something 1 requested and 2 written later"))
    assert not is_disk_full(ValueError("1599526 requested and 1155568 written"))
    with pytest.raises(OSError) as error, atomic_write(tmp_path / "x"):
        raise OSError(errno.EIO, "Input/output error")
    assert type(error.value) is OSError and list(tmp_path.iterdir()) == []


def test_disk_full_crosses_a_process_boundary_intact():
    # ProcessPoolExecutor pickles a worker's exception; the executor re-raises it in the parent.
    error = pickle.loads(pickle.dumps(DiskFull("/out/part-00003.jsonl.zst")))
    assert type(error) is DiskFull and error.path == "/out/part-00003.jsonl.zst"
    assert str(error) == MESSAGE.format("/out/part-00003.jsonl.zst") and error.errno == errno.ENOSPC


def invoke(*args: str):
    """The CLI in this process: what it prints and how it exits is all these tests look at."""
    return CliRunner().invoke(main, list(args))


def assert_disk_full_message(result, path):
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # the CLI's own exit: no exception escaped it
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: " + MESSAGE.format(path)


def test_cli_says_which_file_when_the_disk_is_full(tmp_path, full_device):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n')
    out = tmp_path / "out"
    result = invoke("ingest", "-i", str(source), "-o", str(out), "-q", "-w", "1")
    assert_disk_full_message(result, out / "_plan.json")


@click.command("fill")
@click.argument("kind")
def fill(kind):
    if kind == "named":
        raise OSError(errno.ENOSPC, "No space left on device", "/data/x.bin")
    if kind == "numpy":
        raise OSError("1599526 requested and 1155568 written")
    raise OSError(errno.EIO, "Input/output error")


def test_cli_turns_any_enospc_into_the_message(monkeypatch):
    monkeypatch.setitem(main.commands, "fill", fill)
    assert_disk_full_message(invoke("fill", "named"), "/data/x.bin")
    assert_disk_full_message(invoke("fill", "numpy"), "the output")
    # Not a full disk: a bug or a broken disk. The exception leaves the CLI, so Python prints its traceback.
    other = invoke("fill", "eio")
    assert other.exit_code == 1 and type(other.exception) is OSError and other.exception.errno == errno.EIO
    assert "Input/output error" in str(other.exception) and "error: " not in other.stderr
    debug = invoke("--debug", "fill", "named")
    assert type(debug.exception) is OSError and debug.exception.errno == errno.ENOSPC


# --- a real full disk: a 200 KB tmpfs (needs root) ------------------------------------------------

DISK_KB = 200  # about three of the seven compressed parts of web_corpus: the disk fills mid-run


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 200 KB tmpfs at tmp_path/disk and a function to resize it; skipped where mounting is not allowed."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_KB}k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)

    try:
        yield mount_point, resize
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def web_corpus(path: Path, records: int = 2_400) -> None:
    """About 1 MB of text the web rules keep (about 400 KB once compressed), and one malformed line."""
    import random

    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(5000)]
    stop = ["the", "and", "of", "to", "a", "in", "is", "that", "it", "with", "for", "as", "was", "on"]
    with open(path, "wb") as f:
        for i in range(records):
            text = "\n".join(" ".join(rng.choice(words) if rng.random() < 0.6 else rng.choice(stop)
                                      for _ in range(14)).capitalize() + "." for _ in range(5))
            f.write(orjson.dumps({"id": f"d{i}", "text": text}) + b"\n")
        f.write(b'{"text": oops}\n')


def fuelline(*args):
    return subprocess.run([sys.executable, "-m", "fuelline.cli", *args], capture_output=True, text=True, check=False)


def stage_files(directory: Path) -> dict[str, bytes]:
    """Data and rejects of a stage directory, by relative path."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("part-*"))
            if p.parent.name != "_done"}


def test_clean_on_a_full_disk_says_so_and_the_same_command_resumes_to_the_same_output(tmp_path, small_tmpfs):
    disk, resize = small_tmpfs
    source = tmp_path / "web.jsonl"
    web_corpus(source)
    options = ["--profile", "web", "--no-boilerplate", "--on-error", "skip", "--shard-size", "400", "-q"]
    reference = tmp_path / "reference"  # in this process: the number of workers changes no byte
    assert invoke("clean", "-i", str(source), "-o", str(reference), *options, "-w", "1").exit_code == 0
    options += ["-w", "2"]  # the full disk is met in a worker, and its error crosses to the parent

    out = disk / "out"
    full = fuelline("clean", "-i", str(source), "-o", str(out), *options)
    assert full.returncode == 2, full.stderr
    assert "Traceback" not in full.stderr
    (line,) = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: no space left on device while writing {out}/")
    assert line.endswith("; free space and re-run the same command to resume")
    finished = list((out / "_done").glob("*.json"))
    assert finished and not (out / "stats.json").exists()  # some shards were done before the disk filled

    resize("64m")
    again = fuelline("clean", "-i", str(source), "-o", str(out), *options)
    assert again.returncode == 0, again.stderr
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["resumed_shards"] == len(finished)
    assert stage_files(out) == stage_files(reference)
    expected = orjson.loads((reference / "stats.json").read_bytes())
    timing = {"wall_seconds", "seconds", "resumed_shards"}
    assert {k: v for k, v in stats.items() if k not in timing} == {k: v for k, v in expected.items() if k not in timing}
    assert temp_files(out) == []
    assert sum(1 for _ in read_records(out)) == expected["records_out"]
