"""chat-prepare: every schema normalized, every bad record dropped under a named reason with its
file and line, a split that depends only on (seed, id), and outputs a later stage can read."""

from pathlib import Path

import orjson
import pytest
import zstandard

from fuelline.chat.prepare import SPLIT_SALT, ChatPrepareConfig, ChatPrepareStage
from fuelline.dedup.stage import DedupConfig, DedupStage
from fuelline.formats.chat_record import ChatRecordError
from fuelline.io import read_records
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.records import unit_interval

from ..conftest import invoke_cli as fuelline
from ..conftest import shared_file
from ..pipeline.test_executor import data_files

# Record counts stated by ../shared/data/README.md for each upstream file.
CHAT_FILES = {"sharegpt_zh_1K.jsonl.zst": 1_000, "codegen-instruct.json.zst": 4_535, "gsm8k-train.jsonl.zst": 7_473}
QUIET = RunOptions(workers=1, progress=False)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def prepare(inputs, out: Path, options: RunOptions = QUIET, **config) -> dict:
    return run_stage(ChatPrepareStage(ChatPrepareConfig(**config)), inputs, out, options)


def rejects(out: Path) -> list[dict]:
    return list(read_records(sorted((out / "_rejects").glob("*.jsonl.zst")))) if (out / "_rejects").exists() else []


def assert_valid_chat(record: dict) -> None:
    turns = record["conversations"]
    roles = [t["role"] for t in turns]
    body = roles[1:] if roles[0] == "system" else roles
    assert body == ["user", "assistant"] * (len(body) // 2) and body, roles
    assert all(isinstance(t["content"], str) and t["content"].strip() for t in turns)


@pytest.mark.parametrize("name", CHAT_FILES)
def test_every_shared_chat_file_adds_up(name, tmp_path):
    source = shared_file(f"chat/{name}")
    stats = prepare([source], tmp_path / "out")
    train = list(read_records(tmp_path / "out"))
    evals = list(read_records(tmp_path / "out" / "eval"))
    assert stats["records_in"] == CHAT_FILES[name]
    assert stats["records_in"] == len(train) + len(evals) + sum(stats["dropped"].values())
    assert stats["outputs"] == {"train": len(train), "eval": len(evals)}
    for record in train:
        assert set(record) == {"id", "conversations"}
        assert_valid_chat(record)
    for record in evals:
        assert set(record) == {"id", "turns"} and record["turns"]
        assert all(isinstance(t, str) and t.strip() for t in record["turns"])
    share = len(evals) / (len(train) + len(evals))
    assert 0.03 < share < 0.07  # test_size 0.05
    assert len({r["id"] for r in train + evals}) == len(train) + len(evals)
    for reject in rejects(tmp_path / "out"):
        assert reject["source"] == str(source) and reject["line"] >= 1 and reject["reason"] in stats["dropped"]


def test_sharegpt_conversations_ending_on_a_user_turn_keep_their_exchanges(tmp_path):
    source = shared_file("chat/sharegpt_zh_1K.jsonl.zst")
    raw = list(read_records(source))
    odd = sum(1 for r in raw if r["conversations"] and r["conversations"][-1]["from"] == "human"
              and len(r["conversations"]) > 1)
    stats = prepare([source], tmp_path / "out", test_size=0.0)
    assert odd > 0 and stats["counters"]["trailing_user_turn_removed"] == odd
    human_turns = sum(1 for r in raw for t in r["conversations"] if t["from"] == "human")
    kept_user = sum(1 for r in read_records(tmp_path / "out") for t in r["conversations"] if t["role"] == "user")
    assert kept_user < human_turns


def test_schemas_are_detected_per_record_and_normalized(tmp_path):
    records = [
        {"id": "sg", "conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "q1"},
                                       {"from": "chatgpt", "value": "a1"}, {"from": "user", "value": "q2"},
                                       {"from": "bard", "value": "a2"}]},
        {"id": "oa", "messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                                {"type": "text", "text": "part two"}]},
                                  {"role": "assistant", "content": "answer"}]},
        {"id": "al", "instruction": "Translate", "input": "bonjour", "output": "hello", "system": "be brief"},
        {"id": "al2", "instruction": "Say hi", "input": "", "response": "hi"},
        {"id": "qa1", "question": "1+1?", "answer": "2"},
        {"id": "qa2", "query": "q", "response": "r"},
        {"id": 7, "prompt": "p", "completion": "c"},
    ]
    stats = prepare([write_jsonl(tmp_path / "in.jsonl", records)], tmp_path / "out", test_size=0.0, keep_system=True)
    assert stats["schemas"] == {"sharegpt": 1, "openai": 1, "alpaca": 2, "qa": 3}
    got = {r["id"]: r["conversations"] for r in read_records(tmp_path / "out")}
    assert got["sg"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                         {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
                         {"role": "assistant", "content": "a2"}]
    assert got["oa"][0] == {"role": "user", "content": "part one\npart two"}
    assert got["al"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Translate\n\nbonjour"},
                         {"role": "assistant", "content": "hello"}]
    assert got["al2"] == [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]
    assert got["qa2"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]
    assert "7" in got  # an integer upstream id becomes a string


def test_system_turns_are_removed_unless_kept(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "instruction": "i", "output": "o", "system": "s"}])
    stats = prepare([source], tmp_path / "out", test_size=0.0)
    (record,) = read_records(tmp_path / "out")
    assert [t["role"] for t in record["conversations"]] == ["user", "assistant"]
    assert stats["counters"]["system_turn_removed"] == 1


MALFORMED = [
    ({"conversations": [{"from": "human"}, {"from": "gpt", "value": "a"}]}, "missing_key", "value"),
    ({"conversations": "hello"}, "wrong_type", "list"),
    ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "a"}]}, "wrong_type", "int"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
                   {"role": "assistant", "content": "a"}]}, "wrong_type", "image_url"),
    ({"conversations": [{"from": "narrator", "value": "q"}, {"from": "gpt", "value": "a"}]}, "unknown_role", "narrator"),
    ({"conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "a"}]}, "empty_content", "turn 0"),
    ({"question": "q", "answer": ""}, "empty_content", "turn 1"),
    ({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]}, "first_turn_not_user", "assistant"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q"}]}, "roles_not_alternating", "turn 1"),
    ({"conversations": [{"from": "human", "value": "q"}]}, "no_complete_exchange", "without an answer"),
    ({"instruction": "i"}, "missing_key", "response"),
    ({"title": "not chat"}, "unknown_schema", "title"),
]


def test_malformed_records_are_dropped_with_reason_file_and_line(tmp_path):
    good = {"question": "q", "answer": "a"}
    lines = [good] + [record for record, _, _ in MALFORMED]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    stats = prepare([source], tmp_path / "out")
    expected_reasons = {}
    for _, reason, _ in MALFORMED:
        expected_reasons[reason] = expected_reasons.get(reason, 0) + 1
    assert stats["dropped"] == dict(sorted(expected_reasons.items()))
    found = {r["line"]: r for r in rejects(tmp_path / "out")}
    assert sorted(found) == list(range(2, len(lines) + 1))
    for line, (record, reason, mention) in enumerate(MALFORMED, start=2):
        assert found[line]["source"] == str(source)
        assert found[line]["reason"] == reason
        assert mention in found[line]["detail"], found[line]["detail"]
        assert found[line]["record"] == record


def test_forced_schema_drops_records_of_another_shape(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"question": "q", "answer": "a"},
                                                  {"instruction": "i", "output": "o"}])
    stats = prepare([source], tmp_path / "out", schema="alpaca")
    assert stats["schemas"] == {"alpaca": 1} and stats["dropped"] == {"missing_key": 1}


def test_split_depends_only_on_seed_and_id(tmp_path):
    records = [{"id": f"r{i}", "question": f"q{i}", "answer": f"a{i}"} for i in range(2_000)]
    forward = write_jsonl(tmp_path / "forward.jsonl", records)
    backward = write_jsonl(tmp_path / "backward.jsonl", records[::-1])
    prepare([forward], tmp_path / "f", test_size=0.1, seed=3)
    prepare([backward], tmp_path / "b", RunOptions(workers=2, shard_size=300, progress=False), test_size=0.1, seed=3)
    eval_f = {r["id"] for r in read_records(tmp_path / "f" / "eval")}
    eval_b = {r["id"] for r in read_records(tmp_path / "b" / "eval")}
    assert eval_f == eval_b == {r["id"] for r in records if unit_interval(3, SPLIT_SALT, r["id"]) < 0.1}
    assert 150 < len(eval_f) < 250
    prepare([forward], tmp_path / "other_seed", test_size=0.1, seed=4)
    assert {r["id"] for r in read_records(tmp_path / "other_seed" / "eval")} != eval_f


def test_output_is_byte_identical_for_any_number_of_workers(tmp_path):
    gsm8k = list(read_records(shared_file("chat/gsm8k-train.jsonl.zst")))[:1_000]  # two files, several shards each
    sources = [shared_file("chat/sharegpt_zh_1K.jsonl.zst"), write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k)]
    prepare(sources, tmp_path / "one", RunOptions(workers=1, shard_size=300, progress=False))
    prepare(sources, tmp_path / "two", RunOptions(workers=2, shard_size=300, progress=False))
    one, two = data_files(tmp_path / "one"), data_files(tmp_path / "two")
    assert one == two and any(name.startswith("eval/part-") for name in one)


def test_categories_are_counted_per_outcome(tmp_path):
    records = [{"id": f"{kind}{i}", "kind": kind, "question": "q" if i % 5 else "", "answer": "a"}
               for kind in ("math", "code") for i in range(200)]
    stats = prepare([write_jsonl(tmp_path / "in.jsonl", records)], tmp_path / "out", category_key="kind")
    for kind in ("math", "code"):
        numbers = stats["categories"][kind]
        assert numbers["in"] == 200 and numbers["dropped"] == 40
        assert numbers["train"] + numbers["eval"] == 160 and numbers["eval"] > 0
    assert {r["meta"]["category"] for r in read_records(tmp_path / "out")} == {"math", "code"}


def test_category_from_file_name(tmp_path):
    first = write_jsonl(tmp_path / "math.jsonl", [{"question": "q", "answer": "a"}] * 3)
    second = write_jsonl(tmp_path / "code.jsonl", [{"instruction": "i", "output": "o"}] * 2)
    stats = prepare([first, second], tmp_path / "out", category_key="@file", test_size=0.0)
    assert {k: v["in"] for k, v in stats["categories"].items()} == {"code": 2, "math": 3}


def test_cli_writes_single_jsonl_files_and_resumes(tmp_path):
    source = shared_file("chat/gsm8k-train.jsonl.zst")
    args = ["chat", "prepare", "-i", source, "--train-output", tmp_path / "train.jsonl", "--eval-output",
            tmp_path / "eval.jsonl", "-q", "-w", "1"]
    first = fuelline(*args)
    assert first.exit_code == 0, (first.stderr, first.exception)
    train = (tmp_path / "train.jsonl").read_bytes()
    evals = [orjson.loads(line) for line in (tmp_path / "eval.jsonl").read_bytes().splitlines()]
    assert len(train.splitlines()) + len(evals) == CHAT_FILES["gsm8k-train.jsonl.zst"]
    assert all(set(r) == {"id", "turns"} for r in evals)
    again = fuelline(*args)
    assert again.exit_code == 0 and "resumed: done in an earlier run" in again.stdout
    assert (tmp_path / "train.jsonl").read_bytes() == train
    other = fuelline(*args, "--seed", "5")
    assert other.exit_code == 2 and "different config" in other.stderr and "Traceback" not in other.stderr


def test_cli_malformed_json_names_file_and_line(tmp_path):
    source = tmp_path / "in.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"question": "q", "answer": "a"}\n{"question": \n'))
    result = fuelline("chat", "prepare", "-i", source, "--train-output", tmp_path / "t", "--eval-output", tmp_path / "e",
                      "-q")
    assert result.exit_code == 2 and f"{source}:2: invalid JSON" in result.stderr


def _prepare_cli(source, tmp_path):
    return fuelline("chat", "prepare", "-i", source, "--train-output", tmp_path / "t.jsonl", "--eval-output",
                    tmp_path / "e.jsonl", "-q", "-w", "1")


def test_cli_that_keeps_nothing_says_why_on_the_terminal_and_fails(tmp_path):
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(5)))
    result = _prepare_cli(source, tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "kept none of its 5 records (dropped: unknown_schema 5)" in result.stderr
    assert f"5 of 5 records (100%) dropped as unknown_schema; the first: {source}:1: keys text match no chat schema" \
        in result.stderr
    assert not (tmp_path / "t.jsonl").exists()  # no empty train file that looks like a result


def test_cli_warns_when_one_reason_drops_most_records(tmp_path):
    source = tmp_path / "mixed.jsonl"
    lines = [f'{{"text": "document {i}"}}' for i in range(6)] + [orjson.dumps(
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": "hello"}]}
    ).decode() for i in range(4)]
    source.write_text("\n".join(lines) + "\n")
    result = _prepare_cli(source, tmp_path)
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert "warning: 6 of 10 records (60%) dropped as unknown_schema; the first: " in result.stderr
    assert len((tmp_path / "t.jsonl").read_bytes().splitlines()) + len((tmp_path / "e.jsonl").read_bytes().splitlines()) == 4


def test_pipeline_prepares_then_dedups_user_turns(tmp_path):
    records = [{"id": f"r{i}", "question": f"How many apples are in basket number {i // 2}?", "answer": f"{i}"}
               for i in range(400)]  # every prompt twice, with different answers
    source = write_jsonl(tmp_path / "in.jsonl", records)
    pipeline = tmp_path / "chat.toml"
    pipeline.write_text('[[step]]\nuse = "chat-prepare"\ntest_size = 0.0\n\n'
                        '[[step]]\nuse = "dedup"\ncompare = "user_turns"\n')
    stats = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(source)], workers=1, progress=False)
    assert stats[0]["outputs"]["train"] == 400
    assert stats[1]["records_in"] == 400 and stats[1]["dropped"] == {"exact_duplicate": 200}
    kept = list(read_records(tmp_path / "run" / "02-dedup"))
    assert len({r["conversations"][0]["content"] for r in kept}) == 200


def test_dedup_of_user_turns_refuses_document_records(tmp_path):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": "d", "text": "a document"}])
    with pytest.raises(ChatRecordError, match=r"docs.jsonl:1: expected a chat record .* found a document record "
                                              r"\(text\) \(not_a_chat_record\)"):
        run_stage(DedupStage(DedupConfig(compare="user_turns")), [source], tmp_path / "out", QUIET)


def test_report_shows_categories_and_step_outputs_are_addressable(tmp_path):
    from fuelline.pipeline.step import resolve_step
    from fuelline.report.funnel import format_funnel, load_funnel
    from fuelline.report.step import build_report

    math = write_jsonl(tmp_path / "math.jsonl", [{"id": f"m{i}", "question": "q", "answer": "a"} for i in range(50)])
    code = write_jsonl(tmp_path / "code.jsonl", [{"id": f"c{i}", "instruction": "i", "output": ""} for i in range(5)])
    pipeline = tmp_path / "chat.toml"
    pipeline.write_text('[[step]]\nuse = "chat-prepare"\ncategory_key = "@file"\ntest_size = 0.2\n')
    run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(math), str(code)], workers=1, progress=False)
    funnel = load_funnel(tmp_path / "run")
    (step,) = funnel["steps"]
    assert step["categories"]["code"] == {"in": 5, "train": 0, "eval": 0, "dropped": 5}
    assert step["categories"]["math"]["train"] + step["categories"]["math"]["eval"] == 50
    text = format_funnel(funnel)
    assert "code" in text and "schema." not in text  # counters shown as tables, not twice
    build_report(tmp_path / "run", tmp_path / "run" / "report")
    assert (tmp_path / "run" / "report" / "categories.png").stat().st_size > 1000
    eval_dir = resolve_step("@chat-prepare/eval", {"chat-prepare": tmp_path / "run" / "01-chat-prepare"})
    assert len(list(read_records(eval_dir))) == step["outputs"]["eval"] > 0


def test_repeated_ids_are_renamed_so_every_output_id_is_unique(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # No upstream ids, same file name: the fallback ids (file name and line) repeat.
    first = write_jsonl(tmp_path / "a" / "train.jsonl", [{"question": f"a{i}", "answer": "x"} for i in range(30)])
    second = write_jsonl(tmp_path / "b" / "train.jsonl", [{"question": f"b{i}", "answer": "x"} for i in range(30)])
    upstream = write_jsonl(tmp_path / "up.jsonl", [{"id": "same", "question": "q1", "answer": "a"},
                                                   {"id": "same", "question": "q2", "answer": "a"},
                                                   {"id": "same#2", "question": "q3", "answer": "a"}])
    stats = prepare([first, second, upstream], tmp_path / "out", RunOptions(workers=2, shard_size=7, progress=False),
                    test_size=0.3)
    records = list(read_records(tmp_path / "out")) + list(read_records(tmp_path / "out" / "eval"))
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 63 and stats["counters"]["duplicate_id_renamed"] == 32
    # In input order, first come first served: the second "same" takes "same#2", so the record
    # whose upstream id was "same#2" comes after it and is renamed in turn.
    assert {"same", "same#2", "same#2#2"} <= set(ids)
    questions = {r["conversations"][0]["content"] if "conversations" in r else r["turns"][0] for r in records}
    assert len(questions) == 63  # nothing lost


def test_cli_refuses_a_work_dir_beside_a_train_directory(tmp_path):
    result = fuelline("chat", "prepare", "-i", shared_file("chat/gsm8k-train.jsonl.zst"), "--train-output",
                      tmp_path / "train", "--eval-output", tmp_path / "eval", "--work-dir", tmp_path / "w", "-q")
    assert result.exit_code == 2 and "--work-dir is for a .jsonl --train-output" in result.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "train").exists()
