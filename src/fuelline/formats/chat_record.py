"""The chat record as a format: what every step that reads chat records may rely on, checked once.

A chat record is one JSON object, `{"id", "conversations": [turn, …], "tools"?, "meta"?}`, as
`chat prepare` writes it (`fuelline.records.chat` builds it) and `chat regenerate`, `pack
--template chat`, `cache build` and `dedup` (compare = user_turns) read it. Each of them calls
`check` (a `Drop`) or `require` (a `ChatRecordError`), so a record that one step accepts every
later step accepts, and a refusal names the same reason (`REASONS`) at every step:

- `id`: a non-empty string (`bad_id`), unique in a corpus: regeneration and the target cache key
  their work by it. chat prepare gives every record one (the raw record's string or integer id,
  else a hash of its file name and line); a message about a record without one names it by
  FILE:LINE only.
- `conversations`: a list (`not_a_chat_record`) of at least one turn (`empty_conversation`).
- a turn: `{"role": one of ROLES, "content": str}` (`unknown_role`, `wrong_type`), plus, only
  where used, each field of ROLE_FIELDS on its own role's turns (else `misplaced_field`): on an
  assistant turn `reasoning_content: str`, `weight: 0 | 1` (OpenAI fine-tuning's: 0 means
  context, not trained on; `bad_weight`) and `tool_calls: [{"id"?: str, "type"?: "function",
  "function": {"name": non-empty str, "arguments": {…}}}]` (`bad_tool_call`,
  `tool_call_without_name`; arguments an object, never a JSON string, under
  `fuelline.io.tool_arguments`' rules and reasons); on a tool turn (a tool result)
  `tool_call_id: str` and `name: str` (elsewhere `name` is OpenAI's participant name, left alone).
  Other keys pass unchecked.
- `tools`: the function schemas the conversation may call, `[{"type"?: "function", "function":
  {"name": non-empty str, "description"?: str, "parameters"?: {…}}}]` (`bad_tools`).
- order (`ORDER_REASONS`): an optional leading system turn, then user and assistant alternate from
  a user turn; an assistant turn's tool calls are answered by one or more tool turns right after
  it (at most one per call; a `tool_call_id`, when the calls have ids, names one of them), after
  which the assistant speaks again. A conversation may end on any turn: on a user turn (regenerate
  answers it), on tool results, on a lone system turn; what a step makes of one with nothing to
  train on is its own drop reason.

Eval records, chat prepare's prompts `{"id", "turns": [user content, …]}`, follow the same id
rule (`check_prompts`). The contract leaves to the steps their own rules: chat prepare's data
rules (no empty content, a complete exchange, trailing user turns and tool results cut:
`fuelline.chat.schemas`), and what a template can render (`fuelline.chat.templates`).
"""

from __future__ import annotations

from typing import Any

from fuelline.io.tool_arguments import REASONS as ARGUMENTS_REASONS
from fuelline.io.tool_arguments import ArgumentsError, parse_arguments
from fuelline.records import Drop, record_kind

ROLES = ("system", "user", "assistant", "tool")
# The turn fields besides role and content that belong to one role.
ROLE_FIELDS = {"tool_calls": "assistant", "reasoning_content": "assistant", "weight": "assistant",
               "tool_call_id": "tool"}
TURN_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name", "weight")
WEIGHTS = (0, 1)
ORDER_REASONS = ("first_turn_not_user", "roles_not_alternating", "orphan_tool_result", "too_many_tool_results",
                 "unknown_tool_call_id", "missing_tool_result")
REASONS = ("not_a_chat_record", "bad_id", "empty_conversation", "wrong_type", "unknown_role", "misplaced_field",
           "bad_weight", "bad_tools", "bad_tool_call", "tool_call_without_name", *ARGUMENTS_REASONS, *ORDER_REASONS)
CALL_SHAPE = "{'type': 'function', 'function': {'name', 'arguments'}}"
TOOL_SHAPE = "{'type': 'function', 'function': {'name', 'description', 'parameters'}}"


class ChatRecordError(ValueError):
    """A record that breaks the contract: `reason` (one of REASONS, or one of chat prepare's reading
    a raw record), `detail` (which turn or field, and what is wrong), `where` (FILE:LINE, if known)."""

    def __init__(self, reason: str, detail: str, where: str | None = None):
        super().__init__(f"{where + ': ' if where else ''}{detail} ({reason})")
        self.reason, self.detail, self.where = reason, detail, where

    def __reduce__(self):  # travels intact from a worker process to the parent
        return type(self), (self.reason, self.detail, self.where)


def check(record: Any) -> Drop | None:
    """None for a chat record that keeps the contract, else a `Drop` naming the first rule it breaks."""
    try:
        require(record)
    except ChatRecordError as e:
        return Drop(e.reason, e.detail)
    return None


def require(record: Any, where: str | None = None) -> None:
    """`check`, raising: a `ChatRecordError` located at `where` (FILE:LINE) for a record that breaks the contract."""
    try:
        if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
            found = record_kind(record) if isinstance(record, dict) else f"a JSON {type(record).__name__}"
            raise ChatRecordError("not_a_chat_record", f'expected a chat record {{"id", "conversations": [turn, …]}} '
                                                       f"(see `fuelline chat prepare`), found {found}")
        _require_id(record)
        require_turns(record["conversations"])
        require_tools(record.get("tools"))
        require_order(record["conversations"])
    except ChatRecordError as e:
        if where is None:
            raise
        raise ChatRecordError(e.reason, e.detail, where) from None


def check_prompts(record: Any) -> Drop | None:
    """None for an eval record `{"id", "turns": [str, …]}` (chat prepare's prompts), else a `Drop`."""
    if not isinstance(record, dict) or not isinstance(record.get("turns"), list):
        return Drop("not_a_chat_record", 'expected an eval record {"id", "turns": [user content, …]}')
    try:
        _require_id(record)
    except ChatRecordError as e:
        return Drop(e.reason, e.detail)
    if not record["turns"]:
        return Drop("empty_conversation", "the eval record has no turn")
    wrong = next((t for t in record["turns"] if not isinstance(t, str)), None)
    if wrong is not None:
        return Drop("wrong_type", f"an eval record's turns are the user contents, strings; found "
                                  f"{type(wrong).__name__}")
    return None


def _require_id(record: dict) -> None:
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        found = "no id" if rid is None else f"id {rid!r} ({type(rid).__name__})"
        raise ChatRecordError("bad_id", f"the record has {found}; a record's id is a non-empty string "
                                        "(chat prepare writes one for every record)")


def require_turns(turns: Any) -> None:
    """The turns' shape (roles, contents, the fields of each role), not their order."""
    if not isinstance(turns, (list, tuple)):
        raise ChatRecordError("not_a_chat_record", f"a conversation is a list of turns, found {type(turns).__name__}")
    if not turns:
        raise ChatRecordError("empty_conversation", "the conversation has no turn")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ChatRecordError("wrong_type", f"turn {i}: expected an object with role and content, found "
                                                f"{type(turn).__name__}")
        role = turn.get("role")
        if role not in ROLES:
            raise ChatRecordError("unknown_role", f"turn {i}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(turn.get("content"), str):
            raise ChatRecordError("wrong_type", f"turn {i}: content must be a string, found "
                                                f"{type(turn.get('content')).__name__}")
        if len(turn) > 2:  # a plain turn is checked by now
            _require_fields(i, role, turn)


def _require_fields(i: int, role: str, turn: dict) -> None:
    for key, owner in ROLE_FIELDS.items():
        if key in turn and role != owner:
            raise ChatRecordError("misplaced_field", f"turn {i}: {key} belongs on {_a(owner)} {owner} turn, not on "
                                                     f"{_a(role)} {role} turn")
    for key in {"assistant": ("reasoning_content",), "tool": ("tool_call_id", "name")}.get(role, ()):
        if key in turn and not isinstance(turn[key], str):
            raise ChatRecordError("wrong_type", f"turn {i}: {key} must be a string, found {type(turn[key]).__name__}")
    if "weight" in turn and (type(turn["weight"]) is not int or turn["weight"] not in WEIGHTS):
        raise ChatRecordError("bad_weight", f"turn {i}: weight must be 0 (not trained on) or 1, found "
                                            f"{turn['weight']!r}")
    if "tool_calls" in turn:
        _require_calls(i, turn["tool_calls"])


def _require_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list):
        raise ChatRecordError("bad_tool_call", f"turn {i}: tool_calls must be a list of {CALL_SHAPE}, found "
                                               f"{type(calls).__name__}")
    for j, call in enumerate(calls):
        where = f"turn {i}: tool_calls[{j}]"
        function = _function_entry(call, where, CALL_SHAPE, "bad_tool_call", "tool_call_without_name")
        if "id" in call and not isinstance(call["id"], str):
            raise ChatRecordError("wrong_type", f"{where}.id must be a string, found {type(call['id']).__name__}")
        arguments = function.get("arguments")
        if not isinstance(arguments, dict):
            hint = " (a JSON-encoded string: decode it to an object first)" if isinstance(arguments, str) else ""
            raise ChatRecordError("bad_tool_arguments", f"{where}.function.arguments must be a JSON object (a dict), "
                                                        f"found {type(arguments).__name__}{hint}")
        try:
            parse_arguments(arguments, f"{where}.function")
        except ArgumentsError as e:
            raise ChatRecordError(e.reason, e.detail) from None


def _function_entry(entry: Any, where: str, shape: str, reason: str, name_reason: str) -> dict:
    """The `function` of a tool call or a tool schema, `{"type"?: "function", "function": {"name", …}}`."""
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(function, dict):
        raise ChatRecordError(reason, f"{where} must be {shape}, found {entry!r:.80}")
    if entry.get("type", "function") != "function":
        raise ChatRecordError(reason, f"{where}.type must be 'function', found {entry['type']!r}")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ChatRecordError(name_reason, f"{where}.function.name must be a non-empty string, found {name!r}")
    return function


def _a(role: str) -> str:
    return "an" if role == "assistant" else "a"


def require_tools(tools: Any) -> None:
    """The tool schemas' shape (None: the conversation has none)."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise ChatRecordError("bad_tools", f"tools must be a list of {TOOL_SHAPE}, found {type(tools).__name__}")
    for j, tool in enumerate(tools):
        function = _function_entry(tool, f"tools[{j}]", TOOL_SHAPE, "bad_tools", "bad_tools")
        for key, kind in (("description", str), ("parameters", dict)):
            if key in function and not isinstance(function[key], kind):
                raise ChatRecordError("bad_tools", f"tools[{j}].function.{key} must be a "
                                                   f"{'string' if kind is str else 'JSON object'}, found "
                                                   f"{type(function[key]).__name__}")


def require_order(turns: list[dict]) -> None:
    """The order of turns whose shape `require_turns` has checked (see the module doc)."""
    start = 1 if turns and turns[0]["role"] == "system" else 0
    if start < len(turns) and turns[start]["role"] != "user":
        raise ChatRecordError("first_turn_not_user", f"the first turn after the system prompt is "
                                                     f"{turns[start]['role']}")
    calls: list[dict] = []  # of the round in progress: results may follow
    results = 0
    for i in range(start + 1, len(turns)):
        before, turn = turns[i - 1], turns[i]
        role = turn["role"]
        if role == "tool":
            if not calls:
                raise ChatRecordError("orphan_tool_result", f"turn {i} (tool) answers no tool call: turn {i - 1} "
                                                            f"({before['role']}) makes none")
            results += 1
            if results > len(calls):
                raise ChatRecordError("too_many_tool_results", f"turn {i} is tool result {results} of a round of "
                                                               f"{len(calls)} call(s)")
            ids = [call["id"] for call in calls if "id" in call]
            if ids and "tool_call_id" in turn and turn["tool_call_id"] not in ids:
                raise ChatRecordError("unknown_tool_call_id", f"turn {i} answers tool_call_id "
                                                              f"{turn['tool_call_id']!r}, not a call of its round "
                                                              f"({', '.join(ids)})")
            continue
        if before.get("tool_calls"):
            raise ChatRecordError("missing_tool_result", f"turn {i} ({role}) follows tool calls without a tool result")
        expected = "user" if before["role"] == "assistant" else "assistant"
        if role != expected:
            after = " after tool results" if before["role"] == "tool" else ""
            raise ChatRecordError("roles_not_alternating", f"turn {i} is {role}, expected {expected}{after}")
        calls, results = turn.get("tool_calls") or [], 0
