"""The chat record contract (`fuelline.formats.chat_record`) at every step that reads chat records.

Issue 35: each step checked chat records its own way, so regeneration accepted records (an empty
conversation, a tool call without a name, tool calls on a user turn) that pack and cache build
refused hours of server time later. Here generated records, valid and broken, go through every
step's own check: chat prepare (`schemas.normalize_record` of the record as OpenAI messages),
regenerate's (`_check_record`), pack's (`ChatPackTemplate.record_problem`, then its rendering
through the named `qwen3` template and the real Qwen vocabulary), cache build's (the plan's
`encode_inputs`, under both policies) and dedup's (`compared_text`). What one step accepts every
later step accepts, and every refusal names the same reason at every step.
"""

import copy

import orjson
import pytest
import tokenizers
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuelline.cache.plan import CacheConfig, encode_inputs
from fuelline.chat.encoding_options import ChatEncoding
from fuelline.chat.regenerate import _check_record
from fuelline.chat.schemas import DROP_REASONS as PREPARE_REASONS
from fuelline.chat.schemas import normalize_record
from fuelline.chat.templates import render
from fuelline.dedup.stage import compared_text
from fuelline.formats.chat_record import ORDER_REASONS, REASONS, ChatRecordError, check
from fuelline.io import read_records
from fuelline.io.rejects import Rejects
from fuelline.pack.templates import ChatPackTemplate
from fuelline.records import Drop, chat

PREPARE_OWN_RULES = ("empty_content", "no_complete_exchange")  # prepare's data rules, beyond the contract

# Texts without tags or control tokens: the contract, not a template's special-text rule, decides.
WORDS = st.text(alphabet="ab xy你好🙂\n", min_size=1, max_size=6)
NAMES = st.sampled_from(["get_weather", "lookup", "f"])
ARGUMENTS = st.dictionaries(st.sampled_from(["city", "n", "flag"]),
                            st.one_of(st.integers(-10**6, 10**6), WORDS, st.booleans()), max_size=3)
ODD_IDS = st.sampled_from([None, "", 7, 3.5, True, ["a"], {"id": "a"}])


@st.composite
def conversations(draw) -> list[dict]:
    """A conversation that keeps the contract: exchanges, tool rounds, reasoning, weights, open ends."""
    turns = [{"role": "system", "content": draw(WORDS)}] if draw(st.booleans()) else []
    exchanges = draw(st.integers(1, 3))
    for k in range(exchanges):
        turns.append({"role": "user", "content": draw(WORDS)})
        last = k == exchanges - 1
        if last and draw(st.integers(0, 5)) == 0:
            break  # ends on a user turn: regenerate answers it
        for r in range(draw(st.integers(0, 2))):
            with_ids = draw(st.booleans())
            calls = [{"type": "function", "function": {"name": draw(NAMES), "arguments": draw(ARGUMENTS)}}
                     for _ in range(draw(st.integers(1, 2)))]
            for j, call in enumerate(calls):
                if with_ids:
                    call["id"] = f"call-{k}-{r}-{j}"
            asking = {"role": "assistant", "content": draw(st.sampled_from(["", "Let me look."])), "tool_calls": calls}
            if draw(st.booleans()):
                asking["reasoning_content"] = draw(WORDS)
            turns.append(asking)
            for j in range(draw(st.integers(1, len(calls)))):
                result = {"role": "tool", "content": draw(WORDS)}
                if with_ids and draw(st.booleans()):
                    result["tool_call_id"] = calls[j]["id"]
                if draw(st.booleans()):
                    result["name"] = calls[j]["function"]["name"]
                turns.append(result)
        if last and turns[-1]["role"] == "tool" and draw(st.integers(0, 5)) == 0:
            break  # ends on tool results
        answer = {"role": "assistant", "content": draw(WORDS)}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(WORDS)
        if draw(st.booleans()):
            answer["weight"] = draw(st.sampled_from([0, 1]))
        turns.append(answer)
    return turns


def _any_turn(draw, record, role=None):
    turns = [t for t in record["conversations"] if isinstance(t, dict) and (role is None or t.get("role") == role)]
    return draw(st.sampled_from(turns)) if turns else None


def _any_call(draw, record):
    calls = [c for t in record["conversations"] if isinstance(t, dict) and isinstance(t.get("tool_calls"), list)
             for c in t["tool_calls"] if isinstance(c, dict) and isinstance(c.get("function"), dict)]
    return draw(st.sampled_from(calls)) if calls else None


def _break(draw, record: dict) -> str:
    """Break one rule of `record` in place (when it has what the rule is about); returns what was done."""
    kind = draw(st.sampled_from([
        "id", "no_id", "empty", "not_a_list", "document", "role", "content", "no_content", "not_an_object",
        "user_calls", "user_weight", "system_reasoning", "call_name", "call_arguments", "call_type", "call_id",
        "calls_dict", "weight", "reasoning", "tool_call_id", "tool_name", "tools", "drop_turn", "swap_turns",
        "extra_result", "orphan_result"]))
    turns = record["conversations"]
    if kind == "id":
        record["id"] = draw(ODD_IDS)
    elif kind == "no_id":
        record.pop("id", None)  # an earlier break may have taken it already
    elif kind == "empty":
        turns.clear()
    elif kind == "not_a_list":
        record["conversations"] = draw(st.sampled_from(["Hi", {"role": "user"}, None]))
    elif kind == "document":
        del record["conversations"]
        record["text"] = "a document"
    elif kind == "not_an_object" and turns:  # a record an earlier break emptied has no turn to replace
        turns[draw(st.integers(0, len(turns) - 1))] = draw(st.sampled_from(["Hi", ["user", "Hi"], None]))
    elif kind == "drop_turn" and len(turns) > 1:
        del turns[draw(st.integers(0, len(turns) - 1))]
    elif kind == "swap_turns" and len(turns) > 1:
        i, j = draw(st.integers(0, len(turns) - 1)), draw(st.integers(0, len(turns) - 1))
        turns[i], turns[j] = turns[j], turns[i]
    elif kind == "extra_result":
        turns.insert(draw(st.integers(min(1, len(turns)), len(turns))), {"role": "tool", "content": "extra"})
    elif kind == "orphan_result":
        turns.append({"role": "tool", "content": "late", "tool_call_id": "call-none"})
    elif kind == "tools":
        record["tools"] = draw(st.sampled_from([{"f": {}}, [{"name": "f"}], [{"type": "function", "function": {
            "name": ""}}], [{"type": "function", "function": {"name": "f", "parameters": "{}"}}], ["f"]]))
    elif kind in ("role", "content", "no_content", "user_calls", "user_weight", "system_reasoning", "weight",
                  "reasoning", "tool_call_id", "tool_name"):
        role = {"user_calls": "user", "user_weight": "user", "system_reasoning": "system", "weight": "assistant",
                "reasoning": "assistant", "tool_call_id": "tool", "tool_name": "tool"}.get(kind)
        turn = _any_turn(draw, record, role)
        if turn is None:
            return f"{kind} (nothing to break)"
        if kind == "role":
            turn["role"] = draw(st.sampled_from(["bot", "Assistant", "function", None, 3]))
        elif kind == "content":
            turn["content"] = draw(st.sampled_from([None, 3, ["Hi"], {"text": "Hi"}]))
        elif kind == "no_content":
            turn.pop("content", None)
        elif kind == "user_calls":
            turn["tool_calls"] = draw(st.sampled_from([[], [{"type": "function", "function": {
                "name": "f", "arguments": {}}}]]))
        elif kind == "user_weight":
            turn["weight"] = draw(st.sampled_from([0, 1]))
        elif kind == "system_reasoning":
            turn["reasoning_content"] = "hmm"
        elif kind == "weight":
            turn["weight"] = draw(st.sampled_from([2, -1, True, "1", None, 0.5]))
        elif kind == "reasoning":
            turn["reasoning_content"] = draw(st.sampled_from([3, None, ["a"]]))
        elif kind == "tool_call_id":
            turn["tool_call_id"] = draw(st.sampled_from([7, None, "call-unknown"]))
        else:
            turn["name"] = draw(st.sampled_from([3, None, ["f"]]))
    else:  # the tool calls
        call = _any_call(draw, record)
        turn = _any_turn(draw, record, "assistant")
        if kind == "calls_dict" and turn is not None:
            turn["tool_calls"] = {"name": "f"}
        elif call is None:
            return f"{kind} (nothing to break)"
        elif kind == "call_name":
            value = draw(st.sampled_from(["", " ", None, 3, "absent"]))
            if value == "absent":
                call["function"].pop("name", None)
            else:
                call["function"]["name"] = value
        elif kind == "call_arguments":
            value = draw(st.sampled_from(['{"city": "Paris"}', None, ["a"], "absent", {"n": 1.00000000000000000001},
                                          {"s": "\ud800"}]))
            if value == "absent":
                call["function"].pop("arguments", None)
            else:
                call["function"]["arguments"] = value
        elif kind == "call_type":
            call["type"] = "code"
        elif kind == "call_id":
            call["id"] = 5
    return kind


@st.composite
def records(draw) -> tuple[dict, str]:
    """(a chat record, what was broken in it: "" for none), about half of them broken."""
    record = {"id": draw(st.text(alphabet="abc-0123", min_size=1, max_size=8)), "conversations": draw(conversations())}
    if draw(st.booleans()):
        used = sorted({c["function"]["name"] for t in record["conversations"] for c in t.get("tool_calls", [])})
        record["tools"] = [{"type": "function", "function": {"name": name, "description": "d",
                                                             "parameters": {"type": "object"}}} for name in used]
    broken = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        if isinstance(record.get("conversations"), list):
            broken.append(_break(draw, record))
    return record, ", ".join(broken)


@pytest.fixture(scope="module")
def steps(qwen_dir, tmp_path_factory):
    """pack's chat template (qwen3, the Qwen vocabulary) and the cache plan's config, both keeping every
    accepted conversation (min_loss_tokens 0), and a scratch directory."""
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    pack = ChatPackTemplate(tokenizer, encoding=ChatEncoding(chat_template="qwen3", min_loss_tokens=0),
                            tokenizer_dir=str(qwen_dir))
    return pack, qwen_dir, tmp_path_factory.mktemp("contract")


def regenerate_reason(record) -> str | None:
    try:
        _check_record(record, "in.jsonl", 1)
    except ChatRecordError as e:
        assert str(e).startswith("in.jsonl:1: ") and e.where == "in.jsonl:1"
        return e.reason
    return None


def dedup_reason(record) -> str | None:
    try:
        text = compared_text(record, "user_turns", "in.jsonl", 1)
    except ChatRecordError as e:
        assert e.where == "in.jsonl:1"
        return e.reason
    assert isinstance(text, str)
    return None


def prepare(record) -> dict | Drop:
    """chat prepare of `record`'s turns given as OpenAI messages: the train record it writes, or its Drop."""
    raw = {"messages": record["conversations"], **({"tools": record["tools"]} if "tools" in record else {})}
    read = normalize_record(raw, "openai")
    return read if isinstance(read, Drop) else chat("prepared", read.turns, None, read.tools)


def _writable(record) -> bool:
    try:
        orjson.dumps(record)
    except TypeError:
        return False
    return True


def cache_reasons(records_: list[dict], directory, tokenizer_dir) -> tuple[dict[int, str], int, str | None]:
    """The cache plan's refusals by line (on_error=skip), its samples, and the reason it stops on (raise)."""
    source = directory / "records.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records_))
    config = CacheConfig(layers=[0], chat_template="qwen3", min_loss_tokens=0)
    config.errors.on_error = "skip"
    rejects = Rejects(directory / "rejects.jsonl.zst")

    class Discard:
        def write(self, data):
            return len(data)

    encoded = encode_inputs([str(source)], tokenizer_dir, config, Discard(), Discard(), rejects, progress=False)
    rejects.close()
    refused = {r["line"]: r["reason"] for r in read_records(directory / "rejects.jsonl.zst")} if rejects.written else {}
    (directory / "rejects.jsonl.zst").unlink(missing_ok=True)
    config.errors.on_error = "raise"
    try:
        encode_inputs([str(source)], tokenizer_dir, config, Discard(), Discard(), Rejects(), progress=False)
    except ChatRecordError as e:
        assert e.where.startswith(f"{source}:")
        return refused, len(encoded.samples), e.reason
    return refused, len(encoded.samples), None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(records(), min_size=1, max_size=8))
def test_what_one_step_accepts_every_later_step_accepts_and_refusals_agree(steps, batch):
    pack, tokenizer_dir, directory = steps
    expected = []
    for record, broken in batch:
        record = copy.deepcopy(record)
        drop = check(record)
        reason = drop.reason if drop else None
        event(f"contract: {reason or 'accepted'}")
        if not broken:
            assert reason is None, f"a conversation built valid is refused: {drop}"
        assert reason is None or reason in REASONS
        # regenerate, pack and dedup: the same verdict, under the same reason
        assert regenerate_reason(record) == reason, broken
        problem = pack.record_problem(record)
        assert (problem.reason if problem else None) == reason, broken
        assert dedup_reason(record) == reason, broken
        if reason is None:  # renders through a real template, nothing dropped: every supervised token kept
            rendered = pack.render([record])
            assert rendered.drops == [] and len(rendered.lengths) == 1
        _prepare_agrees(pack, record, reason, broken)
        if _writable(record):  # a lone surrogate cannot be written to a file: the reader's case, not the contract's
            expected.append((record, reason))
    if not expected:
        return
    refused, samples, stopped = cache_reasons([r for r, _ in expected], directory, tokenizer_dir)
    expected = [reason for _, reason in expected]
    assert refused == {line: reason for line, reason in enumerate(expected, start=1) if reason is not None}
    assert samples == expected.count(None)
    assert stopped == next((reason for reason in expected if reason is not None), None)


def _prepare_agrees(pack, record, reason, broken) -> None:
    """chat prepare reads raw records more leniently (ids of any kind get a fallback, arguments may be JSON
    text, an empty field on another role's turn is dropped), so: what it writes keeps the contract; a record
    the contract accepts it keeps or drops under its own data rules only; an order the contract refuses it
    refuses under the same reason."""
    if not isinstance(record.get("conversations"), list):
        return
    shape = check({**record, "id": "x"})  # prepare gives every record an id
    prepared = prepare(record)
    if isinstance(prepared, Drop):
        assert prepared.reason in PREPARE_REASONS
        if shape is None:
            assert prepared.reason in PREPARE_OWN_RULES, (broken, prepared)
        elif shape.reason in ORDER_REASONS:
            assert prepared.reason == shape.reason, (broken, prepared, shape)
        return
    if shape is not None:
        assert shape.reason not in ORDER_REASONS, (broken, shape)
    assert check(prepared) is None, (broken, check(prepared))
    assert pack.record_problem(prepared) is None and pack.render([prepared]).drops == []


GAPS = [  # issue 35: records regeneration sent to the servers, refused only by pack and cache build
    ({"id": "empty", "conversations": []}, "empty_conversation"),
    ({"id": "nameless", "conversations": [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "", "arguments": {}}}]}]}, "tool_call_without_name"),
    ({"id": "user-calls", "conversations": [{"role": "user", "content": "Time?", "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": {}}}]}, {"role": "assistant", "content": "9"}]},
     "misplaced_field"),
    ({"id": 7, "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
     "bad_id"),
]


@pytest.mark.parametrize("record, reason", GAPS, ids=[reason for _, reason in GAPS])
def test_the_reported_gaps_are_refused_alike_at_every_step(steps, record, reason):
    pack, tokenizer_dir, directory = steps
    assert check(record) == Drop(reason, check(record).detail)
    assert regenerate_reason(record) == pack.record_problem(record).reason == dedup_reason(record) == reason
    refused, samples, stopped = cache_reasons([record], directory, tokenizer_dir)
    assert (refused, samples, stopped) == ({1: reason}, 0, reason)
    if reason != "bad_id":  # the templates check the turns (their caller, the record)
        with pytest.raises(ChatRecordError) as error:
            render(record, "qwen3")
        assert error.value.reason == reason
