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
    assert listed == ["boilerplate", "clean", "dedup", "demo", "export", "ingest", "inspect", "pack", "run",
                      "tokenizer", "verify"]
    for command in listed:  # each one builds and documents its options
        assert fuelline(command, "--help").returncode == 0


def test_malformed_input_exits_2_with_file_and_line(tmp_path):
    source = tmp_path / "in.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ok"}\n{"text": oops}\n'))
    result = fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "out"), "-q")
    assert result.returncode == 2
    assert f"error: {source}:2: invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_runs_and_reports_every_drop(tmp_path):
    result = fuelline("demo", "--dir", str(tmp_path), "--workers", "2")
    assert result.returncode == 0, result.stderr
    stats = orjson.loads((tmp_path / "run" / "01-ingest" / "stats.json").read_bytes())
    assert stats["dropped"] == {"empty_text": 1, "malformed_json": 1, "too_short": 1}
    assert stats["records_in"] == stats["records_out"] + 3
    assert "malformed_json 1" in result.stdout
    again = fuelline("demo", "--dir", str(tmp_path))  # a second demo in the same place works too
    assert again.returncode == 0, again.stderr
