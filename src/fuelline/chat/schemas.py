"""Chat data in the wild, in four shapes, normalized to one: `[{"role", "content"}, …]`.

| schema   | recognized by                          | turns                                              |
| -------- | -------------------------------------- | -------------------------------------------------- |
| sharegpt | `conversations`: list of `from`/`value`  | roles human, user → user; gpt, chatgpt, bing, bard, assistant, model → assistant; system |
| openai   | `messages`: list of `role`/`content`     | content a string or a list of `{"type": "text", "text"}` parts (joined with "\\n") |
| alpaca   | `instruction` + `output` or `response`   | user = instruction, + "\\n\\n" + `input` when non-empty; optional `system` |
| qa       | `question`/`answer`, `query`/`response`, `prompt`/`completion` | one user turn, one assistant turn |

Normalizing only maps shapes and roles; `validate` then applies the rules the reference
distillation pipeline applies, each failure under its own drop reason (`DROP_REASONS`): an
optional leading system turn, then user and assistant alternating from a user turn, every
content a non-empty string. A conversation that ends on a user turn keeps its complete
exchanges (the caller counts it); one without a single complete exchange is dropped.
"""

from __future__ import annotations

from typing import Any

from fuelline.records import Drop

SCHEMAS = ("sharegpt", "openai", "alpaca", "qa")
ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "assistant": "assistant", "model": "assistant",
    "system": "system",
}
QA_KEYS = (("question", "answer"), ("query", "response"), ("prompt", "completion"))
DROP_REASONS = ("unknown_schema", "missing_key", "wrong_type", "unknown_role", "empty_content",
                "first_turn_not_user", "roles_not_alternating", "no_complete_exchange")


class Invalid(Exception):
    """A record that breaks a rule; `reason` is one of DROP_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def detect_schema(record: dict[str, Any]) -> str | None:
    """The schema a record's keys announce, or None; checked in the order of SCHEMAS."""
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        return "openai"
    if "instruction" in record:
        return "alpaca"
    if any(q in record and a in record for q, a in QA_KEYS):
        return "qa"
    return None


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Invalid("wrong_type", f"{where} is {type(value).__name__}, expected a string")
    return value


def _require(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise Invalid("missing_key", f"{where} has no {key!r} (keys: {', '.join(sorted(obj)) or 'none'})")
    return obj[key]


def _turn_list(record: dict, key: str) -> list:
    turns = record[key]
    if not isinstance(turns, list):
        raise Invalid("wrong_type", f"{key!r} is {type(turns).__name__}, expected a list of turns")
    return turns


def _role(value: Any, where: str) -> str:
    name = _text(value, where)
    try:
        return ROLES[name.strip().lower()]
    except KeyError:
        raise Invalid("unknown_role", f"{where} is {name!r}; known: {', '.join(ROLES)}") from None


def _openai_content(content: Any, where: str) -> str:
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Invalid("wrong_type", f"{where}[{j}] is a {kind!r} part; only text parts are supported")
            texts.append(_text(_require(part, "text", f"{where}[{j}]"), f"{where}[{j}].text"))
        return "\n".join(texts)
    return _text(content, where)


def _turns(record: dict, list_key: str, role_key: str, content_key: str, content=_text) -> list[dict[str, str]]:
    """A list of turn objects (ShareGPT's `from`/`value`, OpenAI's `role`/`content`) as turns."""
    turns = []
    for i, turn in enumerate(_turn_list(record, list_key)):
        where = f"{list_key}[{i}]"
        if not isinstance(turn, dict):
            raise Invalid("wrong_type", f"{where} is {type(turn).__name__}, expected an object")
        role = _role(_require(turn, role_key, where), f"{where}.{role_key}")
        turns.append({"role": role, "content": content(_require(turn, content_key, where), f"{where}.{content_key}")})
    return turns


def _sharegpt(record: dict) -> list[dict[str, str]]:
    return _turns(record, "conversations", "from", "value")


def _openai(record: dict) -> list[dict[str, str]]:
    return _turns(record, "messages", "role", "content", _openai_content)


def _alpaca(record: dict) -> list[dict[str, str]]:
    instruction = _text(_require(record, "instruction", "the record"), "instruction")
    answer_key = "output" if "output" in record else "response"
    answer = _text(_require(record, answer_key, "the record"), answer_key)
    extra = record.get("input")
    if extra is not None and not isinstance(extra, str):
        raise Invalid("wrong_type", f"input is {type(extra).__name__}, expected a string")
    user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    turns = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    system = record.get("system")
    if system is not None:
        turns.insert(0, {"role": "system", "content": _text(system, "system")})
    return turns


def _qa(record: dict) -> list[dict[str, str]]:
    for q, a in QA_KEYS:
        if q in record and a in record:
            return [{"role": "user", "content": _text(record[q], q)},
                    {"role": "assistant", "content": _text(record[a], a)}]
    raise Invalid("missing_key", "no question/answer, query/response or prompt/completion pair")


NORMALIZERS = {"sharegpt": _sharegpt, "openai": _openai, "alpaca": _alpaca, "qa": _qa}


def normalize(record: dict[str, Any], schema: str) -> list[dict[str, str]]:
    """The record's turns with roles mapped (not yet validated); `Invalid` when it cannot be read."""
    if schema not in NORMALIZERS:
        raise ValueError(f"unknown chat schema {schema!r}; choose auto or one of {', '.join(SCHEMAS)}")
    return NORMALIZERS[schema](record)


def validate(turns: list[dict[str, str]]) -> tuple[list[dict[str, str]], bool]:
    """`(turns, trailing_user_removed)` for a valid conversation; `Invalid` otherwise."""
    for i, turn in enumerate(turns):
        if not turn["content"].strip():
            raise Invalid("empty_content", f"turn {i} ({turn['role']}) has empty content")
    body = turns[1:] if turns and turns[0]["role"] == "system" else turns
    if not body:
        raise Invalid("no_complete_exchange", "no user turn")
    if body[0]["role"] != "user":
        raise Invalid("first_turn_not_user", f"the first turn after the system prompt is {body[0]['role']}")
    for i, turn in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if turn["role"] != expected:
            offset = len(turns) - len(body)
            raise Invalid("roles_not_alternating", f"turn {i + offset} is {turn['role']}, expected {expected}")
    trailing_user = len(body) % 2 == 1
    if trailing_user:
        if len(body) == 1:
            raise Invalid("no_complete_exchange", "a user turn without an answer")
        turns = turns[:-1]
    return turns, trailing_user


def normalize_record(record: dict[str, Any], schema: str = "auto") -> tuple[str, list[dict[str, str]], bool] | Drop:
    """`(schema, turns, trailing_user_removed)`, or a `Drop` naming the rule that failed."""
    found = detect_schema(record) if schema == "auto" else schema
    if found is None:
        return Drop("unknown_schema", f"keys {', '.join(sorted(record)) or 'none'} match no chat schema "
                                      f"({', '.join(SCHEMAS)})")
    try:
        turns, trailing = validate(normalize(record, found))
    except Invalid as e:
        return Drop(e.reason, f"{found}: {e.detail}")
    return found, turns, trailing
