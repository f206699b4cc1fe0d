"""The `fuelline` command line. Most tests run it in this process (click's CliRunner: the same
exit code and the same stdout and stderr, without a Python start each); a real `python -m
fuelline.cli` runs the demo and shows a traceback under --debug."""

import multiprocessing.spawn
import subprocess
import sys
import types

import click
import orjson
import pytest
import zstandard

from fuelline.cli import main

from .conftest import invoke_cli as fuelline


def fuelline_process(*args):
    """`fuelline ARGS` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "fuelline.cli", *args], capture_output=True, text=True)


def test_help_lists_only_working_commands():
    result = fuelline("--help")
    assert result.exit_code == 0
    section = result.stdout.split("Commands:")[1].splitlines()
    listed = [line.split()[0] for line in section if line.startswith("  ") and line[2] != " "]  # not wrapped help
    assert listed == ["boilerplate", "cache", "chat", "clean", "decontaminate", "dedup", "demo", "export", "ingest",
                      "inspect", "pack", "report", "run", "serve", "tokenizer", "verify"]
    for command in listed:  # each one builds and documents its options
        shown = fuelline(command, "--help")
        assert shown.exit_code == 0 and "Usage: " in shown.output, (command, shown.output)


def test_malformed_input_exits_2_with_file_and_line(tmp_path):
    source = tmp_path / "in.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ok"}\n{"text": oops}\n'))
    result = fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert f"error: {source}:2: invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr


DEMO_STEPS = ("clean", "boilerplate", "dedup", "tokenizer", "pack")


def test_demo_runs_the_whole_pipeline_and_reports_every_drop(tmp_path):
    result = fuelline_process("demo", "--dir", str(tmp_path), "--workers", "2")
    assert result.returncode == 0, result.stderr
    clean = orjson.loads((tmp_path / "run" / "01-clean" / "stats.json").read_bytes())
    assert clean["dropped"]["malformed_json"] == 1 and clean["dropped"]["malformed_record"] == 1
    assert {"missing_character", "placeholder_circle", "composed_character", "empty_poem"} <= set(clean["dropped"])
    dedup = orjson.loads((tmp_path / "run" / "03-dedup" / "stats.json").read_bytes())
    assert dedup["dropped"]["exact_duplicate"] >= 300 and dedup["dropped"]["near_duplicate"] > 0
    boilerplate = orjson.loads((tmp_path / "run" / "02-boilerplate" / "stats.json").read_bytes())
    assert boilerplate["counters"]["boilerplate_lines_removed"] > 500  # the footer of half the ci
    assert "exact_duplicate" in result.stdout and "TokenDataset" in result.stdout
    manifest = tmp_path / "run" / "05-pack" / "train" / "manifest.json"
    assert manifest.exists() and "resumed" not in result.stdout
    written = manifest.stat().st_mtime_ns
    again = fuelline("demo", "--dir", str(tmp_path))  # a second demo in the same place resumes (other workers)
    assert again.exit_code == 0, (again.stderr, again.exception)
    summaries = [line for line in again.stdout.splitlines() if " dropped: " in line]  # one line per step
    assert [line.split()[0] for line in summaries] == list(DEMO_STEPS), again.stdout
    assert all("resumed" in line for line in summaries), again.stdout
    assert manifest.stat().st_mtime_ns == written and "TokenDataset" in again.stdout  # not packed again


def assert_one_line_error(result, *fragments):
    """Exit 2, one `error: …` line on stderr naming each fragment, and no traceback."""
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def write_pipeline(path, stage_table):
    path.write_text(f'[[step]]\nuse = "dedup"\n{stage_table}\n', encoding="utf-8")
    return path


def test_ordinary_mistakes_give_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    assert_one_line_error(fuelline("ingest", "-i", str(missing), "-o", str(tmp_path / "a"), "-q"), str(missing))

    bad_type = write_pipeline(tmp_path / "type.toml", 'threshold = "high"')
    result = fuelline("run", str(bad_type), "-o", str(tmp_path / "run1"), "-i", str(missing))
    assert_one_line_error(result, f"{bad_type} [[step]] #1 (dedup): option 'threshold' must be a number, found 'high'")

    mixed = tmp_path / "mixed.toml"
    mixed.write_text('[[step]]\nuse = "clean"\n[[stage]]\nuse = "dedup"\n', encoding="utf-8")
    assert_one_line_error(fuelline("run", str(mixed), "-o", str(tmp_path / "run0")), "both [[step]] and [[stage]]")

    unknown = write_pipeline(tmp_path / "unknown.toml", "treshold = 0.9")
    result = fuelline("run", str(unknown), "-o", str(tmp_path / "run2"))
    assert_one_line_error(result, "unknown option(s) treshold", "threshold")

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "hello"}\n')
    result = fuelline("pack", "-i", str(docs), "--tokenizer", str(tmp_path / "no-tokenizer"), "-o", str(tmp_path / "p"))
    assert result.exit_code == 2 and "no-tokenizer" in result.stderr and "does not exist" in result.stderr
    empty = tmp_path / "empty-tokenizer"
    empty.mkdir()
    result = fuelline("pack", "-i", str(docs), "--tokenizer", str(empty), "-o", str(tmp_path / "p"), "-q")
    assert_one_line_error(result, f"{empty}: no tokenizer.json")


def test_debug_shows_the_traceback(tmp_path):
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('[[step]]\nuse = "clean"\n[[stage]]\nuse = "dedup"\n', encoding="utf-8")
    assert_one_line_error(fuelline("run", str(mixed), "-o", str(tmp_path / "run0")), "both [[step]] and [[stage]]")

    unknown = write_pipeline(tmp_path / "unknown.toml", "treshold = 0.9")
    result = fuelline_process("--debug", "run", str(unknown), "-o", str(tmp_path / "run"))  # Python prints it
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ValueError: " in result.stderr and "build_dataclass" in result.stderr


def test_ctrl_c_says_how_to_resume_and_exits_130(monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setitem(main.commands, "sleepy", click.Command("sleepy", callback=interrupted))
    result = fuelline("sleepy")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted: run the same command again to resume"


@pytest.mark.parametrize("script_names, spawn_runs_it", [({"sys", "main"}, False), ({"sys", "main", "MyStage"}, True)])
def test_workers_spawned_under_the_console_script_do_not_run_it_again(monkeypatch, script_names, spawn_runs_it):
    """The script pip writes only imports the CLI, which a worker does not need (~0.15 s each); a
    script of the user's own may define what its workers unpickle, so it runs in them as before."""
    script = types.ModuleType("__main__")
    script.__file__ = "/venv/bin/fuelline"
    script.__spec__ = None
    for name in script_names:
        setattr(script, name, main if name == "main" else object())
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert fuelline("dedup", "--help").exit_code == 0
    preparation = multiprocessing.spawn.get_preparation_data("worker")
    assert ("init_main_from_path" in preparation) == spawn_runs_it
    if not spawn_runs_it:
        assert preparation["init_main_from_name"] == "fuelline.__main__"  # as under python -m fuelline: not run


def test_a_mislabelled_compressed_file_is_an_error_not_a_traceback(tmp_path):
    source = tmp_path / "x.jsonl.zst"
    source.write_text('{"text": "plain, not zstd"}\n')
    assert_one_line_error(fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "out"), "-q"), str(source))


def test_summary_line_points_at_the_rejects(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "ok"}\n{"text": oops}\n')
    result = fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "out"), "-q", "--on-error", "skip")
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert f"(rejected records in {tmp_path / 'out' / '_rejects'}/)" in result.stdout
    kept = fuelline("ingest", "-i", str(source), "-o", str(tmp_path / "bare"), "-q", "--on-error", "skip",
                    "--no-rejects")
    assert kept.exit_code == 0 and "malformed_json 1" in kept.stdout and "rejected records" not in kept.stdout

    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[defaults]\non_error = "skip"\n[[step]]\nuse = "ingest"\n', encoding="utf-8")
    result = fuelline("run", str(pipeline), "-o", str(tmp_path / "run"), "-i", str(source), "-q")
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert f"(rejected records in {tmp_path / 'run' / '01-ingest' / '_rejects'}/)" in result.stdout


def test_optional_bool_options_are_flags():
    result = fuelline("clean", "--help")
    assert "--boilerplate / --no-boilerplate" in result.stdout


def test_every_option_of_every_command_has_help():
    def commands(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, f"{path} {name}")

    options = [(f"{path} {param.opts[0]}", param) for path, command in commands(main, "fuelline")
               for param in command.params if isinstance(param, click.Option) and "--help" not in param.opts]
    assert [name for name, param in options if not (param.help or "").strip()] == []
    # Three or more choices are names a user cannot guess from (t2s, han-pairs): the help says what each is.
    unexplained = [(name, choice) for name, param in options if isinstance(param.type, click.Choice)
                   and len(param.type.choices) >= 3 for choice in param.type.choices if choice not in param.help]
    assert unexplained == []


def test_export_megatron_takes_a_pack_output(packed_poems, tmp_path):
    from fuelline.formats.tokens import read_manifest

    result = fuelline("export", "megatron", str(packed_poems), "-o", str(tmp_path / "gpt"))
    assert result.exit_code == 0, (result.stderr, result.exception)
    for split in ("train", "val"):
        manifest = read_manifest(packed_poems / split)
        bin_path = tmp_path / f"gpt_{split}.bin"
        assert bin_path.read_bytes() == (packed_poems / split / "tokens.bin").read_bytes()
        assert (tmp_path / f"gpt_{split}.idx").stat().st_size == 42 + 20 * manifest["num_documents"]
        assert f"{manifest['num_documents']:,} documents" in result.stdout


def test_export_megatron_skips_an_empty_split(poems, tokenizer_dir, tmp_path):
    source = tmp_path / "poems.jsonl"  # a few hundred poems make a train split as well as thousands
    source.write_bytes(b"".join(orjson.dumps(doc) + b"\n" for doc in poems[1][:300]))
    packed = tmp_path / "packed"
    result = fuelline("pack", "-i", str(source), "--tokenizer", str(tokenizer_dir), "-o", str(packed),
                      "--val-fraction", "0", "-q", "-w", "1")
    assert result.exit_code == 0, (result.stderr, result.exception)
    result = fuelline("export", "megatron", str(packed), "-o", str(tmp_path / "gpt"))
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert (tmp_path / "gpt_train.bin").exists() and not (tmp_path / "gpt_val.bin").exists()
    assert "val holds no documents" in result.stdout
