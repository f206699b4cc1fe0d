"""The Ray executor on a real Ray cluster (`ray start --head` on 127.0.0.1, 2 CPUs): the same bytes as
the local executor, retries of a killed worker, errors with their shard, resume across executors.

The cluster runs in a session of its own and is stopped by its process ids, never by `ray stop`
(which would stop every Ray process on the machine).
"""

import io
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import zstandard

from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.pipeline.ray_executor import SYSTEM_RETRIES
from fuelline.pipeline.stage import Stage, StageConfig
from fuelline.serve.processes import with_parent_death_signal

from ..conftest import ROOT, shared_file
from .test_executor import data_files

RAW_LINES = 3_000
SHARD = "500"  # six shards


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies hold nothing and cannot be killed)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp session
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def end_session(sid: int, grace: float) -> list[int]:
    """Wait up to `grace` s for session `sid` to end, then SIGKILL what is left; return what was left."""
    deadline = time.monotonic() + grace
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address():
    """A Ray head on 127.0.0.1 with 2 CPUs for this module; its address.

    This process stays connected to it meanwhile, as a program that calls `run_stage` may be: the
    runs in this process use that connection (`RayExecutor`), so they share one Ray job and its
    workers instead of starting a job each (seconds). The runs in processes of their own (the
    killed workers, a cluster of its own) connect, or start a cluster, as the command line does.
    """
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short (~107 bytes)
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",  # workers import the stages defined here
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = Path(temp) / "ray-start.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(with_parent_death_signal(  # SIGTERM if pytest itself dies: no cluster left behind
            [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(port), "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats",
             "--temp-dir", temp]), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in log.read_bytes():
            assert head.poll() is None, f"ray start failed:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"ray start did not start:\n{log.read_text()}"
            time.sleep(0.2)
        with warnings.catch_warnings():  # as RayExecutor: a tip about GPU visibility, which CPU tasks do not use
            warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
            ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level=logging.WARNING)
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        left = end_session(head.pid, grace=20)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes {left} outlived `ray start` and were killed"


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """The first few thousand raw poems, uncleaned."""
    path = tmp_path_factory.mktemp("raw") / "poems.jsonl"
    with shared_file("chinese-poetry.jsonl.zst").open("rb") as f:
        lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")
        path.write_text("".join(line for _, line in zip(range(RAW_LINES), lines)), encoding="utf-8")
    return path


def fuelline(*args: str):
    """The CLI in this process (a Ray driver here, like the pipeline tests below): only its output,
    exit code and message are looked at."""
    from click.testing import CliRunner

    from fuelline.cli import main  # not at the top: Ray's workers import this module for its stages

    return CliRunner().invoke(main, [*args, "-q"])


def run_ok(*args: str) -> str:
    result = fuelline(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


@pytest.fixture(scope="module")
def local_runs(raw, tokenizer_dir, tmp_path_factory):
    """clean, dedup and pack on the local executor: clean reads the raw poems, dedup the clean output,
    pack the dedup output (a Ray run reads the same inputs, since outputs record their input paths).
    One worker, in this process: the number of workers changes no byte (tests/pipeline/test_executor.py)."""
    base = tmp_path_factory.mktemp("local")
    run_ok("clean", "-i", str(raw), "-o", str(base / "clean"), "--shard-size", SHARD, "-w", "1")
    run_ok("dedup", "-i", str(base / "clean"), "-o", str(base / "dedup"), "--shard-size", SHARD, "-w", "1")
    run_ok("boilerplate", "-i", str(base / "clean"), "-o", str(base / "boilerplate"), "--shard-size", SHARD,
           "--min-doc-freq", "2", "--threshold", "0.3", "-w", "1")  # so that it removes lines (~330)
    run_ok("pack", "-i", str(base / "dedup"), "--tokenizer", str(tokenizer_dir), "-o", str(base / "pack"),
           "--shard-size", SHARD, "-w", "1")
    return base


def test_clean_dedup_and_pack_on_a_ray_cluster_write_the_local_bytes(ray_address, raw, tokenizer_dir, local_runs,
                                                                     tmp_path):
    on_ray = ["--executor", "ray", "--ray-address", ray_address]
    run_ok("clean", "-i", str(raw), "-o", str(tmp_path / "clean"), "--shard-size", SHARD, *on_ray)
    run_ok("dedup", "-i", str(local_runs / "clean"), "-o", str(tmp_path / "dedup"), "--shard-size", SHARD, *on_ray)
    run_ok("pack", "-i", str(local_runs / "dedup"), "--tokenizer", str(tokenizer_dir), "-o", str(tmp_path / "pack"),
           "--shard-size", SHARD, *on_ray)
    run_ok("boilerplate", "-i", str(local_runs / "clean"), "-o", str(tmp_path / "boilerplate"), "--shard-size", SHARD,
           "--min-doc-freq", "2", "--threshold", "0.3", *on_ray)  # line counts: a task per shard, merges by hash
    for step in ("clean", "dedup", "pack", "boilerplate"):
        expected = data_files(local_runs / step)
        assert data_files(tmp_path / step) == expected, step
    assert len([n for n in data_files(local_runs / "clean") if n.startswith("part-")]) == 6
    assert (local_runs / "dedup" / "_rejects").is_dir()  # dedup removed something: the comparison means it
    boilerplate = orjson.loads((local_runs / "boilerplate" / "stats.json").read_bytes())
    assert boilerplate["counters"]["boilerplate_lines_removed"] > 100  # and boilerplate removed lines


def test_decontaminate_on_a_ray_cluster_writes_the_local_bytes(ray_address, local_runs, tmp_path):
    """Its index is built once by the driver and read by every Ray worker; each shard's findings add up."""
    from fuelline.io import read_records

    against = tmp_path / "poems.jsonl"
    poems = [r["text"] for r in read_records(local_runs / "clean")][::300][:8]  # Chinese, found by characters
    against.write_bytes(b"".join(orjson.dumps({"text": p}) + b"\n" for p in poems))
    for where, extra in (("local", ["-w", "1"]), ("ray", ["--executor", "ray", "--ray-address", ray_address])):
        run_ok("decontaminate", "-i", str(local_runs / "clean"), "-o", str(tmp_path / where), "--against", str(against),
               "--shard-size", SHARD, *extra)
    assert data_files(tmp_path / "ray") == data_files(tmp_path / "local")
    stats = orjson.loads((tmp_path / "ray" / "stats.json").read_bytes())
    assert stats["decontaminate"]["sets"]["poems"]["items_found"] == len(poems)
    assert stats["dropped"]["contaminated"] >= len(poems)


def test_dedup_on_ray_reads_and_writes_urls(ray_address, local_runs, tmp_path):
    """file:// in and out on Ray: workers fetch their shards' inputs and upload their own parts."""
    out = tmp_path / "dedup"
    run_ok("dedup", "-i", (local_runs / "clean").as_uri(), "-o", out.as_uri(), "--shard-size", SHARD,
           "--executor", "ray", "--ray-address", ray_address)
    # Rejects name where each record came from (here a URL), and `_prepare/` stays in the staging
    # directory: the kept records and the audit compare.
    def kept(files):
        return {n: b for n, b in files.items() if not n.startswith(("_rejects/", "_prepare/"))}

    assert kept(data_files(out)) == kept(data_files(local_runs / "dedup"))
    assert "clusters.jsonl.zst" in kept(data_files(out)) and (out / "stats.json").is_file()


def test_a_run_begun_locally_is_finished_on_ray(ray_address, raw, local_runs, tmp_path):
    """The executor is no part of a stage's identity: Ray redoes only the shards without a marker."""
    out = tmp_path / "clean"
    shutil.copytree(local_runs / "clean", out)
    for part in ("part-00002", "part-00004"):
        (out / "_done" / f"{part}.json").unlink()
        (out / f"{part}.jsonl.zst").unlink()
    stdout = run_ok("clean", "-i", str(raw), "-o", str(out), "--shard-size", SHARD, "--executor", "ray",
                    "--ray-address", ray_address)
    assert "4 shard(s) resumed" in stdout
    assert data_files(out) == data_files(local_runs / "clean")


def test_a_pipeline_file_runs_its_steps_on_ray_and_the_command_line_may_say_local(ray_address, raw, tokenizer_dir,
                                                                                 tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(f"""
        [defaults]
        executor = "ray"
        ray_address = "{ray_address}"
        shard_size = {SHARD}

        [[step]]
        use = "clean"

        [[step]]
        use = "pack"
        tokenizer = "{tokenizer_dir}"
    """.replace("\n        ", "\n"))
    steps = load_pipeline(pipeline)
    assert {(s.run_options.executor, s.run_options.ray_address) for s in steps} == {("ray", ray_address)}
    on_ray = run_pipeline(steps, tmp_path / "ray", input=[str(raw)], progress=False)
    local = run_pipeline(steps, tmp_path / "local", input=[str(raw)], executor="local", workers=2, progress=False)
    assert data_files(tmp_path / "ray" / "01-clean") == data_files(tmp_path / "local" / "01-clean")
    for split in ("train", "val"):  # each manifest names its own input directory; the tokens are the same
        for name in ("tokens.bin", "docs.idx", "mask.bin"):
            assert (tmp_path / "ray" / "02-pack" / split / name).read_bytes() == \
                   (tmp_path / "local" / "02-pack" / split / name).read_bytes()
    assert on_ray[1]["splits"] == local[1]["splits"]


@dataclass
class KillConfig(StageConfig):
    deaths: str = ""  # a file with a line per death: the worker of shard 1 kills itself halfway while it has
    times: int = 1  # fewer lines than this


class KillInShard1(Stage):
    """Copies records; on Ray, its worker dies by SIGKILL halfway through shard 1, `times` times."""

    name = "kill_in_shard_1"
    Config = KillConfig

    def process(self, records, ctx):
        deaths = Path(self.config.deaths) if self.config.deaths else None
        for k, (location, record) in enumerate(records):
            if ctx.shard_id == 1 and k == 250 and deaths and len(_lines(deaths)) < self.config.times:
                with deaths.open("a") as f:
                    f.write(f"{os.getpid()}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            yield {"title": record.get("title"), "line": location.line}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_stage_in_a_child(stage, inputs, output, options, attempts: list) -> dict:
    """run_stage in a spawned process, so that an abort of Ray's driver fails this test, not the suite.

    Ray 2.52's driver can abort its whole process on an internal check when a worker is killed
    while its task's reply is in flight (task_manager.cc: "Tried to complete task that was not
    pending"; seen on a loaded machine). A fuelline run that ends so is resumed by running it
    again, so the test does that, once; `attempts` gets one entry per process started."""
    context = multiprocessing.get_context("spawn")
    while True:
        attempts.append(len(attempts) + 1)
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            try:
                return pool.submit(run_stage, stage, inputs, output, options).result()
            except BrokenProcessPool:
                if len(attempts) == 2:
                    raise


def test_a_task_whose_ray_worker_is_killed_is_retried_and_the_bytes_are_the_same(ray_address, raw, tmp_path):
    run_stage(KillInShard1(), raw, tmp_path / "local", RunOptions(workers=1, shard_size=int(SHARD), progress=False))
    deaths, attempts = tmp_path / "deaths", []
    options = RunOptions(shard_size=int(SHARD), progress=False, executor="ray", ray_address=ray_address)
    stats = run_stage_in_a_child(KillInShard1(KillConfig(deaths=str(deaths))), raw, tmp_path / "ray", options,
                                 attempts)
    assert len(_lines(deaths)) == 1  # a worker did die halfway through shard 1 (its temp files: see data_files)
    assert stats["records_out"] == RAW_LINES and (stats["resumed_shards"] == 0 or len(attempts) == 2)
    assert data_files(tmp_path / "ray") == data_files(tmp_path / "local")


def test_a_task_whose_worker_dies_every_time_is_reported_with_its_shard_after_the_retries(ray_address, raw,
                                                                                         tmp_path):
    deaths, attempts = tmp_path / "deaths", []
    options = RunOptions(shard_size=int(SHARD), progress=False, executor="ray", ray_address=ray_address)
    with pytest.raises(RuntimeError, match=rf"^shard part-00001 \({re.escape(str(raw))}, lines 501-1000\) did not "
                                           rf"finish on Ray after {SYSTEM_RETRIES} retries: "):
        run_stage_in_a_child(KillInShard1(KillConfig(deaths=str(deaths), times=99)), raw, tmp_path / "out", options,
                             attempts)
    died = len(_lines(deaths))  # a first run that Ray aborted may have seen only some of its retries
    assert died == 1 + SYSTEM_RETRIES if len(attempts) == 1 else died > 1 + SYSTEM_RETRIES
    assert not (tmp_path / "out" / "_done" / "part-00001.json").exists()


@dataclass
class FailConfig(StageConfig):
    attempts: str = ""  # a file that gets one line each time shard 2 starts


class FailInShard2(Stage):
    name = "fail_in_shard_2"
    Config = FailConfig

    def process(self, records, ctx):
        for location, record in records:
            if ctx.shard_id == 2:
                with open(self.config.attempts, "a") as f:
                    f.write("started\n")
                raise ValueError(f"{location.source}:{location.line}: not a poem")
            yield record


def test_an_error_in_a_shard_is_reported_at_once_with_its_shard(ray_address, raw, tmp_path):
    attempts = tmp_path / "attempts"
    options = RunOptions(shard_size=int(SHARD), progress=False, executor="ray", ray_address=ray_address)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(raw))}:1001: not a poem") as caught:
        run_stage(FailInShard2(FailConfig(attempts=str(attempts))), raw, tmp_path / "out", options)
    assert f"shard part-00002 ({raw}, lines 1001-1500)" in "\n".join(caught.value.__notes__)
    assert attempts.read_text() == "started\n"  # not retried


def test_bad_input_on_ray_is_one_error_line_naming_the_shard(ray_address, raw, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(raw.read_bytes().replace(b"\n", b"\n{oops\n", 1))  # line 2
    result = fuelline("clean", "-i", str(source), "-o", str(tmp_path / "out"), "--shard-size", SHARD,
                      "--executor", "ray", "--ray-address", ray_address)
    assert result.exit_code == 2, result.output
    assert f"error: {source}:2: invalid JSON" in result.stderr
    assert f"in the Ray task of shard part-00000 ({source}, lines 1-500)" in result.stderr
    assert "Traceback" not in result.stderr


# `fuelline run` with its ray.init counted, and whether Ray is still initialized once it returns.
COUNTED_RUN = """
import json, sys
import ray
from fuelline.cli import main
started, init = [], ray.init
ray.init = lambda *args, **kwargs: started.append(kwargs) or init(*args, **kwargs)
main(sys.argv[1:], standalone_mode=False)
print(json.dumps({"num_cpus": [kwargs.get("num_cpus") for kwargs in started], "initialized": ray.is_initialized()}))
"""


def test_a_pipeline_without_an_address_runs_on_one_ray_instance_of_its_own_that_ends_with_the_run(
        ray_address, raw, local_runs, tmp_path):
    """One instance for all the steps, with the run's workers as its CPUs, though a cluster is running
    (`ray_address`); a real process, so that what outlives it can be looked for."""
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(f'[defaults]\nexecutor = "ray"\nworkers = 2\nshard_size = {SHARD}\n\n'
                        '[[step]]\nuse = "clean"\n\n[[step]]\nuse = "dedup"\n')
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's files, instead of /tmp/ray
    command = subprocess.Popen([sys.executable, "-c", COUNTED_RUN, "run", str(pipeline), "-o", str(tmp_path / "run"),
                                "-i", str(raw), "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, "RAY_TMPDIR": temp})
    try:
        stdout, stderr = command.communicate(timeout=100)
    finally:
        # the Ray processes it started are in its session (its id is the command's process id); a
        # command that timed out is ended with them
        left = end_session(command.pid, grace=10)
        shutil.rmtree(temp, ignore_errors=True)
    assert command.returncode == 0, stderr
    assert left == []
    assert orjson.loads(stdout.splitlines()[-1]) == {"num_cpus": [2], "initialized": False}
    assert data_files(tmp_path / "run" / "01-clean") == data_files(local_runs / "clean")
    kept = [{n: b for n, b in data_files(d).items() if not n.startswith("_rejects/")}  # rejects name their input
            for d in (tmp_path / "run" / "02-dedup", local_runs / "dedup")]
    assert kept[0] == kept[1] and "clusters.jsonl.zst" in kept[0]


def test_without_ray_installed_the_error_names_the_extra(tmp_path, monkeypatch):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one"}\n')
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RuntimeError, match=r'the ray executor needs Ray: pip install -e "\.\[ray\]"'):
        run_stage(KillInShard1(), source, tmp_path / "out", RunOptions(progress=False, executor="ray"))
