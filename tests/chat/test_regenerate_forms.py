"""Issue 36, classes 1, 2 and 8, in regenerate: a server's answer read as chat prepare reads a
turn. Reasoning written inline (`<think>…</think>` first, or DeepSeek-R1's `…</think>`) is
stored as `reasoning_content` exactly as prepare parses it, a tag anywhere else makes the answer
a failure under its reason, integers beyond 64 bits in a tool call's arguments stay exact, and
a turn's `weight` stays on its answer. Echo servers on threads of the test process."""

import orjson
import pytest

from fuelline.chat.schemas import normalize_record
from fuelline.io import read_records
from fuelline.serve.client import ClientConfig
from fuelline.serve.echo import INLINE_REASONING, echo_answer

from .test_regenerate import echo_servers
from .test_regenerate_faults import chats, regenerate_quietly, write_jsonl

TWO_TRIES = ClientConfig(concurrency=2, request_timeout=60.0, attempts=2, backoff=0.01, probe_interval=0.1,
                         failures_to_rest=10**6)


@pytest.mark.parametrize("form", ["think-first", "think-r1"])
def test_inline_reasoning_in_an_answer_is_stored_as_prepare_parses_it(tmp_path, form):
    records = chats(2, turns=2)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    with echo_servers(("--fault", form),) as urls:
        regenerate_quietly(source, tmp_path / "keep.jsonl", urls, client=TWO_TRIES, store_reasoning="keep")
        regenerate_quietly(source, tmp_path / "drop.jsonl", urls, client=TWO_TRIES)
    kept = {r["id"]: r["conversations"] for r in read_records(tmp_path / "keep.jsonl")}
    assert len(kept) == 2 and b"think>" not in (tmp_path / "keep.jsonl").read_bytes()
    for turns in kept.values():
        for k in (1, 3):
            assert turns[k] == {"role": "assistant", "content": echo_answer(turns[:k]),
                                "reasoning_content": INLINE_REASONING}
            inline = {"role": "assistant", "content": "<think>" * (form == "think-first")
                      + f"{INLINE_REASONING}</think>\n\n{turns[k]['content']}"}
            assert normalize_record({"messages": [*turns[:k], inline]}).turns[k] == turns[k]  # prepare's reading
    dropped = (tmp_path / "drop.jsonl").read_bytes()
    assert dropped.count(b"\n") == 2 and b"think>" not in dropped and INLINE_REASONING.encode() not in dropped


@pytest.mark.parametrize("form, reason", [("think-in-middle", "think_tag_in_content"),
                                          ("think-twice", "several_think_blocks"),
                                          ("think-unclosed", "unclosed_think")])
def test_an_answer_with_a_tag_elsewhere_is_a_failure_under_its_reason(tmp_path, form, reason):
    source = write_jsonl(tmp_path / "in.jsonl", chats(2, turns=1))
    with echo_servers(("--fault", form),) as urls:
        stats = regenerate_quietly(source, tmp_path / "out.jsonl", urls, client=TWO_TRIES)
    assert not (tmp_path / "out.jsonl").read_bytes()
    assert stats["dropped"] == {"failed": 2} and stats["failures"] == {reason: 2}
    errors = [orjson.loads(line) for line in (tmp_path / "out.jsonl.errors").read_bytes().splitlines()]
    assert {e["reason"] for e in errors} == {reason}


def test_big_integers_in_a_servers_tool_call_stay_exact_and_weight_stays_on_its_turn(tmp_path):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    records = [{"id": "big", "tools": tools, "conversations": [
        {"role": "user", "content": "count"}, {"role": "assistant", "content": "old", "weight": 0}]}]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    with echo_servers(("--fault", "big-integer-arguments"),) as urls:
        stats = regenerate_quietly(source, tmp_path / "out.jsonl", urls, client=TWO_TRIES, regenerate_turns="all")
    assert stats["records_out"] == 1
    [turn] = [t for t in next(iter(read_records(tmp_path / "out.jsonl")))["conversations"] if t["role"] == "assistant"]
    assert turn["tool_calls"][0]["function"]["arguments"] == {"n": 123456789012345678901234567890,
                                                              "m": -9223372036854775809}
    assert turn["weight"] == 0
    assert b'{"n":123456789012345678901234567890,"m":-9223372036854775809}' in (tmp_path / "out.jsonl").read_bytes()
