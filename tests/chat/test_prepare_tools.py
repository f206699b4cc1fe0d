"""chat-prepare with tool use and reasoning: OpenAI tool_calls, ShareGPT function_call/observation
and Hermes tags each read into the record contract of `fuelline.records.chat`, the same
conversation in each form giving the same record; every broken tool round dropped under its own
reason, naming the turn; the forms counted in stats.json."""

import orjson

from fuelline.chat.prepare import SPLIT_SALT
from fuelline.io import read_records
from fuelline.records import unit_interval

from .test_prepare import prepare, rejects, write_jsonl

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOLS = [{"type": "function", "function": WEATHER}]
QUESTION, ANSWER = "Weather in Paris and Rome?", "Paris is 21 °C, Rome 25 °C."
FIRST_THOUGHT, LAST_THOUGHT = "Two cities, so two calls.", "Both temperatures are known now."
PARIS, ROME_ERROR, ROMA = '{"temp": 21}', '{"error": "unknown city: Rome"}', '{"temp": 25}'


def call(city: str, id: str | None = None) -> dict:
    """A tool call as the contract writes it: arguments an object."""
    written = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    return {"id": id, **written} if id else written


# One conversation: a system prompt, two parallel calls (one result an error), a second round of
# one call, then the answer; reasoning on the first call and on the answer.
EXPECTED = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "", "reasoning_content": FIRST_THOUGHT, "tool_calls": [call("Paris"), call("Rome")]},
    {"role": "tool", "content": PARIS},
    {"role": "tool", "content": ROME_ERROR},
    {"role": "assistant", "content": "", "tool_calls": [call("Roma")]},
    {"role": "tool", "content": ROMA},
    {"role": "assistant", "content": ANSWER, "reasoning_content": LAST_THOUGHT},
]
EXPECTED_OPENAI = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "", "reasoning_content": FIRST_THOUGHT,
     "tool_calls": [call("Paris", "c1"), call("Rome", "c2")]},
    {"role": "tool", "content": PARIS, "tool_call_id": "c1", "name": "get_weather"},
    {"role": "tool", "content": ROME_ERROR, "tool_call_id": "c2", "name": "get_weather"},
    {"role": "assistant", "content": "", "tool_calls": [call("Roma", "c3")]},
    {"role": "tool", "content": ROMA, "tool_call_id": "c3", "name": "get_weather"},
    {"role": "assistant", "content": ANSWER, "reasoning_content": LAST_THOUGHT},
]


def openai_call(id: str, city: str, as_string: bool) -> dict:
    arguments = {"city": city}
    return {"id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": orjson.dumps(arguments).decode() if as_string else arguments}}


OPENAI = {"id": "openai", "tools": TOOLS, "messages": [
    {"role": "system", "content": "You may call tools."},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": None, "reasoning_content": FIRST_THOUGHT,
     "tool_calls": [openai_call("c1", "Paris", True), openai_call("c2", "Rome", False)]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": PARIS},
    {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": ROME_ERROR},
    {"role": "assistant", "content": "", "tool_calls": [openai_call("c3", "Roma", True)]},
    {"role": "tool", "tool_call_id": "c3", "name": "get_weather", "content": [{"type": "text", "text": ROMA}]},
    {"role": "assistant", "content": ANSWER, "reasoning_content": LAST_THOUGHT},
]}
SHAREGPT = {"id": "sharegpt", "tools": orjson.dumps([WEATHER]).decode(), "conversations": [  # LLaMA-Factory / glaive
    {"from": "system", "value": "You may call tools."},
    {"from": "human", "value": QUESTION},
    {"from": "function_call", "thinking": FIRST_THOUGHT, "value": orjson.dumps(
        [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]
    ).decode()},
    {"from": "observation", "value": PARIS},
    {"from": "observation", "value": ROME_ERROR},
    {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Roma"}}'},
    {"from": "observation", "value": ROMA},
    {"from": "gpt", "value": ANSWER, "thinking": LAST_THOUGHT},
]}
HERMES = {"id": "hermes", "tools": TOOLS, "conversations": [
    {"from": "system", "value": "You may call tools."},
    {"from": "human", "value": QUESTION},
    {"from": "gpt", "value": f"<think>\n{FIRST_THOUGHT}\n</think>\n\n"
                             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                             '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>'},
    {"from": "human", "value": f"<tool_response>\n{PARIS}\n</tool_response>\n<tool_response>\n{ROME_ERROR}\n</tool_response>"},
    {"from": "gpt", "value": '<tool_call>{"name": "get_weather", "arguments": {"city": "Roma"}}</tool_call>'},
    {"from": "tool", "value": f"<tool_response>{ROMA}</tool_response>"},
    {"from": "gpt", "value": f"<think>{LAST_THOUGHT}</think>\n\n{ANSWER}"},
]}
PLAIN = {"id": "plain", "conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}


def without_ids(turns: list[dict]) -> list[dict]:
    """Turns less the call ids, result ids and tool names that only the OpenAI form carries."""
    bare = []
    for turn in turns:
        turn = {k: v for k, v in turn.items() if k not in ("tool_call_id", "name")}
        if "tool_calls" in turn:
            turn["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in turn["tool_calls"]]
        bare.append(turn)
    return bare


def train_records(out) -> dict[str, dict]:
    return {r["id"]: r for r in read_records(out)}


def test_the_three_tool_forms_give_the_contract_record(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [OPENAI, SHAREGPT, HERMES, PLAIN])
    stats = prepare([source], tmp_path / "out", test_size=0.0)
    got = train_records(tmp_path / "out")
    assert got["openai"] == {"id": "openai", "conversations": EXPECTED_OPENAI, "tools": TOOLS}
    assert got["sharegpt"] == {"id": "sharegpt", "conversations": EXPECTED, "tools": TOOLS}
    assert got["hermes"] == {"id": "hermes", "conversations": EXPECTED, "tools": TOOLS}
    assert without_ids(got["openai"]["conversations"]) == got["sharegpt"]["conversations"]
    assert list(got["openai"]) == ["id", "conversations", "tools"]
    assert [list(t) for t in got["openai"]["conversations"][1:3]] == [
        ["role", "content", "reasoning_content", "tool_calls"], ["role", "content", "tool_call_id", "name"]]
    assert orjson.dumps(got["plain"]) == b'{"id":"plain","conversations":[{"role":"user","content":"Hi?"},' \
                                         b'{"role":"assistant","content":"Hello."}]}'
    counters = stats["counters"]
    assert {k: counters[k] for k in counters if k.startswith(("form.", "records_with_"))} == {
        "form.openai_tool_calls": 1, "form.reasoning_content": 1, "form.sharegpt_function_call": 1,
        "form.thinking": 1, "form.hermes_tags": 1, "form.think_tags": 1,
        "records_with_tools": 3, "records_with_tool_calls": 3, "records_with_tool_results": 3,
        "records_with_reasoning": 3}
    assert stats["forms"] == {"openai_tool_calls": 1, "reasoning_content": 1, "sharegpt_function_call": 1,
                              "thinking": 1, "hermes_tags": 1, "think_tags": 1}
    assert stats["schemas"] == {"openai": 1, "sharegpt": 3} and counters["system_turn_removed"] == 3
    assert stats["dropped"] == {}


def test_plain_chats_get_no_tool_counters_and_keep_system_still_keeps(tmp_path):
    record = {"id": "s", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "a"}]}
    stats = prepare([write_jsonl(tmp_path / "in.jsonl", [record, PLAIN])], tmp_path / "out", test_size=0.0,
                    keep_system=True)
    assert "forms" not in stats and not any(k.startswith(("form.", "records_with_")) for k in stats["counters"])
    got = train_records(tmp_path / "out")
    assert got["s"] == {"id": "s", "conversations": [{"role": "system", "content": "S"},
                                                     {"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "a"}]}
    hermes = prepare([write_jsonl(tmp_path / "h.jsonl", [HERMES])], tmp_path / "h", test_size=0.0, keep_system=True)
    assert train_records(tmp_path / "h")["hermes"]["conversations"][0] == {"role": "system",
                                                                           "content": "You may call tools."}
    assert "system_turn_removed" not in hermes["counters"]


def test_eval_prompts_hold_only_the_user_turns(tmp_path):
    ids = [f"h{k}" for k in range(40)]
    held = next(i for i in ids if unit_interval(42, SPLIT_SALT, i) < 0.5)
    source = write_jsonl(tmp_path / "in.jsonl", [{**HERMES, "id": held}])
    stats = prepare([source], tmp_path / "out", test_size=0.5)
    assert stats["outputs"] == {"train": 0, "eval": 1}
    assert list(read_records(tmp_path / "out" / "eval")) == [{"id": held, "turns": [QUESTION]}]


def test_hermes_text_beside_calls_stays_the_content(tmp_path):
    record = {"id": "h", "messages": [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "I will look it up.\n<tool_call>\n"
                                         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'},
        {"role": "tool", "tool_call_id": "x", "content": f"<tool_response>\n{PARIS}\n</tool_response>"},
        {"role": "assistant", "content": "21 °C."},
    ]}
    prepare([write_jsonl(tmp_path / "in.jsonl", [record])], tmp_path / "out", test_size=0.0)
    assert train_records(tmp_path / "out")["h"]["conversations"] == [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "I will look it up.", "tool_calls": [call("Paris")]},
        {"role": "tool", "content": PARIS, "tool_call_id": "x"},  # no call ids to check it against
        {"role": "assistant", "content": "21 °C."},
    ]


def test_reasoning_in_each_form_and_the_empty_think_block(tmp_path):
    records = [
        {"id": "field", "messages": [{"role": "user", "content": "q"},
                                     {"role": "assistant", "content": "a", "reasoning_content": "r"}]},
        {"id": "thinking", "conversations": [{"from": "human", "value": "q"},
                                             {"from": "gpt", "value": "a", "thinking": "r"}]},
        {"id": "tags", "question": "q", "answer": "  <think>\n r \n</think>\n\n a"},
        {"id": "empty", "messages": [{"role": "user", "content": "q"},
                                     {"role": "assistant", "content": "<think>\n\n</think>\n\na"}]},
        {"id": "null", "messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "a", "reasoning_content": None}]},
    ]
    stats = prepare([write_jsonl(tmp_path / "in.jsonl", records)], tmp_path / "out", test_size=0.0)
    got = train_records(tmp_path / "out")
    with_reasoning = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert {k: r["conversations"] for k, r in got.items()} == {
        "field": with_reasoning, "thinking": with_reasoning, "tags": with_reasoning, "empty": plain, "null": plain}
    assert stats["forms"] == {"reasoning_content": 1, "thinking": 1, "think_tags": 2}
    assert stats["counters"]["records_with_reasoning"] == 3


def test_conversations_ending_on_tool_results_keep_their_calls(tmp_path):
    calls = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                              "arguments": {"city": "Paris"}}}]}
    records = [
        {"id": "results", "messages": [{"role": "user", "content": "q"}, calls, {"role": "tool", "content": PARIS}]},
        {"id": "calls", "messages": [{"role": "user", "content": "q"}, calls]},
    ]
    stats = prepare([write_jsonl(tmp_path / "in.jsonl", records)], tmp_path / "out", test_size=0.0)
    expected = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call("Paris")]}]
    assert {k: r["conversations"] for k, r in train_records(tmp_path / "out").items()} == {
        "results": expected, "calls": expected}
    assert stats["counters"]["trailing_tool_results_removed"] == 1
    assert stats["counters"]["records_with_tool_calls"] == 2 and "records_with_tool_results" not in stats["counters"]


def _messages(*turns) -> dict:
    return {"messages": [{"role": "user", "content": "q"}, *turns]}


def _calls(*calls) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def _fn(name="get_weather", arguments='{"city": "Paris"}', id=None) -> dict:
    return {**({"id": id} if id else {}), "type": "function", "function": {"name": name, "arguments": arguments}}


RESULT = {"role": "tool", "content": PARIS}
FINAL = {"role": "assistant", "content": "21 °C."}
BROKEN = [
    ({**_messages(FINAL), "tools": {"name": "get_weather"}}, "bad_tools", "tools must be a list of {'type': 'function'"),
    ({**_messages(FINAL), "tools": "get_weather(city)"}, "bad_tools", "tools is not JSON: 'get_weather(city)'"),
    ({**_messages(FINAL), "tools": [{"description": "no name"}]}, "bad_tools",
     "tools[0].function.name must be a non-empty string, found None"),
    ({**_messages(FINAL), "tools": [{**WEATHER, "parameters": "city"}]}, "bad_tools",
     "tools[0].function.parameters must be a JSON object, found str"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "get_weather(Paris)"},
                        {"from": "observation", "value": PARIS}, {"from": "gpt", "value": "21"}]},
     "bad_tool_call", "conversations[1].value is not JSON: 'get_weather(Paris)'"),
    (_messages({"role": "assistant", "content": '<tool_call>{"name": "get_weather"}'}, RESULT, FINAL),
     "bad_tool_call", "turn 1 (assistant) has a <tool_call> without </tool_call>"),
    (_messages({"role": "assistant", "content": "", "tool_calls": {"name": "get_weather"}}, RESULT, FINAL),
     "bad_tool_call", "messages[1].tool_calls is dict, expected a list"),
    (_messages(_calls({"type": "function", "function": {"arguments": "{}"}}), RESULT, FINAL),
     "tool_call_without_name", "messages[1].tool_calls[0] has no function name"),
    (_messages(_calls(_fn(arguments="{city: Paris}")), RESULT, FINAL),
     "bad_tool_arguments", "messages[1].tool_calls[0] (get_weather): arguments is not JSON: '{city: Paris}'"),
    (_messages(_calls(_fn(arguments="[1, 2]")), RESULT, FINAL),
     "bad_tool_arguments", "messages[1].tool_calls[0] (get_weather): arguments are list, expected a JSON object"),
    (_messages(_calls(_fn()), {"role": "user", "content": f"<tool_response>{PARIS}</tool_response> thanks"}, FINAL),
     "bad_tool_response", "turn 2 (user) has text outside its <tool_response>"),
    (_messages(RESULT, FINAL), "orphan_tool_result", "turn 1 (tool) answers no tool call: turn 0 (user) makes none"),
    (_messages(FINAL, RESULT), "orphan_tool_result", "turn 2 (tool) answers no tool call: turn 1 (assistant) makes none"),
    (_messages(_calls(_fn()), RESULT, RESULT, FINAL), "too_many_tool_results",
     "turn 3 is tool result 2 of a round of 1 call(s)"),
    (_messages(_calls(_fn(id="c1"), _fn(id="c2")), {**RESULT, "tool_call_id": "c9"}, FINAL), "unknown_tool_call_id",
     "turn 2 answers tool_call_id 'c9', not a call of its round (c1, c2)"),
    (_messages(_calls(_fn()), RESULT, _calls(_fn(id="c3")), {**RESULT, "tool_call_id": "c1"}, FINAL),
     "unknown_tool_call_id", "turn 4 answers tool_call_id 'c1', not a call of its round (c3)"),
    (_messages(_calls(_fn()), {"role": "user", "content": "and?"}, FINAL), "missing_tool_result",
     "turn 2 (user) follows tool calls without a tool result"),
    (_messages(_calls(_fn()), RESULT, {"role": "user", "content": "and?"}, FINAL), "roles_not_alternating",
     "turn 3 is user, expected assistant after tool results"),
    (_messages({"role": "assistant", "content": "<think>so the answer is"}), "unclosed_think",
     "turn 1 (assistant) opens <think> without closing it"),
    (_messages({"role": "assistant", "content": "a", "reasoning_content": "r", "thinking": "t"}),
     "conflicting_reasoning", "messages[1] has both 'reasoning_content' and 'thinking'"),
    (_messages({"role": "assistant", "content": "<think>t</think>a", "reasoning_content": "r"}),
     "conflicting_reasoning", "turn 1 (assistant) has a reasoning field and an inline <think> block with different"),
    (_messages({"role": "assistant", "content": "<think>only thoughts</think>"}), "empty_content",
     "turn 1 (assistant) has empty content"),
    (_messages(_calls(_fn()), {"role": "tool", "content": " "}, FINAL), "empty_content", "turn 2 (tool) has empty content"),
    ({"messages": [RESULT, FINAL]}, "first_turn_not_user", "the first turn after the system prompt is tool"),
]


def test_broken_tool_rounds_are_dropped_naming_the_turn(tmp_path):
    lines = [OPENAI] + [record for record, _, _ in BROKEN]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    stats = prepare([source], tmp_path / "out", test_size=0.0)
    expected = {}
    for _, reason, _ in BROKEN:
        expected[reason] = expected.get(reason, 0) + 1
    assert stats["dropped"] == dict(sorted(expected.items()))
    assert stats["outputs"]["train"] == 1
    found = {r["line"]: r for r in rejects(tmp_path / "out")}
    assert sorted(found) == list(range(2, len(lines) + 1))
    for line, (record, reason, mention) in enumerate(BROKEN, start=2):
        schema = "sharegpt" if "conversations" in record else "openai"
        assert found[line]["reason"] == reason and found[line]["record"] == record
        assert found[line]["detail"].startswith(f"{schema}: ") and mention in found[line]["detail"], \
            found[line]["detail"]
    assert stats["counters"]["form.openai_tool_calls"] == 1  # forms count kept records only
