"""The reliability harness's reduced run (benchmarks/reliability.py --reduced): kills, fuzzed
readers, bad corpora, a full disk, chat template spans, wrongly answering, stalled and
non-streaming servers, prompt records and resumes with other options end in the right data or a
clear error, never in wrong data, a crash, a hang or files left behind.

It runs in three parts, one test each, which the two xdist workers of the slow part take one by
one: the pretraining sections (a)-(d), which share their inputs, and the families of their own
modules, (e)-(o) and (p) onwards."""

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from .conftest import shared_file

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "reliability.py"
sys.path.insert(0, str(HARNESS.parent))
from reliability import ALL_SECTIONS  # noqa: E402

PARTS = {
    "abcd": {"kill -9 and resume", "fuzz", "bad corpus"},
    "efghijklmno": {"templates", "servers", "export reruns", "vocab-map", "chat forms", "stalls", "prompts",
                    "chat records", "odd values of numeric options", "wrong record type per command",
                    "chat regenerate resumed with another option or input",
                    "cache stream resumed with another option or input",
                    "stream with a damaged partition or manifest, read whole",
                    "stream with its builder and trainer ranks SIGKILLed at random moments",
                    "decontaminate against a bad evaluation set", "decontaminate with odd values of its options",
                    "decontaminate rerun after its evaluation set was edited"},
    "pqrst": {"outputs overlapping inputs, every command", "empty and repeated inputs",
              "outputs apart from their inputs run",
              "evaluation sets, servers, --config and pipeline files inside outputs",
              "--restart with a user's file in the output, every command",
              "refused reruns of a finished pipeline", "read-only and full output locations",
              "workers far above the input's shards", "odd numbers given to library entry points",
              "cache build with a tokenizer larger than the model's vocabulary",
              "stream acknowledgements x shuffle groups x windows x batches",
              "stream acknowledgements with kills and a builder resumed with another window",
              "decontaminate items split over turns", "decontaminate items in tool arguments and tool results",
              "decontaminate items hidden by invisible characters", "decontaminate with blank evaluation items",
              "decontaminate against evaluation paths holding an equals sign or a colon",
              "decontaminate odd records under --on-error skip and raise",
              "decontaminate resumed with another --turns",
              "decontaminate resumed over a damaged evaluation index",
              "tool names that collide with template text"},
}


@pytest.mark.slow  # each part 2-4 minutes on a quiet machine
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sections", list(PARTS))
def test_the_reduced_harness_finds_no_silent_wrong_result_no_crash_and_no_leftover(sections, tmp_path):
    shared_file("chinese-poetry.jsonl.zst")
    result_path = tmp_path / "reliability.json"
    done = subprocess.run([sys.executable, str(HARNESS), "--reduced", "--sections", sections, "--json",
                           str(result_path)], capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stderr[-4000:]
    result = orjson.loads(result_path.read_bytes())
    bad = [row for row in result["scenarios"] if row["silent_wrong"] or row["crash"] or row["hang"] or row["leftover"]]
    assert not bad, orjson.dumps(bad, option=orjson.OPT_INDENT_2).decode()
    scenarios = {row["scenario"].split(":")[0] for row in result["scenarios"]}
    assert PARTS[sections] <= scenarios
    if "b" in sections:
        fuzzed = sum(row["trials"] for row in result["scenarios"] if row["scenario"].startswith("fuzz"))
        assert fuzzed >= 100 and result["totals"]["clear_error"] > 0  # the damage was real, and was caught


def test_the_parts_cover_every_section():
    assert "".join(sorted("".join(PARTS))) == ALL_SECTIONS
