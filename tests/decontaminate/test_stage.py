"""The decontaminate stage on real files through the executor: planted evaluation items found in
every form the issue names (verbatim; case, spacing and punctuation changed; embedded in a longer
prompt; with an answer appended; in Chinese and in English), clean records kept, the rejects and
the report, chat records' user turns, --report-only, resume, workers, a pipeline file and its HTML
report, and the false positives on real chat data held apart against itself."""

import itertools
import json
import shutil

import orjson
import pytest
import zstandard

from fuelline.decontaminate.evalsets import EvalItem, EvalSet
from fuelline.decontaminate.index import Rule, build_index
from fuelline.decontaminate.ngrams import tokens
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


@pytest.fixture(scope="module")
def prompts():
    """Real prompts with an answer each: codegen instructions with their input (code), and Chinese
    ShareGPT first turns of 16 to 60 characters (short: a half holds few n-grams of its own); each
    of at least 12 tokens, long enough to be checked."""
    code = [(r["instruction"] + "\n" + r["input"], r["response"]) for r in itertools.islice(
        read_records(shared_file("chat/codegen-instruct.json.zst")), HELD)]
    zh = [(r["conversations"][0]["value"], r["conversations"][1]["value"]) for r in itertools.islice(
        read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst")), 400)
          if 16 <= len(r["conversations"][0]["value"]) <= 60 and len(r["conversations"]) > 1]
    return {name: [(p, a) for p, a in pairs if len(tokens(p)) >= 12][:HELD]
            for name, pairs in (("code", code), ("zh", zh))}


def found_ids(tmp_path, name, records, against, turns, on_error="raise"):
    train = write_jsonl(tmp_path / f"{name}-{turns}.jsonl", records)
    out = tmp_path / f"{name}-{turns}"
    stats = run_stage(DecontaminateStage(DecontaminateConfig(against=[str(against)], turns=turns)), train, out,
                      RunOptions(workers=1, progress=False, on_error=on_error))
    return {r["record"]["id"] for r in rejects(out) if r["reason"] == "contaminated"}, stats


def halves(text):
    """`text` cut in two near its middle, at a space when it has one (a word stays whole)."""
    middle = len(text) // 2
    spaces = [k for k, c in enumerate(text) if c.isspace()]
    cut = min(spaces, key=lambda k: abs(k - middle)) if spaces else middle
    return text[:cut], text[cut:]


@pytest.mark.parametrize("source", ["code", "zh"])
def test_every_turn_finds_at_least_what_the_user_turns_find_an_item_split_over_two_user_turns(
        prompts, tmp_path, source):
    """Each item's two halves in two user turns, the real answer to it in the assistant turn between:
    `--turns all` reads the assistant turn too, and must still find every item `--turns user` finds."""
    items = prompts[source]
    against = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": prompt} for prompt, _ in items])
    records = []
    for k, (prompt, answer) in enumerate(items):
        first, second = halves(prompt)
        records.append({"id": f"split-{k}", "conversations": [
            {"role": "user", "content": first}, {"role": "assistant", "content": answer},
            {"role": "user", "content": second}, {"role": "assistant", "content": answer}]})
    by_user, _ = found_ids(tmp_path, source, records, against, "user")
    by_all, _ = found_ids(tmp_path, source, records, against, "all")
    assert len(by_user) >= 0.9 * len(items), len(by_user)  # the user turns joined hold the item whole
    assert by_user <= by_all, sorted(by_user - by_all)


def test_tool_call_arguments_and_tool_results_are_checked_with_every_turn(prompts, tmp_path):
    """Copies of real prompts (code and Chinese) as a tool call's arguments (a string value, nested,
    a string holding JSON) and as tool results (plain, JSON with escaped newlines and non-ASCII):
    each found with `--turns all`, none with `--turns user`, which reads the user turns only."""
    items = prompts["code"][:20] + prompts["zh"][:20]
    against = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": prompt} for prompt, _ in items])
    forms = [
        lambda p: {"arguments": {"prompt": p}},
        lambda p: {"arguments": {"request": {"messages": [{"role": "user", "text": p}], "n": 1}}},
        lambda p: {"arguments": {"payload": json.dumps({"query": p})}},
        lambda p: {"result": p},
        lambda p: {"result": json.dumps({"output": {"lines": p.splitlines()}, "ok": True})},
    ]
    records = []
    for k, (prompt, _) in enumerate(items):
        planted = forms[k % len(forms)](prompt)
        call = {"type": "function", "function": {"name": "lookup", "arguments": planted.get("arguments", {"q": "x"})}}
        records.append({"id": f"tool-{k}", "conversations": [
            {"role": "user", "content": "Please look this up for me."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": planted.get("result", "done")},
            {"role": "assistant", "content": "Here it is."}]})
    by_all, _ = found_ids(tmp_path, "tools", records, against, "all")
    assert by_all == {r["id"] for r in records}, sorted({r["id"] for r in records} - by_all)
    records.append({"id": "clean", "conversations": [{"role": "user", "content": "Hello there, how are you?"},
                                                      {"role": "assistant", "content": "Fine."}]})
    assert found_ids(tmp_path, "tools", records, against, "user")[0] == set()


def test_records_that_cannot_be_checked_are_skipped_by_name_under_skip_and_refused_under_raise(data, tmp_path):
    """A record with no text, an OpenAI `messages` record, an empty conversation, a chat record whose
    tool call breaks the contract: under --on-error skip each is dropped under its reason, the
    rest checked; under raise the first stops the run in one line naming its file and line."""
    question = next(iter(read_records(data["base"] / "gsm8k.jsonl")))["question"]
    odd = [{"id": "no-text", "body": "a record with no text"},
           {"id": "openai", "messages": [{"role": "user", "content": question}]},
           {"id": "empty", "conversations": []},
           {"id": "bad-call", "conversations": [{"role": "user", "content": "hi"}, {
               "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}]
    records = [{"id": "copy", "text": question}, *odd, {"id": "clean", "text": "Nothing of any set in this one."}]
    found, stats = found_ids(tmp_path, "odd", records, data["against"][0], "all", on_error="skip")
    assert found == {"copy"}
    assert stats["dropped"] == {"contaminated": 1, "not_a_document_or_chat_record": 2, "empty_conversation": 1,
                                "bad_tool_arguments": 1}
    skipped = {r["record"]["id"]: (r["reason"], r["line"]) for r in rejects(tmp_path / "odd-all")}
    assert skipped["openai"] == ("not_a_document_or_chat_record", 3) and skipped["empty"] == ("empty_conversation", 4)
    for k, record in enumerate(odd):
        train = write_jsonl(tmp_path / f"raise-{k}.jsonl", [{"id": "clean", "text": "Fine text."}, record])
        result = invoke_cli("decontaminate", "-i", train, "-o", tmp_path / f"raise-{k}", "--against",
                            data["against"][0], "-q")
        assert result.exit_code == 2 and result.stderr.startswith(f"error: {train}:2: "), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / f"raise-{k}" / "stats.json").exists()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "items"])
def test_a_damaged_index_is_built_again_on_resume_never_trusted(data, run, tmp_path, damage):
    """An interrupted run whose evaluation index was damaged on disk (cut short, a byte flipped, its
    items file cut) resumes with the bytes and report of an undamaged run, not a traceback."""
    out, stats = run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    for name in ("_done/part-00001.json", "part-00001.jsonl.zst", "_prepare/found/part-00001.json", "stats.json"):
        (copy / name).unlink()
    index = copy / "_prepare" / "index"
    target = index / ("items.json" if damage == "items" else "ngrams.npz")
    content = bytearray(target.read_bytes())
    if damage == "flipped":
        content[len(content) // 2] ^= 0xFF
    else:
        del content[len(content) // 2:]
    target.write_bytes(bytes(content))
    resumed = run_stage(DecontaminateStage(DecontaminateConfig(against=data["against"])), data["train"], copy,
                        RunOptions(workers=1, shard_size=100, progress=False))
    assert data_files(copy) == data_files(out)
    assert resumed["decontaminate"] == stats["decontaminate"]
