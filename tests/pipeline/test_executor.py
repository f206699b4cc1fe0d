import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
import zstandard

from fuelline.io import read_records
from fuelline.pipeline.workdir import StepOutputMismatch
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.pipeline.stage import Stage
from fuelline.records import Drop

from ..conftest import shared_file

SLOW_STAGE_SCRIPT = textwrap.dedent("""
    import sys, time
    from fuelline.pipeline.executor import RunOptions, run_stage
    from fuelline.pipeline.stage import Stage
    from fuelline.records import Drop

    class SlowFilter(Stage):
        name = "slow_filter"

        def apply(self, record, location):
            time.sleep(0.0004)
            if "12" in record["answer"]:
                return Drop("mentions_12")
            return {"q": record["question"], "where": location.line}

    if __name__ == "__main__":
        source, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
        run_stage(SlowFilter(), source, out, RunOptions(workers=workers, shard_size=500, progress=False))
""")


def data_files(directory: Path) -> dict[str, bytes]:
    """Every output file of a stage directory except the timing-bearing bookkeeping."""
    timed = {"stats.json", "_plan.json", "summary.json"}  # summary.json: dedup's decision, with its seconds
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in timed and "_done" not in p.parts}


def run_script(script: Path, source: Path, out: Path, workers: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), str(source), str(out), str(workers)],
                            start_new_session=True, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The slow stage run once, uninterrupted, on one worker."""
    source = shared_file("chat/gsm8k-train.jsonl.zst")
    base = tmp_path_factory.mktemp("reference")
    script = base / "slow_stage.py"
    script.write_text(SLOW_STAGE_SCRIPT)
    out = base / "out"
    proc = run_script(script, source, out, 1)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    return script, source, out


def test_output_bytes_do_not_depend_on_the_number_of_workers(reference, tmp_path):
    script, source, out = reference
    proc = run_script(script, source, tmp_path / "two", 2)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    expected = data_files(out)
    assert len([n for n in expected if n.startswith("part-")]) == 15  # 7,473 lines in shards of 500
    assert data_files(tmp_path / "two") == expected
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["records_in"] == 7_473
    assert stats["records_in"] == stats["records_out"] + sum(stats["dropped"].values())
    assert stats["dropped"]["mentions_12"] == sum(1 for r in read_records(out / "_rejects"))


def test_sigkill_halfway_then_resume_gives_identical_bytes(reference, tmp_path):
    script, source, expected_dir = reference
    out = tmp_path / "out"
    proc = run_script(script, source, out, 2)
    deadline = time.time() + 60
    while len(list((out / "_done").glob("*.json"))) < 4:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.3)  # let orphaned workers see that their parent died
    done = {p.stem for p in (out / "_done").glob("*.json")}
    assert not (out / "stats.json").exists() and 4 <= len(done) < 15

    # What a crash can leave: a truncated temp file, and a truncated part file with no marker.
    unfinished = sorted({f"part-{k:05d}" for k in range(15)} - done)
    (out / f".{unfinished[0]}.jsonl.zst.tmp-999-dead").write_bytes(b"\x28\xb5\x2f\xfd truncated")
    full = (expected_dir / f"{unfinished[-1]}.jsonl.zst").read_bytes()
    (out / f"{unfinished[-1]}.jsonl.zst").write_bytes(full[: len(full) // 2])

    proc = run_script(script, source, out, 2)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    assert data_files(out) == data_files(expected_dir)
    assert not list(out.rglob("*.tmp-*"))
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["resumed_shards"] >= len(done) - 2  # workers may have finished more after the kill


def test_a_finished_marker_with_a_damaged_part_file_is_redone(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": f"record {i}"}) + b"\n" for i in range(30)))
    out = tmp_path / "out"

    class Copy(Stage):
        name = "copy"

        def apply(self, record, location):
            return record

    options = RunOptions(workers=1, shard_size=10, progress=False)
    run_stage(Copy(), source, out, options)
    good = (out / "part-00001.jsonl.zst").read_bytes()
    (out / "part-00001.jsonl.zst").write_bytes(good[:-5])
    stats = run_stage(Copy(), source, out, options)
    assert stats["resumed_shards"] == 2
    assert (out / "part-00001.jsonl.zst").read_bytes() == good


class KeepLong(Stage):
    name = "keep_long"

    def apply(self, record, location):
        return record if len(record["text"]) > 8 else Drop("short")


def test_other_options_or_inputs_are_refused_unless_restart(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "long enough text"}\n{"text": "short"}\n')
    out = tmp_path / "out"
    first = run_stage(KeepLong(), source, out, RunOptions(workers=1, progress=False))
    assert (first["records_out"], first["dropped"]) == (1, {"short": 1})
    with pytest.raises(StepOutputMismatch, match="different shard_size"):
        run_stage(KeepLong(), source, out, RunOptions(workers=1, shard_size=1, progress=False))
    again = run_stage(KeepLong(), source, out, RunOptions(workers=1, shard_size=1, restart=True, progress=False))
    assert again["shards"] == 2 and again["resumed_shards"] == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("not a stage output")
    with pytest.raises(StepOutputMismatch, match="not a fuelline stage output"):
        run_stage(KeepLong(), source, tmp_path / "other", RunOptions(workers=1, progress=False))


def test_a_worker_error_stops_the_run_naming_file_and_line(tmp_path):
    source = tmp_path / "in.jsonl.zst"
    lines = [b'{"text": "fine text here"}'] * 20
    lines[13] = b'{"text": '
    source.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines)))
    with pytest.raises(ValueError, match=rf"{source}:14: invalid JSON"):
        run_stage(KeepLong(), source, tmp_path / "out", RunOptions(workers=2, shard_size=5, progress=False))
    # One worker, in this process: what is skipped is counted alike (the error above crossed from a worker).
    skipped = run_stage(KeepLong(), source, tmp_path / "skip",
                        RunOptions(workers=1, shard_size=5, on_error="skip", progress=False))
    assert skipped["dropped"] == {"malformed_json": 1}
    assert skipped["records_in"] == 20 and skipped["records_out"] == 19


def test_workers_far_above_the_shards_are_capped_once_on_stderr_and_change_no_byte(tmp_path):
    source = tmp_path / "poems.jsonl"
    with source.open("wb") as f:
        for i, record in enumerate(read_records(shared_file("chinese-poetry.jsonl.zst"))):
            if i == 600:
                break
            f.write(orjson.dumps(record) + b"\n")
    outputs = {}
    for workers in (1, 64):
        out = tmp_path / f"w{workers}"
        done = subprocess.run([sys.executable, "-m", "fuelline", "clean", "-i", source.name, "-o", out.name,
                               "--profile", "poetry", "--shard-size", "200", "-w", str(workers), "-q"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs[workers] = (data_files(out), done.stderr)
    assert outputs[64][1].count("--workers 64: using 3 (the input has 3 shards)") == 1, outputs[64][1]
    assert "--workers" not in outputs[1][1]
    assert outputs[64][0] == outputs[1][0] and len(outputs[1][0]) > 3


def test_workers_are_capped_by_the_memory_they_would_need(capsys):
    options = RunOptions(workers=8)
    assert options.resolved_workers(100, worker_bytes=1 << 60) == 1
    assert "--workers 8: using 1 (" in capsys.readouterr().err
    assert RunOptions().resolved_workers(100, worker_bytes=1 << 60) == 1  # the default too, silently
    assert capsys.readouterr().err == ""
