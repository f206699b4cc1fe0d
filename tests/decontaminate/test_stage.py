"""The decontaminate stage on real files through the executor: planted evaluation items found in
every form the issue names (verbatim; case, spacing and punctuation changed; embedded in a longer
prompt; with an answer appended; in Chinese and in English), clean records kept, the rejects and
the report, chat records' user turns, --report-only, resume, workers, a pipeline file and its HTML
report, and the false positives on real chat data held apart against itself."""

import itertools
import shutil

import orjson
import pytest
import zstandard

from fuelline.decontaminate.evalsets import EvalItem, EvalSet
from fuelline.decontaminate.index import Rule, build_index
from fuelline.decontaminate.stage import DecontaminateConfig, DecontaminateStage
from fuelline.io import read_records
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.executor import RunOptions, run_stage

from ..conftest import invoke_cli, shared_file
from ..pipeline.test_executor import data_files

HELD = 40  # items of each shared file held apart as an evaluation set


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def first_human(record):
    return next(t["value"] for t in record["conversations"] if t["from"] == "human")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """An English set (GSM8K questions) and a Chinese one (ShareGPT-zh prompts) held apart from
    real files, and a training file of the rest with the planted copies among them."""
    base = tmp_path_factory.mktemp("decontaminate")
    gsm = list(itertools.islice(read_records(shared_file("chat/gsm8k-train.jsonl.zst")), 400))
    zh = [r for r in itertools.islice(read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst")), 400)
          if len(first_human(r)) >= 40]
    write_jsonl(base / "gsm8k.jsonl", [{"id": f"gsm-{i}", **r} for i, r in enumerate(gsm[:HELD])])
    write_jsonl(base / "zh.jsonl", [{"turns": [first_human(r)]} for r in zh[:HELD]])
    english, chinese = gsm[3]["question"], first_human(zh[5])
    planted = {
        "verbatim": english,
        "respelled": english.upper().replace(",", " ;").replace(".", " !!").replace(" ", "   ", 5),
        "embedded": f"My teacher gave us this, can you help?\n\n{gsm[7]['question']}\n\nPlease explain each step.",
        "answered": gsm[9]["question"] + "\n" + gsm[9]["answer"],
        "chinese": f"请帮我看看这个问题：{chinese}谢谢！",
        "chinese_respelled": chinese.replace("，", ", ").replace("。", "! "),
    }
    found_items = {"verbatim": ("gsm8k", 4), "respelled": ("gsm8k", 4), "embedded": ("gsm8k", 8),
                   "answered": ("gsm8k", 10), "chinese": ("zh", 6), "chinese_respelled": ("zh", 6)}
    clean = [{"id": f"clean-{i}", "text": r["question"] + "\n" + r["answer"]} for i, r in enumerate(gsm[HELD:])]
    clean += [{"id": f"clean-zh-{i}", "text": first_human(r)} for i, r in enumerate(zh[HELD:])]
    records = clean[:150] + [{"id": k, "text": v} for k, v in planted.items()] + clean[150:]
    train = write_jsonl(base / "train.jsonl", records)
    return {"base": base, "train": train, "planted": found_items, "clean": {r["id"] for r in clean},
            "against": [str(base / "gsm8k.jsonl"), str(base / "zh.jsonl")]}


def rejects(directory):
    found = []
    for path in sorted((directory / "_rejects").glob("*.zst")):
        text = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
        found.extend(orjson.loads(line) for line in text.splitlines())
    return found


@pytest.fixture(scope="module")
def run(data):
    out = data["base"] / "out"
    stats = run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"])), data["train"], out,
                      RunOptions(workers=1, shard_size=100, progress=False))
    return out, stats


def test_planted_items_are_found_in_every_form_and_clean_records_are_kept(data, run):
    out, stats = run
    kept = {r["id"] for r in read_records(out)}
    dropped = {r["record"]["id"]: r for r in rejects(out)}
    assert set(dropped) == set(data["planted"]), sorted(dropped)
    assert kept == data["clean"]
    for record_id, (name, item) in data["planted"].items():
        assert dropped[record_id]["reason"] == "contaminated"
        assert dropped[record_id]["detail"].startswith(f"{name} item {item}"), dropped[record_id]["detail"]
    assert "gsm8k item 4 (id gsm-3): " in dropped["verbatim"]["detail"]
    assert stats["dropped"] == {"contaminated": 6}


def test_the_report_says_per_set_what_was_found_and_where(run):
    _, stats = run
    report = stats["decontaminate"]
    assert report["action"] == "dropped" and report["rule"]["ngram"] == 8
    gsm, zh = report["sets"]["gsm8k"], report["sets"]["zh"]
    assert (gsm["items"], gsm["items_found"], gsm["records"], gsm["field"]) == (HELD, 3, 4, "question")
    assert (zh["items"], zh["items_found"], zh["records"], zh["field"]) == (HELD, 1, 2, "turns")
    assert gsm["examples"][0] == {"item": 4, "id": "gsm-3", "text": gsm["examples"][0]["text"], "records": 2,
                                  "record_ids": ["verbatim", "respelled"]}
    assert gsm["examples"][0]["text"].startswith("Julie is reading a 120-page book.")


def test_report_only_keeps_everything_and_reports_the_same(data, run, tmp_path):
    stats = run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"], report_only=True)),
                      data["train"], tmp_path / "out", RunOptions(workers=1, progress=False))
    assert stats["records_out"] == stats["records_in"] and not stats["dropped"]
    assert stats["counters"]["records_with_eval_items"] == 6
    report = stats["decontaminate"]
    assert report["action"] == "report only"
    assert report["sets"] == run[1]["decontaminate"]["sets"]


def test_chat_records_are_checked_by_their_user_turns_or_every_turn(data, tmp_path):
    question = next(iter(read_records(data["base"] / "gsm8k.jsonl")))["question"]
    chats = write_jsonl(tmp_path / "chats.jsonl", [
        {"id": "in-user", "conversations": [{"role": "user", "content": "Solve: " + question},
                                            {"role": "assistant", "content": "12"}]},
        {"id": "in-answer", "conversations": [{"role": "user", "content": "Give me a math problem."},
                                              {"role": "assistant", "content": question}]},
        {"id": "clean", "conversations": [{"role": "user", "content": "Hello there, how are you today?"},
                                          {"role": "assistant", "content": "Fine."}]}])
    for turns, kept in (("user", {"in-answer", "clean"}), ("all", {"clean"})):
        stats = run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"], turns=turns)), chats,
                          tmp_path / turns, RunOptions(workers=1, progress=False))
        assert {r["id"] for r in read_records(tmp_path / turns)} == kept, turns
        assert stats["decontaminate"]["sets"]["gsm8k"]["items_found"] == 1


def test_a_record_of_another_kind_is_an_error_naming_it(data, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "text": "fine"}, {"id": "b", "body": "no text"}])
    result = invoke_cli("decontaminate", "-i", bad, "-o", tmp_path / "out", "--against", data["against"][0], "-q")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}:2: expected a document record") and "Traceback" not in result.stderr


def test_an_interrupted_run_resumes_with_the_same_bytes_and_report(data, run, tmp_path):
    out, stats = run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    for name in ("_done/part-00001.json", "part-00001.jsonl.zst", "_prepare/found/part-00001.json"):
        (copy / name).unlink()
    (copy / "stats.json").unlink()
    resumed = run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"])), data["train"], copy,
                        RunOptions(workers=2, shard_size=100, progress=False))
    assert resumed["resumed_shards"] == stats["shards"] - 1
    assert data_files(copy) == data_files(out)
    assert resumed["decontaminate"] == stats["decontaminate"]


def test_two_workers_write_the_bytes_of_one(data, run, tmp_path):
    run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"])), data["train"], tmp_path / "two",
              RunOptions(workers=2, shard_size=100, progress=False))
    assert data_files(tmp_path / "two") == data_files(run[0])


def test_an_edited_evaluation_set_is_not_taken_for_the_finished_output(data, tmp_path):
    against = tmp_path / "gsm8k.jsonl"
    shutil.copy(data["against"][0], against)
    args = ["decontaminate", "-i", data["train"], "-o", tmp_path / "out", "--against", against, "-q"]
    assert invoke_cli(*args).exit_code == 0
    against.write_bytes(against.read_bytes() + b'{"question": "One more question for the set, long enough."}\n')
    refused = invoke_cli(*args)
    assert refused.exit_code == 2 and "--restart" in refused.stderr, refused.stderr
    assert invoke_cli(*args, "--restart").exit_code == 0


def test_a_pipeline_step_and_the_html_report_show_what_was_found(data, tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(f'[[step]]\nuse = "decontaminate"\nagainst = {orjson.dumps(data["against"]).decode()}\n\n'
                        '[[step]]\nuse = "report"\n')
    run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(data["train"])], progress=False)
    page = (tmp_path / "run" / "report" / "report.html").read_text()
    assert "Evaluation items found by decontaminate (dropped)" in page
    assert "<td>gsm8k</td><td>40</td><td>3</td><td>4</td>" in page and "<td>zh</td><td>40</td><td>1</td><td>2</td>" in page
    funnel = (tmp_path / "run" / "report" / "funnel.txt").read_text()
    assert "gsm8k: 3 of 40 items found, in 4 training records (dropped)" in funnel


def test_few_false_positives_on_real_chat_data_held_apart_against_itself():
    """Each shared chat file's first 500 prompts as an evaluation set, the rest of all three as
    training data: a record flagged there is a real repeat or a false positive; both together stay
    under 1% (benchmarks/bench_decontaminate.py judges them one by one: 0.14% false positives)."""
    sources = {
        "gsm8k": [r["question"] for r in read_records(shared_file("chat/gsm8k-train.jsonl.zst"))],
        "codegen": [r["instruction"] + "\n" + r["input"] for r in read_records(shared_file("chat/codegen-instruct.json.zst"))],
        "zh": [first_human(r) for r in read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst"))],
    }
    sets = [EvalSet(name, name, "prompt", tuple(EvalItem(i + 1, None, (t,)) for i, t in enumerate(texts[:500])))
            for name, texts in sources.items()]
    train = [t for texts in sources.values() for t in texts[500:]]
    config = DecontaminateConfig(against=["unused"])
    index = build_index(sets, Rule(config.ngram, config.threshold, config.min_ngrams, config.common))
    flagged = sum(bool(m) for start in range(0, len(train), 512) for m in index.match(train[start:start + 512]))
    assert len(train) > 11_000 and flagged / len(train) < 0.01, flagged
