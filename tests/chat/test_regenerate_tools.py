"""Regeneration of conversations with tools and reasoning, against real echo servers on 127.0.0.1:
what the server receives (tools, tool calls and results in OpenAI form, logged by the server),
tool-call answers stored with dict arguments, `regenerate_turns` last regenerating only the final
answer, `store_reasoning` keep, resume, and tool-call arguments that are not JSON."""

import json
import re

import orjson
import pytest

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.formats.chat_record import ChatRecordError
from fuelline.serve.client import ClientConfig, Completion
from fuelline.serve.echo import echo_answer, echo_call, echo_reasoning

from .test_regenerate import FAST_CLIENT, cli, echo_servers, read, regenerate_args, write

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
AGENT = {"id": "agent", "tools": TOOLS, "conversations": [
    {"role": "system", "content": "You plan trips."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two lookups.", "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
    {"role": "tool", "content": "18 C, cloudy", "tool_call_id": "abc", "name": "get_weather"},
    {"role": "tool", "content": "14:05"},
    {"role": "assistant", "content": "Cloudy, 18 C; it is 14:05."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "day": 1}}}]},
    {"role": "tool", "content": "20 C, sunny"},  # answers the call that is regenerated: left out
]}
# What the server must receive for AGENT's final turn, written out as the OpenAI API has it.
AGENT_REQUEST = [
    {"role": "system", "content": "You plan trips."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}],
     "reasoning_content": "Two lookups.", "reasoning": "Two lookups."},
    {"role": "tool", "content": "18 C, cloudy", "tool_call_id": "abc", "name": "get_weather"},
    {"role": "tool", "content": "14:05", "tool_call_id": "call_2_1", "name": "get_time"},
    {"role": "assistant", "content": "Cloudy, 18 C; it is 14:05."},
    {"role": "user", "content": "And tomorrow?"},
]
ANSWERED = {"id": "answered", "tools": TOOLS, "conversations": [
    {"role": "user", "content": "Time?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "get_time", "arguments": {}}},
        {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "content": "3 C", "tool_call_id": "w1"},  # the results in another order than the calls
    {"role": "tool", "content": "09:00", "tool_call_id": "t1"},
    {"role": "assistant", "content": "It is nine, and 3 C."},
]}
PLAIN = {"id": "plain", "conversations": [
    {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
    {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Fine"},
]}
CALLS = {"id": "calls", "tools": TOOLS, "conversations": [  # tools, no tool results: auto regenerates every turn
    {"role": "user", "content": "Weather in Rome?"}, {"role": "assistant", "content": "Sunny"},
    {"role": "user", "content": "And the time?"}, {"role": "assistant", "content": "Noon"},
]}


def logged(path) -> dict[str, list[dict]]:
    """The requests an echo server logged, by the content of their first user message."""
    requests: dict[str, list[dict]] = {}
    for body in map(orjson.loads, path.read_bytes().splitlines()):
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        requests.setdefault(first, []).append(body)
    return requests


def decoded(messages: list[dict]) -> list[dict]:
    """Messages with each tool call's arguments string parsed; the strings must be strings on the wire."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            assert all(isinstance(c["function"]["arguments"], str) for c in calls)
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in calls]}
        out.append(m)
    return out


def tool_call(messages: list[dict]) -> dict:
    """The assistant turn the echo server's tool call to `messages` must be stored as."""
    name, arguments = echo_call(messages, TOOLS)
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_requests_carry_tools_and_history_in_openai_form_and_auto_regenerates_only_the_last_turn(tmp_path):
    source = write(tmp_path / "in.jsonl", [AGENT, ANSWERED, PLAIN])
    with echo_servers(("--log-requests", str(tmp_path / "log.jsonl")),) as urls:
        stats = regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT),
                           progress=False)
    requests, out = logged(tmp_path / "log.jsonl"), read(tmp_path / "out.jsonl")
    assert [len(requests[k]) for k in ("Weather and time in Paris?", "Time?", "Hello")] == [1, 1, 2]
    agent_request = requests["Weather and time in Paris?"][0]
    assert agent_request["tools"] == TOOLS
    assert decoded(agent_request["messages"]) == decoded(AGENT_REQUEST)
    assert decoded(requests["Time?"][0]["messages"])[1:4] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_time", "arguments": {}}},
            {"id": "w1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "3 C", "tool_call_id": "w1", "name": "get_weather"},
        {"role": "tool", "content": "09:00", "tool_call_id": "t1", "name": "get_time"}]
    assert all("tools" not in r for r in requests["Hello"])

    agent = out["agent"]  # the final answer regenerated on the data's own history; its old tool result left out
    assert orjson.dumps(agent["conversations"][:7]) == orjson.dumps(AGENT["conversations"][:7])
    assert agent["conversations"][7:] == [{"role": "assistant", "content": echo_answer(AGENT_REQUEST)}]
    assert agent["tools"] == TOOLS
    regenerated = agent["meta"]["regenerated"]
    assert (regenerated["turns"], regenerated["turn_indexes"], regenerated["tool_results_left_out"]) == ("last", [7], 1)
    answered = out["answered"]
    assert orjson.dumps(answered["conversations"][:4]) == orjson.dumps(ANSWERED["conversations"][:4])
    assert answered["conversations"][4:] == [
        {"role": "assistant", "content": echo_answer(ANSWERED["conversations"][:4])}]
    assert "tool_results_left_out" not in answered["meta"]["regenerated"]

    plain = out["plain"]  # no tools: every answer regenerated, and nothing new in the record
    turns = plain["conversations"]
    assert turns == [PLAIN["conversations"][0], {"role": "assistant", "content": echo_answer(turns[:1])},
                     PLAIN["conversations"][2], {"role": "assistant", "content": echo_answer(turns[:3])}]
    assert set(plain) == {"id", "conversations", "meta"}
    assert set(plain["meta"]["regenerated"]) == {"model", "options", "sampling", "turns", "turn_indexes",
                                                 "finish_reasons"}
    assert (plain["meta"]["regenerated"]["turns"], plain["meta"]["regenerated"]["turn_indexes"]) == ("all", [1, 3])
    assert stats["counters"]["last_turn_only"] == 2 and stats["counters"]["requests"] == 4


def test_tool_call_answers_are_stored_with_dict_arguments(tmp_path):
    source = write(tmp_path / "in.jsonl", [CALLS, PLAIN])
    with echo_servers(("--tools", "call", "--log-requests", str(tmp_path / "log.jsonl")),) as urls:
        stats = regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT),
                           progress=False)
    out, requests = read(tmp_path / "out.jsonl"), logged(tmp_path / "log.jsonl")
    turns = out["calls"]["conversations"]
    assert turns == [CALLS["conversations"][0], tool_call(turns[:1]), CALLS["conversations"][2], tool_call(turns[:3])]
    assert out["calls"]["meta"]["regenerated"]["finish_reasons"] == ["tool_calls", "tool_calls"]
    assert b"call-" not in (tmp_path / "out.jsonl").read_bytes()  # the server's own call ids are not kept
    second = decoded(requests["Weather in Rome?"][1]["messages"])  # the regenerated call, sent back as history
    assert second[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": turns[1]["tool_calls"][0]["function"]}]}
    assert [t["content"] for t in out["plain"]["conversations"][1::2]] == [
        echo_answer(out["plain"]["conversations"][:1]), echo_answer(out["plain"]["conversations"][:3])]
    assert stats["finish_reasons"] == {"stop": 2, "tool_calls": 2}


def test_turns_all_refuses_conversations_with_tool_results_and_meta_records_every_option(tmp_path):
    """Issue 36 class 3: `--turns all` (now --regenerate-turns) regenerated AGENT's tool calls and kept the
    old results as their answers, and meta said neither `turns` nor `--reasoning keep` (now --store-reasoning)."""
    source = write(tmp_path / "in.jsonl", [AGENT, CALLS])
    with echo_servers(("--tools", "call", "--log-requests", str(tmp_path / "log.jsonl")),) as urls:
        result = cli(*regenerate_args(source, tmp_path / "out.jsonl", urls, "--regenerate-turns", "all",
                                      "--store-reasoning", "keep", "--preset", "qwen3", "--top-k", "5"))
    assert result.exit_code == 0, result.stderr
    assert "dropped: tool_results_under_turns_all 1" in result.stdout
    out = read(tmp_path / "out.jsonl")
    assert set(out) == {"calls"}  # tools but no tool results: every turn regenerated
    assert "Weather and time in Paris?" not in logged(tmp_path / "log.jsonl")  # no request for the refused one
    [error] = map(orjson.loads, (tmp_path / "out.jsonl.errors").read_bytes().splitlines())
    assert error["id"] == "agent" and error["reason"] == "tool_results_under_turns_all"
    assert "--regenerate-turns last" in error["detail"]
    regenerated = out["calls"]["meta"]["regenerated"]
    assert (regenerated["turns"], regenerated["turn_indexes"]) == ("all", [1, 3])
    assert regenerated["options"] == {
        "preset": "qwen3", "temperature": None, "top_p": None, "top_k": 5, "min_p": None, "max_tokens": 4096,
        "thinking": None, "drop_truncated": False, "keep_empty_answers": False,
        "finish_reasons": ["stop", "length"], "regenerate_turns": "all", "store_reasoning": "keep"}
    assert regenerated["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 5, "min_p": 0.0, "max_tokens": 4096}
    stats = orjson.loads((tmp_path / "out.stats.json").read_bytes())
    assert stats["dropped"] == {"tool_results_under_turns_all": 1} and stats["records_in"] == 2


def test_turns_last_on_plain_conversations_keeps_earlier_answers_byte_for_byte(tmp_path):
    source = write(tmp_path / "in.jsonl", [PLAIN])
    with echo_servers((),) as urls:
        regenerate([source], tmp_path / "out.jsonl", urls,
                   RegenerateConfig("echo", regenerate_turns="last", client=FAST_CLIENT), progress=False)
    record = read(tmp_path / "out.jsonl")["plain"]
    assert orjson.dumps(record["conversations"][:3]) == orjson.dumps(PLAIN["conversations"][:3])
    assert record["conversations"][3]["content"] == echo_answer(PLAIN["conversations"][:3])
    assert record["meta"]["regenerated"]["turns"] == "last" and record["meta"]["regenerated"]["turn_indexes"] == [3]


def test_reasoning_keep_stores_it_apart_and_sends_it_back_drop_leaves_it_out(tmp_path):
    source = write(tmp_path / "in.jsonl", [PLAIN])
    with echo_servers(("--reasoning", "--log-requests", str(tmp_path / "log.jsonl")),) as urls:
        kept = cli(*regenerate_args(source, tmp_path / "keep.jsonl", urls, "--store-reasoning", "keep"))
        assert kept.exit_code == 0, kept.stderr
        regenerate([source], tmp_path / "drop.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT),
                   progress=False)
    turns = read(tmp_path / "keep.jsonl")["plain"]["conversations"]
    for k in (1, 3):
        assert turns[k] == {"role": "assistant", "content": echo_answer(turns[:k]),
                            "reasoning_content": echo_reasoning(turns[:k])}
        assert "REASONING" not in turns[k]["content"]
    second = logged(tmp_path / "log.jsonl")["Hello"][1]["messages"]
    assert second[1]["reasoning_content"] == echo_reasoning(turns[:1])
    assert b"REASONING" not in (tmp_path / "drop.jsonl").read_bytes()


def test_bad_tool_arguments_are_a_named_failure_retried_then_in_the_errors_file(tmp_path):
    source = write(tmp_path / "in.jsonl", [CALLS, ANSWERED])
    config = RegenerateConfig("echo", client=ClientConfig(concurrency=4, attempts=2, backoff=0.01))
    with echo_servers(("--fault", "bad-tool-arguments"),) as urls:
        stats = regenerate([source], tmp_path / "out.jsonl", urls, config, progress=False, warn=lambda m: None)
    errors = [orjson.loads(line) for line in (tmp_path / "out.jsonl.errors").read_bytes().splitlines()]
    assert sorted(e["id"] for e in errors) == ["answered", "calls"]
    assert all(e["reason"] == "bad_tool_arguments" and e["attempts"] == 2 and "lookup" in e["detail"]
               and '{"city": "Par' in e["detail"] for e in errors)
    assert stats["failures"] == {"bad_tool_arguments": 2} and stats["dropped"] == {"failed": 2}
    assert not (tmp_path / "out.jsonl").read_bytes()


def test_resume_keeps_tool_calls_and_reasoning(tmp_path):
    records = [{**CALLS, "id": f"calls-{i}", "conversations": [{**CALLS["conversations"][0], "content": f"Rome {i}?"},
                                                                *CALLS["conversations"][1:]]} for i in range(12)]
    records += [{**AGENT, "id": f"agent-{i}"} for i in range(4)]
    source = write(tmp_path / "in.jsonl", records)
    config = RegenerateConfig("echo", store_reasoning="keep", client=ClientConfig(concurrency=1, attempts=1))
    with echo_servers(("--tools", "call", "--reasoning", "--fault", "bad-tool-arguments", "--fault-every", "3"),
                      ("--tools", "call", "--reasoning")) as urls:
        first = regenerate([source], tmp_path / "out.jsonl", urls[:1], config, progress=False, warn=lambda m: None)
        again = regenerate([source], tmp_path / "out.jsonl", urls[1:], config, resume=True, progress=False)
    assert 0 < first["records_out"] < len(records)
    assert again["counters"]["resumed"] == first["records_out"] and again["dropped"] == {}
    out = read(tmp_path / "out.jsonl")
    assert len(out) == len(records) == sum(1 for _ in (tmp_path / "out.jsonl").read_bytes().splitlines())
    for record in records:
        turns, regenerated = out[record["id"]]["conversations"], out[record["id"]]["meta"]["regenerated"]
        indexes = regenerated.get("turn_indexes", [i for i, t in enumerate(turns) if t["role"] == "assistant"])
        assert len(indexes) == len(regenerated["finish_reasons"]) > 0
        for k in indexes:
            assert turns[k] == {**tool_call(turns[:k]), "reasoning_content": echo_reasoning(turns[:k])}
    assert again["finish_reasons"] == {"tool_calls": 12 * 2 + 4}  # both runs' answers
    assert not (tmp_path / "out.jsonl.errors").read_bytes()


def test_a_tool_call_finish_reason_is_taken_only_for_a_request_with_tools():
    config = RegenerateConfig("echo")
    call = Completion("", "tool_calls", 5, "http://s",
                      [{"type": "function", "function": {"name": "f", "arguments": {}}}])
    assert config.answer_problem(call, tools=True) is None
    reason, detail = config.answer_problem(call)
    assert reason == "finish_tool_calls" and "calling f" in detail and "not stop or length" in detail
    assert config.answer_problem(Completion("", "stop", 1, "http://s"), tools=True)[0] == "empty_answer"


@pytest.mark.parametrize("turn, reason, message", [
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_time", "arguments": '{"tz": "CET"}'}}]}, "bad_tool_arguments",
     "turn 1: tool_calls[0].function.arguments must be a JSON object (a dict), found str"),
    ({"role": "assistant", "content": "", "tool_calls": {"name": "get_time"}}, "bad_tool_call",
     "turn 1: tool_calls must be a list"),
    ({"role": "tool", "content": "09:00", "tool_call_id": 7}, "wrong_type", "turn 1: tool_call_id must be a string, "
                                                                            "found int"),
    ({"role": "function", "content": "09:00"}, "unknown_role", "turn 1: role 'function' is not one of system, user"),
    # issue 35: these were regenerated (server time spent), then refused by pack and cache build
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "", "arguments": {}}}]}, "tool_call_without_name",
     "turn 1: tool_calls[0].function.name must be a non-empty string, found ''"),
    ({"role": "user", "content": "And now?", "tool_calls": [{"type": "function", "function": {
        "name": "get_time", "arguments": {}}}]}, "misplaced_field",
     "turn 1: tool_calls belongs on an assistant turn, not on a user turn"),
])
def test_malformed_tool_turns_are_refused_before_any_request_naming_the_line_turn_and_reason(tmp_path, turn, reason,
                                                                                               message):
    good = {"id": "b", "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    source = write(tmp_path / "bad.jsonl", [{"id": "a", "tools": TOOLS, "conversations": [
        {"role": "user", "content": "Time?"}, turn]}, good])
    with echo_servers((),) as urls:
        with pytest.raises(ChatRecordError, match=re.escape(f"bad.jsonl:1: {message}")) as error:
            regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT),
                       progress=False)
    assert error.value.reason == reason and str(error.value).endswith(f"({reason})")
    assert not (tmp_path / "out.jsonl").exists()  # refused up front: nothing was regenerated
