"""Evaluation sets as files: the common layouts read by their fields, whatever the file format; a
field named, nested or a list; a missing field a clear error naming the file and line."""

import json

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from fuelline.decontaminate.evalsets import load_eval_set, load_eval_sets, parse_spec
from fuelline.io import read_records

from ..conftest import invoke_cli

# One record in the shape of each common set's file, as it is published.
LAYOUT_RECORDS = {
    "gsm8k": ({"question": "Janet has 3 apples and buys 5 more.", "answer": "#### 8"}, "question"),
    "humaneval": ({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n",
                   "canonical_solution": "    return a + b\n", "test": "", "entry_point": "add"}, "prompt"),
    "mbpp": ({"task_id": 11, "text": "Write a function to remove the first and last occurrence of a character.",
              "code": "def f(): pass", "test_list": []}, "text"),
    "mbpp-sanitized": ({"task_id": 11, "prompt": "Write a python function to remove a character.", "code": "",
                        "test_list": []}, "prompt"),
    "math": ({"problem": "Compute $1+1$.", "solution": "2", "answer": "2", "unique_id": "test/x.json"}, "problem"),
    "mt-bench": ({"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.",
                                                                       "Rewrite it starting every sentence with A."]},
                 "turns"),
    "alpacaeval": ({"instruction": "What are the names of some famous actors?", "output": "", "generator": "x",
                    "dataset": "helpful_base"}, "instruction"),
    "arena-hard": ({"question_id": "abc", "cluster": "c", "turns": [{"content": "Use ABC notation to write a melody."}]},
                   "turns"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUT_RECORDS))
def test_a_common_layout_is_read_by_its_field_without_being_told(tmp_path, layout):
    record, field = LAYOUT_RECORDS[layout]
    path = tmp_path / "test.jsonl"
    path.write_bytes(orjson.dumps(record) + b"\n" + orjson.dumps(record) + b"\n")
    eval_set = load_eval_set(str(path))
    assert eval_set.field == field and eval_set.name == "test" and len(eval_set.items) == 2
    value = record[field]
    expected = [value] if isinstance(value, str) else [t if isinstance(t, str) else t["content"] for t in value]
    assert list(eval_set.items[0].parts) == expected
    named = load_eval_set(f"{path}:{layout.removesuffix('-sanitized')}")  # FILE:LAYOUT names the set too
    assert named.name == layout.removesuffix("-sanitized") and named.field == field


def test_json_arrays_parquet_and_compressed_files_are_read_alike(tmp_path):
    records = [{"id": f"q{i}", "question": f"Question number {i} about apples?"} for i in range(3)]
    (tmp_path / "a.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "b.parquet")
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(r) + b"\n" for r in records)))
    sets = load_eval_sets([str(tmp_path / name) for name in ("a.json", "b.parquet", "c.jsonl.zst")])
    assert [s.name for s in sets] == ["a", "b", "c"]
    for s in sets:
        assert [(i.id, i.parts) for i in s.items] == [(f"q{k}", (f"Question number {k} about apples?",))
                                                      for k in range(3)]


def test_a_nested_field_and_a_name_are_given_in_the_spec(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_bytes(orjson.dumps({"doc": {"query": {"text": "A nested prompt"}}}) + b"\n")
    eval_set = load_eval_set(f"mine={path}:doc.query.text")
    assert (eval_set.name, eval_set.items[0].parts) == ("mine", ("A nested prompt",))
    assert parse_spec("x.jsonl") == (None, "x.jsonl", None)
    assert parse_spec("name=dir/x.jsonl:a.b") == ("name", "dir/x.jsonl", "a.b")


def test_a_missing_field_is_an_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_bytes(b'{"question": "one?"}\n{"query": "two?"}\n')
    with pytest.raises(ValueError, match=rf"^{path}:2: no field 'question' \(its keys: query\)"):
        load_eval_set(str(path))
    with pytest.raises(ValueError, match=rf"^{path}:1: no field 'prompt'"):
        load_eval_set(f"{path}:prompt")


def test_a_file_of_no_known_layout_says_which_field_to_name(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b'{"query": "q", "gold": "a"}\n')
    with pytest.raises(ValueError, match=r"none of the fields of the known layouts.*its keys: gold, query.*"
                                         r"--against .*odd.jsonl:FIELD"):
        load_eval_set(str(path))


def test_on_the_command_line_a_bad_evaluation_set_is_one_error_line(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_bytes(b'{"id": "a", "text": "some training text"}\n')
    (tmp_path / "eval.jsonl").write_bytes(b'{"query": "q"}\n')
    for spec, message in [(f"{tmp_path}/eval.jsonl:question", f"error: {tmp_path}/eval.jsonl:1: no field 'question'"),
                          (f"{tmp_path}/missing.jsonl", f"error: evaluation set {tmp_path}/missing.jsonl: no such file")]:
        result = invoke_cli("decontaminate", "-i", train, "-o", tmp_path / "out", "--against", spec, "-q")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(message) and "Traceback" not in result.stderr


def test_two_sets_of_one_name_must_be_named(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "test.jsonl").write_bytes(b'{"question": "q?"}\n')
    with pytest.raises(ValueError, match="two evaluation sets are called test"):
        load_eval_sets([str(tmp_path / "a" / "test.jsonl"), str(tmp_path / "b" / "test.jsonl")])
    assert [s.name for s in load_eval_sets([f"gsm8k={tmp_path}/a/test.jsonl", str(tmp_path / "b" / "test.jsonl")])] \
        == ["gsm8k", "test"]


QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
OTHER = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts does it take?"


def _found(tmp_path, spec, out, cwd):
    """Runs decontaminate from `cwd` on a training file holding QUESTION; (exit code, stderr, kept ids)."""
    train = tmp_path / "train.jsonl"
    train.write_bytes(orjson.dumps({"id": "copy", "text": QUESTION}) + b"\n"
                      + orjson.dumps({"id": "clean", "text": "Nothing to see in this record at all."}) + b"\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        result = invoke_cli("decontaminate", "-i", train, "-o", out, "--against", spec, "-q")
    kept = {r["id"] for r in read_records(out)} if result.exit_code == 0 else None
    return result.exit_code, result.stderr, kept


def test_a_path_holding_equals_and_colon_is_read_as_meant_or_refused_never_another_file(tmp_path):
    """`split=test/eval.jsonl:question`: the file `split=test/eval.jsonl` with its field question,
    not a set called split reading test/eval.jsonl; when both files exist, a refusal naming both."""
    (tmp_path / "split=test").mkdir()
    (tmp_path / "split=test" / "eval.jsonl").write_bytes(orjson.dumps({"question": QUESTION}) + b"\n")
    (tmp_path / "dir:v2").mkdir()
    (tmp_path / "dir:v2" / "eval.jsonl").write_bytes(orjson.dumps({"question": QUESTION}) + b"\n")
    for k, spec in enumerate(["split=test/eval.jsonl:question", "split=test/eval.jsonl", "dir:v2/eval.jsonl:gsm8k",
                              "mine=split=test/eval.jsonl:question"]):
        code, stderr, kept = _found(tmp_path, spec, tmp_path / f"out-{k}", tmp_path)
        assert (code, kept) == (0, {"clean"}), (spec, stderr)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "eval.jsonl").write_bytes(orjson.dumps({"question": OTHER}) + b"\n")
    code, stderr, _ = _found(tmp_path, "split=test/eval.jsonl:question", tmp_path / "out-both", tmp_path)
    assert code == 2 and stderr.startswith("error: --against split=test/eval.jsonl:question is ambiguous"), stderr
    assert "the file split=test/eval.jsonl, field question" in stderr and "the file test/eval.jsonl, field question, " \
        "as the set split" in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out-both").exists()
    code, stderr, kept = _found(tmp_path, "split=./test/eval.jsonl:question", tmp_path / "out-other", tmp_path)
    assert (code, kept) == (0, {"copy", "clean"}), stderr  # the other file, asked for unambiguously
    code, stderr, _ = _found(tmp_path, "nothing=here.jsonl:question", tmp_path / "out-none", tmp_path)
    assert code == 2 and "no such file" in stderr and "NAME ends at the first '='" in stderr, stderr


def test_blank_items_are_counted_and_said_and_a_set_of_only_blank_items_refused(tmp_path):
    """Items whose field is empty, spaces or only invisible characters are not checked: the report
    says how many, on the command line too; a field blank in every item is the wrong field."""
    against = tmp_path / "eval.jsonl"
    blanks = ("", "   \n", "\u200b\u00ad")  # empty, spaces, only characters that render as nothing
    against.write_bytes(b"".join(orjson.dumps({"question": q}) + b"\n" for q in (QUESTION, *blanks)))
    code, stderr, kept = _found(tmp_path, str(against), tmp_path / "out", tmp_path)
    assert (code, kept) == (0, {"clean"}), stderr
    report = orjson.loads((tmp_path / "out" / "stats.json").read_bytes())["decontaminate"]["sets"]["eval"]
    assert (report["items"], report["items_found"], report["items_blank"]) == (4, 1, 3)
    shown = invoke_cli("decontaminate", "-i", tmp_path / "train.jsonl", "-o", tmp_path / "out", "--against", against)
    assert "eval: 1 of 4 items found, in 1 training records (dropped); not checked: 3 blank items" in shown.output
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b'{"question": ""}\n{"question": " "}\n')
    code, stderr, _ = _found(tmp_path, str(blank), tmp_path / "out-blank", tmp_path)
    assert code == 2 and f"error: evaluation set {blank}: field 'question' is blank in all 2 items" in stderr, stderr
