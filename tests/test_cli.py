import subprocess
import sys

import orjson
import zstandard


def fuelline(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fuelline.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_help_lists_only_working_commands():
    result = fuelline("--help")
    assert result.returncode == 0
    section = result.stdout.split("Commands:")[1].splitlines()
    listed = [line.split()[0] for line in section if line.startswith("  ") and line[2] != " "]  # not wrapped help
    assert listed == ["boilerplate", "chat", "clean", "dedup", "demo", "export", "ingest", "inspect", "pack", "report", "run",
                      "serve", "tokenizer", "verify"]
    for command in listed:  # each one builds and documents its options
        assert fuelline(command, "--help").returncode == 0


def test_malformed_input_exits_2_with_file_and_line(tmp_path):
    source = tmp_path / "in.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ok"}\n{"text": oops}\n'))
    result = fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "out"), "-q")
    assert result.returncode == 2
    assert f"error: {source}:2: invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_runs_the_whole_pipeline_and_reports_every_drop(tmp_path):
    result = fuelline("demo", "--dir", str(tmp_path), "--workers", "2")
    assert result.returncode == 0, result.stderr
    clean = orjson.loads((tmp_path / "run" / "01-clean" / "stats.json").read_bytes())
    assert clean["dropped"]["malformed_json"] == 1 and clean["dropped"]["malformed_record"] == 1
    assert {"missing_character", "placeholder_circle", "composed_character", "empty_poem"} <= set(clean["dropped"])
    dedup = orjson.loads((tmp_path / "run" / "03-dedup" / "stats.json").read_bytes())
    assert dedup["dropped"]["exact_duplicate"] >= 300 and dedup["dropped"]["near_duplicate"] > 0
    boilerplate = orjson.loads((tmp_path / "run" / "02-boilerplate" / "stats.json").read_bytes())
    assert boilerplate["counters"]["boilerplate_lines_removed"] > 500  # the footer of half the ci
    assert "exact_duplicate" in result.stdout and "TokenDataset" in result.stdout
    assert (tmp_path / "run" / "05-pack" / "train" / "manifest.json").exists()
    again = fuelline("demo", "--dir", str(tmp_path))  # a second demo in the same place works too
    assert again.returncode == 0, again.stderr
