"""Issue 36, classes 1, 2 and 8, in chat prepare: numbers in tool arguments kept exactly to the
rendered text (or the record dropped under a named reason), every `<think>` form read into
reasoning or dropped under a named reason, and no field removed silently (OpenAI's `weight`
kept, a field on the wrong role refused, tool calls without a `content` key accepted)."""

import json

import pytest

from fuelline.chat.regenerate import openai_messages
from fuelline.chat.templates import render
from fuelline.io import read_records

from .test_prepare import prepare, rejects

BIG, NEGATIVE = 123456789012345678901234567890, -9223372036854775809  # beyond orjson's 64-bit integers


def write_exact(path, records):
    """JSONL written by the standard library, whose integers are exact (orjson refuses these)."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def calling(arguments, content_key=True, **assistant) -> dict:
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "count", "arguments": arguments}}], **assistant}
    if content_key:
        call["content"] = None
    return {"messages": [{"role": "user", "content": "count"}, call, {"role": "tool", "content": "ok"},
                         {"role": "assistant", "content": "Done."}]}


def answered(content, **assistant) -> dict:
    return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content, **assistant}]}


def test_big_integers_in_tool_arguments_reach_the_rendered_text_exactly(tmp_path):
    """Issue 36 class 1: {"n": 123456789012345678901234567890} was kept as 1.2345678901234568e+29."""
    records = [{"id": f"{form}-{n}", **calling(arguments)}
               for n in (BIG, NEGATIVE)
               for form, arguments in (("string", json.dumps({"n": n})), ("object", {"n": n}))]
    text_call = json.dumps({"name": "count", "arguments": {"n": BIG}})  # a whole call as JSON text
    records += [{"id": f"hermes-{BIG}", "messages": [{"role": "user", "content": "count"}, {
                     "role": "assistant", "content": f"<tool_call>{text_call}</tool_call>"}]},
                {"id": f"function_call-{BIG}", "conversations": [{"from": "human", "value": "count"},
                                                                  {"from": "function_call", "value": text_call}]}]
    stats = prepare([write_exact(tmp_path / "in.jsonl", records)], tmp_path / "out", test_size=0.0)
    assert stats["outputs"]["train"] == 6 and not stats["dropped"]
    for record in read_records(tmp_path / "out"):
        n = BIG if record["id"].endswith(str(BIG)) else NEGATIVE
        arguments = record["conversations"][1]["tool_calls"][0]["function"]["arguments"]
        assert arguments == {"n": n} and type(arguments["n"]) is int
        text = render(record, "qwen3").text
        assert f'"arguments": {{"n": {n}}}' in text and "e+" not in text
        assert openai_messages(record["conversations"])[1]["tool_calls"][0]["function"]["arguments"] == f'{{"n":{n}}}'


DROPPED = [
    (calling('{"s": "\\ud800"}'), "lone_surrogate", "arguments: the lone surrogate U+D800"),
    (calling('{"x": 1.00000000000000000001}'), "unrepresentable_number", "the number 1.00000000000000000001"),
    (calling('{"x": 1e400}'), "unrepresentable_number", "the number 1e400"),
    (calling('{"x": NaN}'), "bad_tool_arguments", "arguments: NaN is not JSON"),
    (answered('<tool_call>{"name": "f", "arguments": {"s": "\\udc00"}}</tool_call>'), "lone_surrogate",
     "<tool_call> 1: the lone surrogate U+DC00"),
    (answered('<tool_call>{"name": "f", "arguments": {"x": 0.10000000000000001}}</tool_call>'),
     "unrepresentable_number", "the number 0.10000000000000001"),
    (answered("Answer first. <think>hidden</think> then more."), "think_tag_in_content", "after the start"),
    (answered("<think>a</think>b<think>c</think>d"), "several_think_blocks", "2 <think> and 2 </think>"),
    (answered("<think>so the answer is"), "unclosed_think", "opens <think> without closing it"),
    (answered("a", reasoning_content="r <think>x"), "think_tag_in_reasoning", "its reasoning field holds"),
    (answered("r</think>a", reasoning_content="other"), "conflicting_reasoning", "different texts"),
    ({"messages": [{"role": "user", "content": "q", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
                   {"role": "assistant", "content": "a"}]}, "misplaced_field", "user turn with 'tool_calls'"),
    ({"messages": [{"role": "system", "content": "s", "reasoning_content": "r"}, {"role": "user", "content": "q"},
                   {"role": "assistant", "content": "a"}]}, "misplaced_field", "system turn with 'reasoning_content'"),
    ({"messages": [{"role": "user", "content": "q", "weight": 0}, {"role": "assistant", "content": "a"}]},
     "misplaced_field", "user turn with 'weight'"),
    (answered("a", weight=0.5), "bad_weight", "weight must be 0 (not trained on) or 1, found 0.5"),
    (answered("a", weight=True), "bad_weight", "found True"),
]


def test_forms_that_cannot_be_read_exactly_are_dropped_under_their_reason(tmp_path):
    """Issue 36 classes 1, 2, 8: lone surrogates were "not JSON", tags stayed in content, a
    user turn's tool_calls disappeared."""
    source = write_exact(tmp_path / "in.jsonl", [record for record, _, _ in DROPPED])
    stats = prepare([source], tmp_path / "out", test_size=0.0)
    expected: dict[str, int] = {}
    for _, reason, _ in DROPPED:
        expected[reason] = expected.get(reason, 0) + 1
    assert stats["dropped"] == dict(sorted(expected.items()))
    found = {r["line"]: r for r in rejects(tmp_path / "out")}
    for line, (_, reason, mention) in enumerate(DROPPED, start=1):
        assert found[line]["reason"] == reason and mention in found[line]["detail"], found[line]["detail"]


def test_reasoning_forms_weights_and_content_free_calls_are_kept(tmp_path):
    """R1's `reasoning</think>answer` parsed; weight 0 and 1 kept on their turns; an assistant
    message with tool_calls and no content key (valid OpenAI) accepted, not `missing_key`."""
    records = [
        {"id": "r1", **answered("reasoning here</think>\n\nanswer")},
        {"id": "twice", **answered("<think> r </think>a", reasoning_content="r")},
        {"id": "weights", "messages": [{"role": "user", "content": "q"},
                                       {"role": "assistant", "content": "a", "weight": 0},
                                       {"role": "user", "content": "q2"},
                                       {"role": "assistant", "content": "b", "weight": 1}]},
        {"id": "no-content", **calling({"n": 1}, content_key=False)},
        {"id": "tag-in-arguments", **answered('<think>r</think><tool_call>{"name": "f", "arguments": '
                                              '{"s": "<think>x</think>"}}</tool_call>')},
    ]
    stats = prepare([write_exact(tmp_path / "in.jsonl", records)], tmp_path / "out", test_size=0.0)
    assert not stats["dropped"]
    got = {r["id"]: r["conversations"] for r in read_records(tmp_path / "out")}
    assert got["r1"][1] == {"role": "assistant", "content": "answer", "reasoning_content": "reasoning here"}
    assert got["twice"][1] == {"role": "assistant", "content": "a", "reasoning_content": "r"}
    assert [t.get("weight") for t in got["weights"]] == [None, 0, None, 1]
    assert got["no-content"][1]["content"] == "" and got["no-content"][1]["tool_calls"]
    assert got["tag-in-arguments"][1]["reasoning_content"] == "r"
    assert got["tag-in-arguments"][1]["tool_calls"][0]["function"]["arguments"] == {"s": "<think>x</think>"}
    for conversation in got.values():
        assert not any("think>" in t["content"] for t in conversation)
        render(conversation, "qwen3")  # the weight key is part of the record contract: templates take it


def test_templates_refuse_a_weight_other_than_0_or_1():
    with pytest.raises(ValueError, match="turn 1: weight must be 0 .* or 1, found 2"):
        render([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 2}], "chatml")
