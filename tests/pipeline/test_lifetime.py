"""Process hygiene: workers die with their run (even a SIGKILLed one), and one run per output directory.

A run that is killed is a real process, SIGKILLed once its two workers have finished some work. The
resumes (the same commands) and the uninterrupted runs they are compared with run in this process
(`CliRunner`), the latter on one worker: the number of workers changes no byte (test_executor.py).
"""

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import zstandard
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.io import read_records

from ..conftest import shared_file
from .test_executor import data_files

SUBSET = 20_000  # poems: eight shards of 2,500 per stage, so a run is killed with most of its shards still to do
SHARDS = ["--shard-size", "2500"]


def fuelline(*args: str) -> list[str]:
    return [sys.executable, "-m", "fuelline.cli", *args]


def invoke(command: list[str], *more: str):
    """`command` (a `fuelline(...)` list), with `more` options, run to its end in this process; it must succeed."""
    result = CliRunner().invoke(main, [*command[3:], *more])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first poems of the real corpus (raw), and the same cleaned by the `clean` command of these tests
    (also the uninterrupted reference of that command)."""
    base = tmp_path_factory.mktemp("lifetime")
    raw = base / "poems.jsonl.zst"
    with zstandard.ZstdCompressor().stream_writer(open(raw, "wb")) as f:
        for _, record in zip(range(SUBSET), read_records(shared_file("chinese-poetry.jsonl.zst"))):
            f.write(orjson.dumps(record) + b"\n")
    cleaned = base / "cleaned"
    invoke(clean_command(raw, cleaned), "-w", "1")
    return raw, cleaned


def clean_command(raw: Path, out: Path) -> list[str]:
    return fuelline("clean", "-i", str(raw), "-o", str(out), "-w", "2", *SHARDS, "-q")


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


def kill_mid_run(command: list[str], progress: Path, done_marker: Path) -> list[int]:
    """Start `command`; once it has two workers and a file matches the glob `progress` (work they
    finished), SIGKILL only its main process. Returns the descendants it had then."""
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 100
        while len(family := descendants(proc.pid)) < 2 or not glob.glob(str(progress)):
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, f"no progress ({progress}) with two workers"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    except BaseException:  # leave no process behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
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


def stage_command(name: str, corpus, tokenizer_dir, out: Path) -> tuple[list[str], Path]:
    """The command of stage `name` into `out`, and the glob of the files that say its workers made progress."""
    raw, cleaned = corpus
    if name == "clean":
        return clean_command(raw, out), out / "_done" / "*.json"
    if name == "dedup":
        return (fuelline("dedup", "-i", str(cleaned), "-o", str(out), "-w", "2", *SHARDS, "-q"),
                out / "_prepare" / "shards" / "*" / "done.json")  # a shard hashed
    return (fuelline("pack", "-i", str(cleaned), "--tokenizer", str(tokenizer_dir), "-o", str(out), "-w", "2",
                     "--threads", "1", *SHARDS, "-q"), out / "_work" / "part-*.json")  # a shard tokenized


@pytest.mark.parametrize("name", [
    "clean",
    # The same guarantee for the other stages' own resume paths (dedup's corpus-level prepare, pack's
    # shard arrays); the default suite kills dedup inside the pipeline test below, and
    # tests/pack/test_pack.py resumes an interrupted pack.
    pytest.param("dedup", marks=pytest.mark.slow),
    pytest.param("pack", marks=pytest.mark.slow),
])
def test_sigkill_of_the_parent_ends_every_worker_and_a_resume_gives_the_same_bytes(name, corpus, tokenizer_dir,
                                                                                   tmp_path):
    if name == "clean":
        reference = corpus[1]
    else:
        reference = tmp_path / "reference"
        invoke(stage_command(name, corpus, tokenizer_dir, reference)[0], "-w", "1")
    out = tmp_path / "out"
    command, progress = stage_command(name, corpus, tokenizer_dir, out)
    assert_all_gone(kill_mid_run(command, progress, out / "stats.json"))
    resumed = invoke(command)  # the kernel released the dead holder's lock on the output directory
    assert "Traceback" not in resumed.stderr
    assert data_files(out) == data_files(reference)


def test_sigkill_of_a_pipeline_ends_every_worker_and_a_resume_gives_the_same_bytes(corpus, tmp_path):
    """Killed in its second step, dedup, while it hashes: the resume keeps the finished first step."""
    raw, _ = corpus
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[defaults]\nworkers = 2\nshard_size = 2500\n\n[[step]]\nuse = "clean"\n\n'
                        '[[step]]\nuse = "dedup"\n')
    invoke(fuelline("run", str(pipeline), "-o", str(tmp_path / "reference"), "-i", str(raw), "-q"), "-w", "1")
    command = fuelline("run", str(pipeline), "-o", str(tmp_path / "run"), "-i", str(raw), "-q")
    family = kill_mid_run(command, tmp_path / "run" / "02-dedup" / "_prepare" / "shards" / "*" / "done.json",
                          tmp_path / "run" / "02-dedup" / "stats.json")
    assert_all_gone(family)
    invoke(command)
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


def test_a_second_run_into_the_same_directory_is_refused_and_the_first_finishes(corpus, tmp_path):
    """The second run is this process, so it asks for the lock moments after the first took it. (That
    the lock dies with its holder: the SIGKILL tests above resume into the killed run's directory.)"""
    raw, reference = corpus
    out = tmp_path / "out"
    command = clean_command(raw, out)
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (out / "_plan.json").exists():
            assert first.poll() is None, first.stderr.read()
            time.sleep(0.02)
        second = CliRunner().invoke(main, command[3:])
        assert second.exit_code == 2 and "Traceback" not in second.stderr
        assert second.stderr.startswith(f"error: {out} is being written by another fuelline run (pid {first.pid}, "
                                        "started ")
        assert first.wait(timeout=100) == 0, first.stderr.read()
    finally:
        first.kill()  # a no-op once it has ended
        first.wait()
    assert data_files(out) == data_files(reference)


def interrupt_mid_run(command: list[str], progress: Path | None) -> subprocess.CompletedProcess:
    """Start `command` in a process group of its own, SIGINT on; once it has two workers and a file
    matches `progress` (None: at once, while they start), send SIGINT to the whole group, as Ctrl-C
    in a terminal does."""
    def as_in_a_terminal():
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # this process may have been started with it ignored

    proc = subprocess.Popen(command, preexec_fn=as_in_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 100
        while len(descendants(proc.pid)) < 2 or (progress is not None and not glob.glob(str(progress))):
            assert proc.poll() is None, f"the run ended before Ctrl-C: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, f"no progress ({progress}) with two workers"
            time.sleep(0.02)
        if progress is None:
            time.sleep(0.3)  # the workers are importing what they run
        family = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    assert_all_gone(family)
    return subprocess.CompletedProcess(command, proc.returncode, out.decode(), err.decode())


# Workers importing is where a traceback leaked; mid-run interrupts are the slow part's variations.
@pytest.mark.parametrize(("name", "when"), [("clean", "starting"),
                                            pytest.param("clean", "working", marks=pytest.mark.slow),
                                            pytest.param("dedup", "working", marks=pytest.mark.slow)])
def test_ctrl_c_of_a_run_with_workers_is_one_line_and_the_same_command_resumes(name, when, corpus, tokenizer_dir,
                                                                               tmp_path):
    out = tmp_path / "out"
    command, progress = stage_command(name, corpus, tokenizer_dir, out)
    interrupted = interrupt_mid_run(command, progress if when == "working" else None)
    assert (interrupted.returncode, interrupted.stderr) == (130, "interrupted: run the same command again to resume\n")
    if name == "clean":
        invoke(command)
        assert data_files(out) == data_files(corpus[1])
