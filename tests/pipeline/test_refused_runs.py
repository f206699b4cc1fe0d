"""A refused rerun of a finished pipeline leaves its run directory as it was, byte for byte: every
step is checked against its output before any step writes (pipeline.json, stats.json included)."""

from pathlib import Path

import orjson
import pytest

from fuelline.io import read_records
from tests.conftest import invoke_cli, shared_file

PIPELINE = """
[defaults]
on_error = "skip"
workers = 1

[[step]]
use = "clean"
profile = "poetry"

[[step]]
use = "dedup"
threshold = {threshold}

[[step]]
use = "tokenizer"
vocab_size = {vocab}

[[step]]
use = "pack"
tokenizer = "@tokenizer"
template = "poetry"

[[step]]
use = "report"
"""


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The poetry pipeline run to its end on the first 1,500 lines of the real corpus."""
    base = tmp_path_factory.mktemp("refused")
    corpus = base / "poems.jsonl"
    with corpus.open("wb") as f:
        for i, record in enumerate(read_records(shared_file("chinese-poetry.jsonl.zst"))):
            if i == 1_500:
                break
            f.write(orjson.dumps(record) + b"\n")
    pipeline = base / "p.toml"
    pipeline.write_text(PIPELINE.format(threshold=0.85, vocab=300))
    done = invoke_cli("run", pipeline, "--run-dir", base / "run", "-i", corpus, "-q")
    assert done.exit_code == 0, done.output
    return base, corpus


@pytest.mark.parametrize(("change", "step"), [({"threshold": 0.9, "vocab": 300}, "dedup"),
                                              ({"threshold": 0.85, "vocab": 320}, "tokenizer")])
def test_a_refused_rerun_changes_no_byte_of_the_run(finished_run, change, step):
    base, corpus = finished_run
    before = snapshot(base / "run")
    assert {"pipeline.json", "04-pack/stats.json", "report/funnel.json"} <= set(before)
    changed = base / f"{step}.toml"
    changed.write_text(PIPELINE.format(**change))
    refused = invoke_cli("run", changed, "--run-dir", base / "run", "-i", corpus, "-q")
    assert refused.exit_code == 2 and f"--restart-from {step}" in refused.stderr, refused.output
    assert snapshot(base / "run") == before
    funnel = invoke_cli("report", base / "run", "--json")
    assert [s["stage"] for s in orjson.loads(funnel.stdout.split("\n\nHTML")[0])["steps"]] == \
        ["clean", "dedup", "tokenizer", "pack"]


def test_a_rerun_with_nothing_to_do_writes_nothing(finished_run):
    base, corpus = finished_run
    before = snapshot(base / "run")
    again = invoke_cli("run", base / "p.toml", "--run-dir", base / "run", "-i", corpus, "-q")
    assert again.exit_code == 0 and "resumed: done in an earlier run" in again.stdout, again.output
    assert snapshot(base / "run") == before
