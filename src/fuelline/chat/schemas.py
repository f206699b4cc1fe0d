"""Chat data in the wild, in four schemas (`SCHEMAS`, recognized by their keys) and the tool-use and
reasoning forms of `FORMS`, normalized to one: the chat record's turns (`fuelline.records.chat`).
docs/chat.md ("Schemas", "Tools and reasoning") tables what each is recognized by and read as.

Every form is read into the same structured fields, so no tag is left in a content: tool-call
arguments under `fuelline.io.tool_arguments`' rules, reasoning by `fuelline.chat.reasoning`. A
field that belongs to another role (`ROLE_FIELDS`) drops the record as `misplaced_field`, since
removing it would change the data unsaid.

Normalizing only maps shapes and roles; `validate` then applies the chat record contract
(`fuelline.formats.chat_record`, which every later step checks) and the rules the reference
distillation pipeline adds, each under its own drop reason (`DROP_REASONS`): every content a
non-empty string, except an assistant turn's with tool calls, and at least one complete
exchange. A conversation that ends on a user turn or on tool results keeps its complete
exchanges (the caller counts it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from fuelline.chat.reasoning import REASONS as REASONING_REASONS
from fuelline.chat.reasoning import ReasoningError, split_reasoning
from fuelline.formats import chat_record
from fuelline.formats.chat_record import ChatRecordError
from fuelline.io import json_exact
from fuelline.io.tool_arguments import ArgumentsError, parse_arguments, parse_json
from fuelline.records import Drop

SCHEMAS = ("sharegpt", "openai", "alpaca", "qa")
FUNCTION_CALL = "function_call"  # ShareGPT's turn of tool calls; an assistant turn once read
ROLE_NAMES = {  # a schema's role name, lower-cased, as a role of the chat record
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "assistant": "assistant", "model": "assistant",
    "system": "system",
    "tool": "tool", "observation": "tool",
    FUNCTION_CALL: FUNCTION_CALL,
}
SCHEMA_KEYS = {"conversations": "sharegpt", "messages": "openai", "instruction": "alpaca"}  # the key that announces it
QA_KEYS = (("question", "answer"), ("query", "response"), ("prompt", "completion"))
FORMS = ("openai_tool_calls", "sharegpt_function_call", "hermes_tags", "reasoning_content", "thinking", "think_tags")
REASONING_KEYS = ("reasoning_content", "thinking")
# Fields that belong to one role (the record's, and a raw turn's `thinking`): on another role's
# turn they are refused, never silently removed.
ROLE_FIELDS = {**chat_record.ROLE_FIELDS, "thinking": "assistant"}
# The record contract's reasons, then those of reading a raw record and of prepare's own rules.
DROP_REASONS = (*chat_record.REASONS, "unknown_schema", "missing_key", "empty_content", "no_complete_exchange",
                "bad_tool_response", *REASONING_REASONS)
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


@dataclass
class Conversation:
    """A record read and validated: its turns, its tool schemas (None when it has none), which
    role's turns were cut off the end (`user`, `tool` or None), and the `FORMS` it was written in."""

    schema: str
    turns: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    trailing_removed: str | None = None
    forms: set[str] = field(default_factory=set)


def detect_schema(record: dict[str, Any]) -> str | None:
    """The schema a record's keys announce, or None; checked in the order of SCHEMAS."""
    found = next((schema for key, schema in SCHEMA_KEYS.items() if key in record), None)
    if found is None and any(q in record and a in record for q, a in QA_KEYS):
        return "qa"
    return found


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ChatRecordError("wrong_type", f"{where} is {type(value).__name__}, expected a string")
    return value


def _require(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise ChatRecordError("missing_key", f"{where} has no {key!r} (keys: {', '.join(sorted(obj)) or 'none'})")
    return obj[key]


def _json(text: str, where: str, reason: str) -> Any:
    try:
        return json_exact.loads(text)
    except orjson.JSONDecodeError:
        short = text if len(text) <= 80 else text[:77] + "..."
        raise ChatRecordError(reason, f"{where} is not JSON: {short!r}") from None


def _call_json(text: str, where: str) -> Any:
    """A call written as JSON text (a function_call value, a <tool_call> block): its arguments are
    text a model wrote, read under `fuelline.io.tool_arguments`' rules."""
    try:
        return parse_json(text, where, not_json="bad_tool_call")
    except ArgumentsError as e:
        raise ChatRecordError(e.reason, e.detail) from None


def _role(value: Any, where: str) -> str:
    name = _text(value, where)
    try:
        return ROLE_NAMES[name.strip().lower()]
    except KeyError:
        raise ChatRecordError("unknown_role", f"{where} is {name!r}; known: {', '.join(ROLE_NAMES)}") from None


def _openai_content(content: Any, where: str) -> str:
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatRecordError("wrong_type", f"{where}[{j}] is a {kind!r} part; only text parts are supported")
            texts.append(_text(_require(part, "text", f"{where}[{j}]"), f"{where}[{j}].text"))
        return "\n".join(texts)
    return _text(content, where)


def _call(call: Any, where: str) -> dict[str, Any]:
    """One tool call in the contract's shape, from OpenAI's `{"id"?, "type", "function": {…}}` or
    the bare `{"name", "arguments"}` of ShareGPT and Hermes; arguments parsed when a JSON string."""
    if not isinstance(call, dict):
        raise ChatRecordError("bad_tool_call", f"{where} is {type(call).__name__}, expected an object")
    if call.get("type", "function") != "function":
        raise ChatRecordError("bad_tool_call", f"{where}.type is {call['type']!r}; only function calls are supported")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise ChatRecordError("bad_tool_call", f"{where}.function is {type(function).__name__}, expected an object")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ChatRecordError("tool_call_without_name", f"{where} has no function name")
    try:
        arguments = parse_arguments(function.get("arguments", {}), f"{where} ({name})")
    except ArgumentsError as e:
        raise ChatRecordError(e.reason, e.detail) from None
    read: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") not in (None, ""):
        read = {"id": _text(call["id"], f"{where}.id"), **read}
    return read


def _function_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """A ShareGPT `function_call` value: the JSON of one call or of a list of them."""
    parsed = _call_json(_text(value, where), where)
    if not isinstance(parsed, list):
        return [_call(parsed, where)]
    if not parsed:
        raise ChatRecordError("bad_tool_call", f"{where} is an empty list of calls")
    return [_call(call, f"{where}[{j}]") for j, call in enumerate(parsed)]


def _tool_schema(tool: Any) -> Any:
    """A function schema, bare or in OpenAI's shape, in OpenAI's shape with its name, description and
    parameters (nulls left out); what is not one is left for the record contract to name."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return tool
    return {"type": tool.get("type", "function"),
            "function": {k: function[k] for k in ("name", "description", "parameters") if function.get(k) is not None}}


def _tools(record: dict) -> list[dict[str, Any]] | None:
    """The record's `tools` (a list of function schemas, or its JSON) in OpenAI's shape, checked by the
    record contract; None when absent or empty."""
    tools = record.get("tools")
    if isinstance(tools, str):
        tools = _json(tools, "tools", "bad_tools") if tools.strip() else None
    tools = [_tool_schema(tool) for tool in tools] if isinstance(tools, list) else tools
    chat_record.require_tools(tools)
    return tools or None


def _structured(obj: dict, turn: dict[str, Any], where: str, forms: set[str]) -> None:
    """Add a turn object's own reasoning, tool calls, weight, `tool_call_id` and `name` to `turn`;
    a field of another role's (ROLE_FIELDS) is refused, unless empty."""
    for key, owner in ROLE_FIELDS.items():
        if obj.get(key) not in (None, "", []) and turn["role"] != owner:
            raise ChatRecordError("misplaced_field", f"{where} is a {turn['role']} turn with {key!r}, which belongs on "
                                             f"{'an' if owner == 'assistant' else 'a'} {owner} turn")
    if turn["role"] == "assistant":
        if "weight" in obj:  # its value is the record contract's to check
            turn["weight"] = obj["weight"]
        for key in REASONING_KEYS:
            if obj.get(key) not in (None, ""):
                if "reasoning_content" in turn:
                    raise ChatRecordError("conflicting_reasoning",
                                          f"{where} has both {REASONING_KEYS[0]!r} and {key!r}")
                turn["reasoning_content"] = _text(obj[key], f"{where}.{key}")
                forms.add(key)
        calls = obj.get("tool_calls")
        if calls not in (None, []):
            if not isinstance(calls, list):
                raise ChatRecordError("bad_tool_call", f"{where}.tool_calls is {type(calls).__name__}, expected a list")
            if "tool_calls" in turn:
                raise ChatRecordError("bad_tool_call", f"{where} has tool calls both in its value and in tool_calls")
            turn["tool_calls"] = [_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
            forms.add("openai_tool_calls")
    elif turn["role"] == "tool":
        for key in ("tool_call_id", "name"):
            if obj.get(key) not in (None, ""):
                turn[key] = _text(obj[key], f"{where}.{key}")


def _turns(record: dict, forms: set[str], list_key: str = "conversations", role_key: str = "from",
           content_key: str = "value", content=_text) -> list[dict[str, Any]]:
    """A list of turn objects (ShareGPT's `from`/`value`, OpenAI's `role`/`content`) as turns."""
    if not isinstance(record[list_key], list):
        raise ChatRecordError("wrong_type", f"{list_key!r} is {type(record[list_key]).__name__}, expected a list of "
                                            "turns")
    turns = []
    for i, obj in enumerate(record[list_key]):
        where = f"{list_key}[{i}]"
        if not isinstance(obj, dict):
            raise ChatRecordError("wrong_type", f"{where} is {type(obj).__name__}, expected an object")
        role = _role(_require(obj, role_key, where), f"{where}.{role_key}")
        if role == "assistant" and obj.get("tool_calls") and obj.get(content_key) is None:
            value = ""  # OpenAI's message that only calls tools may leave content out, or null
        else:
            value = _require(obj, content_key, where)
        if role == FUNCTION_CALL:
            turn = {"role": "assistant", "content": "",
                    "tool_calls": _function_calls(value, f"{where}.{content_key}")}
            forms.add("sharegpt_function_call")
        else:
            turn = {"role": role, "content": content(value, f"{where}.{content_key}")}
        _structured(obj, turn, where, forms)
        turns.append(turn)
    return turns


def _alpaca(record: dict, forms: set[str]) -> list[dict[str, Any]]:
    instruction = _text(_require(record, "instruction", "the record"), "instruction")
    answer_key = "output" if "output" in record else "response"
    answer = _text(_require(record, answer_key, "the record"), answer_key)
    extra = _text(record["input"], "input") if record.get("input") is not None else ""
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    system = record.get("system")
    system = [] if system is None else [{"role": "system", "content": _text(system, "system")}]
    return [*system, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def _qa(record: dict, forms: set[str]) -> list[dict[str, Any]]:
    for q, a in QA_KEYS:
        if q in record and a in record:
            return [{"role": "user", "content": _text(record[q], q)},
                    {"role": "assistant", "content": _text(record[a], a)}]
    raise ChatRecordError("missing_key", "no question/answer, query/response or prompt/completion pair")


NORMALIZERS = {"sharegpt": _turns, "alpaca": _alpaca, "qa": _qa,
               "openai": functools.partial(_turns, list_key="messages", role_key="role", content_key="content",
                                           content=_openai_content)}


def _hermes_calls(content: str, where: str) -> tuple[str, list[dict[str, Any]]]:
    """(the text left, stripped; the calls) of a content with `<tool_call>` blocks."""
    if "<tool_call>" not in content:
        return content, []
    calls = []
    for k, block in enumerate(TOOL_CALL.findall(content), start=1):
        at = f"{where} <tool_call> {k}"
        calls.append(_call(_call_json(block.strip(), at), at))
    left = TOOL_CALL.sub("", content)
    if "<tool_call>" in left:
        raise ChatRecordError("bad_tool_call", f"{where} has a <tool_call> without </tool_call>")
    return left.strip(), calls


def _tool_responses(content: str, where: str) -> list[str]:
    """The texts, stripped, of a content made of `<tool_response>` blocks only."""
    if TOOL_RESPONSE.sub("", content).strip():
        raise ChatRecordError("bad_tool_response",
                              f"{where} has text outside its <tool_response>…</tool_response> blocks")
    return [m.group(1).strip() for m in TOOL_RESPONSE.finditer(content)]


def _read_tags(turns: list[dict[str, Any]], forms: set[str]) -> list[dict[str, Any]]:
    """Turns with the `<think>`, `<tool_call>` and `<tool_response>` forms read into structured fields,
    keys in the record contract's TURN_KEYS order."""
    read = []
    for i, turn in enumerate(turns):
        where = f"turn {i} ({turn['role']})"
        if turn["role"] == "assistant":
            # calls first: their JSON may hold any text, a think tag too
            left, calls = _hermes_calls(turn["content"], where)
            if calls:
                forms.add("hermes_tags")
                if "tool_calls" in turn:
                    raise ChatRecordError("bad_tool_call", f"{where} has both tool_calls and <tool_call> blocks")
                turn["tool_calls"] = calls
            try:
                content, reasoning = split_reasoning(left, turn.get("reasoning_content"), where)
            except ReasoningError as e:
                raise ChatRecordError(e.reason, e.detail) from None
            if content != left:
                forms.add("think_tags")
            if reasoning is not None:
                turn["reasoning_content"] = reasoning
            turn["content"] = content
        elif turn["role"] in ("user", "tool") and turn["content"].lstrip().startswith("<tool_response>"):
            forms.add("hermes_tags")
            read.extend({**turn, "role": "tool", "content": text} for text in _tool_responses(turn["content"], where))
            continue
        read.append({key: turn[key] for key in chat_record.TURN_KEYS if key in turn})
    return read


def normalize(record: dict[str, Any], schema: str, forms: set[str] | None = None) -> list[dict[str, Any]]:
    """The record's turns with roles mapped and every form read (not yet validated); `ChatRecordError`
    when it cannot be read. The forms found are added to `forms`."""
    if schema not in NORMALIZERS:
        raise ValueError(f"unknown chat schema {schema!r}; choose auto or one of {', '.join(SCHEMAS)}")
    forms = set() if forms is None else forms
    return _read_tags(NORMALIZERS[schema](record, forms), forms)


def validate(turns: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """`(turns, role of the turns cut off the end or None)` for a conversation that keeps the record
    contract (`fuelline.formats.chat_record`) and prepare's own rules; `ChatRecordError` otherwise."""
    chat_record.require_turns(turns)
    chat_record.require_order(turns)
    for i, turn in enumerate(turns):
        if not turn["content"].strip() and not turn.get("tool_calls"):
            raise ChatRecordError("empty_content", f"turn {i} ({turn['role']}) has empty content")
    body = turns[1:] if turns[0]["role"] == "system" else turns
    if not body:
        raise ChatRecordError("no_complete_exchange", "no user turn")
    last = body[-1]["role"]
    if last == "user":
        if len(body) == 1:
            raise ChatRecordError("no_complete_exchange", "a user turn without an answer")
        return turns[:-1], last
    if last == "tool":  # results not answered yet: the conversation ends on the calls
        end = len(turns)
        while turns[end - 1]["role"] == "tool":
            end -= 1
        return turns[:end], last
    return turns, None


def normalize_record(record: dict[str, Any], schema: str = "auto") -> Conversation | Drop:
    """The record read and validated, or a `Drop` naming the rule that failed."""
    found = detect_schema(record) if schema == "auto" else schema
    if found is None:
        return Drop("unknown_schema", f"keys {', '.join(sorted(record)) or 'none'} match no chat schema "
                                      f"({', '.join(SCHEMAS)})")
    forms: set[str] = set()
    try:
        tools = _tools(record) if found in ("sharegpt", "openai") else None
        turns, trailing = validate(normalize(record, found, forms))
    except ChatRecordError as e:
        return Drop(e.reason, f"{found}: {e.detail}")
    return Conversation(found, turns, tools, trailing, forms)
