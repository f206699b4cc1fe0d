"""Process hygiene: workers die with their run (even a SIGKILLed one), and one run per output directory."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import zstandard

from fuelline.clean.stage import CleanStage
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage

from ..conftest import shared_file
from .test_executor import data_files

SUBSET = 100_000  # poems: a few seconds per command on 2 workers, long enough to be killed mid-run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first poems of the real corpus (raw), and the same cleaned."""
    base = tmp_path_factory.mktemp("lifetime")
    raw = base / "poems.jsonl.zst"
    with zstandard.ZstdCompressor().stream_writer(open(raw, "wb")) as f:
        for _, record in zip(range(SUBSET), read_records(shared_file("chinese-poetry.jsonl.zst"))):
            f.write(orjson.dumps(record) + b"\n")
    cleaned = base / "cleaned"
    run_stage(CleanStage(), [raw], cleaned, RunOptions(workers=2, progress=False))
    return raw, cleaned


def fuelline(*args: str) -> list[str]:
    return [sys.executable, "-m", "fuelline.cli", *args]


def children(pid: int) -> list[int]:
    found = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(k) for k in listing.read_text().split()]
        except OSError:
            pass
    return found


def descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            found.append(child)
            queue.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_mid_run(command: list[str], done_marker: Path) -> list[int]:
    """Start `command`, SIGKILL only its main process once two workers run; return the descendants it had."""
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(descendants(proc.pid)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no workers started"
        time.sleep(0.05)
    time.sleep(0.5)  # the workers are at work
    family = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not done_marker.exists(), "the run finished before it was killed; the test needs a larger input"
    return family


def assert_all_gone(pids: list[int], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for p in left:  # leave no process behind, but fail
        os.kill(p, signal.SIGKILL)
    assert not left, f"still alive {within:g} s after their parent's SIGKILL: {left}"


def run(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


def stage_commands(corpus, tokenizer_dir, out: Path) -> dict[str, tuple[list[str], Path]]:
    raw, cleaned = corpus
    return {
        "clean": (fuelline("clean", "-i", str(raw), "-o", str(out), "-w", "2", "--shard-size", "5000", "-q"),
                  out / "stats.json"),
        "dedup": (fuelline("dedup", "-i", str(cleaned), "-o", str(out), "-w", "2", "--shard-size", "5000", "-q"),
                  out / "stats.json"),
        "pack": (fuelline("pack", "-i", str(cleaned), "--tokenizer", str(tokenizer_dir), "-o", str(out), "-w", "2",
                          "--threads", "1", "-q"), out / "stats.json"),
    }


@pytest.mark.parametrize("name", ["clean", "dedup", "pack"])
def test_sigkill_of_the_parent_ends_every_worker_and_a_resume_gives_the_same_bytes(name, corpus, tokenizer_dir,
                                                                                   tmp_path):
    reference, marker = stage_commands(corpus, tokenizer_dir, tmp_path / "reference")[name]
    run(reference)
    command, marker = stage_commands(corpus, tokenizer_dir, tmp_path / "out")[name]
    family = kill_mid_run(command, marker)
    assert_all_gone(family)
    run(command)
    assert data_files(tmp_path / "out") == data_files(tmp_path / "reference")


def test_sigkill_of_a_pipeline_ends_every_worker_and_a_resume_gives_the_same_bytes(corpus, tmp_path):
    raw, _ = corpus
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[defaults]\nworkers = 2\nshard_size = 5000\n\n[[stage]]\nuse = "clean"\n\n'
                        '[[stage]]\nuse = "dedup"\n')
    run(fuelline("run", str(pipeline), "-o", str(tmp_path / "reference"), "-i", str(raw), "-q"))
    command = fuelline("run", str(pipeline), "-o", str(tmp_path / "run"), "-i", str(raw), "-q")
    family = kill_mid_run(command, tmp_path / "run" / "02-dedup" / "stats.json")
    assert_all_gone(family)
    run(command)
    for stage in ("01-clean", "02-dedup"):
        resumed, reference = data_files(tmp_path / "run" / stage), data_files(tmp_path / "reference" / stage)
        assert resumed.keys() == reference.keys()
        for name in resumed:
            if name.startswith("_rejects/"):  # they name their source: the stage before, in each run directory
                same = rejects(resumed[name], tmp_path / "run") == rejects(reference[name], tmp_path / "reference")
            else:
                same = resumed[name] == reference[name]
            assert same, f"{stage}/{name} differs"


def rejects(data: bytes, run_dir: Path) -> list[dict]:
    lines = zstandard.ZstdDecompressor().decompressobj().decompress(data).splitlines()
    return [{**r, "source": r["source"].replace(str(run_dir), "RUN")} for r in map(orjson.loads, lines)]


def test_a_second_run_into_the_same_directory_is_refused_and_the_lock_dies_with_its_holder(corpus, tmp_path):
    raw, _ = corpus
    reference = tmp_path / "reference"
    run(fuelline("clean", "-i", str(raw), "-o", str(reference), "-w", "2", "--shard-size", "5000", "-q"))
    out = tmp_path / "out"
    command = fuelline("clean", "-i", str(raw), "-o", str(out), "-w", "2", "--shard-size", "5000", "-q")

    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (out / "_plan.json").exists():
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.05)
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert second.stderr.startswith(f"error: {out} is being written by another fuelline run (pid {first.pid}, started ")
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert data_files(out) == data_files(reference)

    again = tmp_path / "again"
    command = fuelline("clean", "-i", str(raw), "-o", str(again), "-w", "2", "--shard-size", "5000", "-q")
    assert_all_gone(kill_mid_run(command, again / "stats.json"))
    resumed = run(command)  # the kernel released the dead holder's lock
    assert "Traceback" not in resumed.stderr
    assert data_files(again) == data_files(reference)
