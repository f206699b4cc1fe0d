"""The distillation pipeline end to end: chat-prepare → regenerate (a real `transformers serve`
started and stopped by the run) → cache → report, on the chat demo's sample and tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fuelline.cache.dataset import CacheDataset  # noqa: E402
from fuelline.cache.inspect import validate_for_draft, verify_cache  # noqa: E402
from fuelline.chat.demo import run_chat_demo, sample_records  # noqa: E402
from fuelline.cli import main as fuelline_main  # noqa: E402
from fuelline.report.funnel import format_funnel, load_funnel  # noqa: E402

# The sample plants one of each fault below 120 conversations; each conversation is a request
# or two to the tiny model on the CPU, most of the regenerate step's time.
CONVERSATIONS = 30


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("chat-demo")
    run_dir, stats = run_chat_demo(str(base), conversations=CONVERSATIONS, progress=False)
    return base, run_dir, stats


def test_every_stage_adds_up_from_input_to_cache(demo_run):
    base, run_dir, stats = demo_run
    prepare, regenerate, cache, report = stats
    records = sample_records(CONVERSATIONS)
    assert prepare["records_in"] == len(records)
    assert prepare["records_out"] + sum(prepare["dropped"].values()) == len(records)
    broken = sum(1 for r in records if not r["id"].startswith(("sg-", "oa-", "al-")))
    assert sum(prepare["dropped"].values()) == broken  # exactly the planted faults, each under its reason
    assert set(prepare["dropped"]) == {"empty_content", "first_turn_not_user", "unknown_role", "unknown_schema"}
    train = prepare["outputs"]["train"]
    assert train + prepare["outputs"]["eval"] == prepare["records_out"]
    assert regenerate["records_in"] == train
    assert regenerate["records_out"] + sum(regenerate["dropped"].values()) == train
    assert regenerate["counters"]["regenerated"] == regenerate["records_out"]
    assert cache["records_in"] == regenerate["records_out"]
    assert cache["records_out"] + sum(cache["dropped"].values()) == cache["records_in"]
    funnel = load_funnel(run_dir)
    assert all(step["adds_up"] for step in funnel["steps"])
    text = format_funnel(funnel)
    assert "cache:" in text and "bytes/token" in text and "supervised" in text
    assert Path(report["report"]).exists()


def test_the_cache_holds_the_regenerated_answers_and_verifies(demo_run):
    base, run_dir, _ = demo_run
    cache_dir = next(run_dir.glob("*-cache"))
    assert verify_cache(cache_dir) == []
    regenerated = {}
    for path in next(run_dir.glob("*-regenerate")).glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = orjson.loads(line)
            regenerated[record["id"]] = record
    from fuelline.chat.encode import encode_chats

    dataset = CacheDataset(cache_dir)
    assert len(dataset) == len(regenerated)
    for i in range(len(dataset)):
        sample = dataset[i]
        encoded = encode_chats([regenerated[sample["record_id"]]], base / "model", "auto")[0]
        assert sample["input_ids"].tolist() == encoded.input_ids.tolist()


def test_validate_accepts_the_matching_draft_config_and_refuses_a_wrong_one(demo_run, tmp_path):
    base, run_dir, _ = demo_run
    cache_dir = next(run_dir.glob("*-cache"))
    model = str((base / "model").resolve())
    good = tmp_path / "draft.json"
    good.write_text(json.dumps({"target_layer_ids": [-1, 0, 1], "hidden_size": 64,
                                "target_model_name_or_path": model}))
    assert validate_for_draft(cache_dir, good) == []
    bad = tmp_path / "wrong.json"
    bad.write_text(json.dumps({"target_layer_ids": [0, 1], "hidden_size": 128, "target_model_name_or_path": model}))
    problems = validate_for_draft(cache_dir, bad)
    assert any("target_layer_ids" in p for p in problems) and any("hidden_size" in p for p in problems)
    cli = CliRunner().invoke(fuelline_main, ["cache", "validate", str(cache_dir), "--draft-config", str(bad)])
    assert cli.exit_code == 1 and "hidden_size" in cli.stderr


def test_a_second_run_resumes_every_step(demo_run):
    base, run_dir, first = demo_run
    _, again = run_chat_demo(str(base), conversations=CONVERSATIONS, progress=False)
    assert [s.get("records_out") for s in again[:3]] == [s.get("records_out") for s in first[:3]]
    assert all(s.get("resumed") for s in again[1:3])
