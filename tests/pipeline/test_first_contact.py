"""Behaviors a new user meets: retrying a failed run with other options, nothing left behind by a
missing input, one report location, resumed steps saying so, and warnings for tiny inputs."""

import orjson
import pytest

from fuelline.clean.stage import CleanStage
from fuelline.io.lock import lock_path
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.workdir import StepOutputMismatch
from fuelline.pipeline.executor import RunOptions, run_stage


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_run_stopped_by_bad_input_can_be_retried_with_other_options(tmp_path):
    source = write_lines(tmp_path / "in.jsonl", ['{"title": "t", "author": "a", "paragraphs": ["床前明月光，疑是地上霜。"]}',
                                                 "{broken"])
    with pytest.raises(ValueError, match=r"in.jsonl:2: invalid JSON"):
        run_stage(CleanStage(), [source], tmp_path / "out", RunOptions(workers=1, progress=False))
    stats = run_stage(CleanStage(), [source], tmp_path / "out", RunOptions(workers=1, on_error="skip", progress=False))
    assert stats["dropped"]["malformed_json"] == 1
    # once a shard has finished, other options are refused as before
    with pytest.raises(StepOutputMismatch, match="different on_error"):
        run_stage(CleanStage(), [source], tmp_path / "out", RunOptions(workers=1, progress=False))


def test_a_missing_input_leaves_nothing_behind(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_stage(CleanStage(), [tmp_path / "missing.jsonl"], tmp_path / "out", RunOptions(workers=1, progress=False))
    pipeline = write_lines(tmp_path / "p.toml", ['[[step]]', 'use = "clean"'])
    with pytest.raises(FileNotFoundError):
        run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(tmp_path / "missing.jsonl")], progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]
    assert not lock_path(tmp_path / "run").exists()


def test_report_step_writes_where_the_report_command_writes_and_finished_steps_say_resumed(poems, tmp_path):
    pipeline = write_lines(tmp_path / "p.toml", ['[[step]]', 'use = "tokenizer"', 'vocab_size = 400',
                                                 '[[step]]', 'use = "report"'])
    first = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(poems[0])], progress=False)
    assert first[1]["report"] == str(tmp_path / "run" / "report" / "report.html")
    assert (tmp_path / "run" / "report" / "funnel.json").exists()
    again = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(poems[0])], progress=False)
    assert again[0]["resumed"] is True and "resumed" not in first[0]
    assert again[0]["original_wall_seconds"] == first[0]["wall_seconds"] and again[0]["wall_seconds"] < 1


def test_tiny_inputs_warn(tmp_path):
    from fuelline.pack.packer import PackConfig, pack
    from fuelline.tokenizer.train import train_tokenizer

    docs = write_lines(tmp_path / "docs.jsonl", [orjson.dumps({"id": f"d{i}", "text": "春眠不觉晓"}).decode()
                                                 for i in range(3)])
    report = train_tokenizer(docs, tmp_path / "tok", vocab_size=2000)
    assert report["warnings"] and "fewer than the 2,000 asked" in report["warnings"][0]
    stats = pack([docs], tmp_path / "tok", tmp_path / "packed", PackConfig(template="plain"), workers=1,
                 progress=False)
    assert any("split val got no documents" in w for w in stats["warnings"])
    from fuelline.loader.dataset import TokenDataset

    with pytest.raises(ValueError, match=r"split val\): 0 tokens in 0 documents make no window of seq_len 8"):
        TokenDataset(tmp_path / "packed" / "val", seq_len=8)


def test_a_finished_run_and_a_rerun_leave_no_lock_files(tmp_path):
    """`.NAME.lock` files stayed in runs/ after every finished run (one per step and the run's own)."""
    source = write_lines(tmp_path / "in.jsonl", ['{"title": "t", "author": "a", "paragraphs": ["床前明月光，疑是地上霜。"]}'])
    pipeline = write_lines(tmp_path / "p.toml", ['[[step]]', 'use = "clean"', '[[step]]', 'use = "dedup"'])
    for _ in range(2):  # the rerun finds both steps done
        run_pipeline(load_pipeline(pipeline), tmp_path / "runs" / "r", input=[str(source)], workers=1, progress=False)
        assert [p.name for p in (tmp_path / "runs").rglob("*.lock")] == []


def test_the_run_summary_prints_a_cache_steps_numbers_as_cache_build_does():
    """It printed `cache: tokens 120, supervised_share 0.4166666666666667, bytes …`, a raw dump."""
    import click
    from click.testing import CliRunner

    from fuelline.cache.cli import cache_numbers
    from fuelline.cli import _print_stats

    stats = {"stage": "cache", "records_in": 8, "records_out": 8, "dropped": {}, "wall_seconds": 2.5,
             "cache": {"tokens": 120, "supervised_share": 5 / 12, "bytes": 3 << 20, "shards": 2,
                       "bytes_per_token": 26214.4, "padding_share": 0.1, "forward_seconds": 1.25}}
    output = CliRunner().invoke(click.command()(lambda: _print_stats([stats]))).output
    assert output.splitlines()[1] == f"  cache: {cache_numbers(stats)}"
    assert "120 tokens (41.7% supervised), 3.1 MB in 2 shard(s), 26,214.4 bytes/token, padding 10.0%" in output
    assert "supervised_share" not in output
