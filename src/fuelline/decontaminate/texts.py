"""What of a training record decontamination checks: its texts, each a stream of n-grams.

A record is checked as a list of texts whose n-grams are counted together, each distinct n-gram
once (`EvalIndex.match`); no n-gram spans two texts. A document record is its text. A chat record
(`fuelline.formats.chat_record`) with `turns = "user"` is its user turns joined, so an item split
over two user turns is found. With `turns = "all"` it is every turn in order (reasoning, content,
tool calls' arguments, tool results), and besides, each role's turns joined on their own, so that
what `user` finds `all` finds too: an assistant turn between the two halves of an item does not
hide it. Tool calls' arguments and tool results are text a model reads or writes: their string
values are checked, at any depth, and a string holding a JSON object or array is read for its
own (a tool result is often JSON, whose escapes would cut words in two).

A record of neither kind, or a chat record that breaks the contract, is a `Drop` naming why: the
stage raises it as a RecordError naming FILE:LINE, or under `on_error = "skip"` drops it.
"""

from __future__ import annotations

from typing import Any

import orjson

from fuelline.formats import chat_record
from fuelline.records import Drop, record_kind

NOT_CHECKABLE = "not_a_document_or_chat_record"


def string_values(value: Any) -> list[str]:
    """The strings of a JSON value, in order, at any depth; a string holding a JSON object or array
    gives its own strings instead."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parsed = _json_container(item)
            if parsed is None:
                found.append(item)
            else:
                stack.append(parsed)
        elif isinstance(item, dict):
            stack.extend(reversed(item.values()))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found


def _json_container(text: str) -> dict | list | None:
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def turn_texts(turn: dict) -> list[str]:
    """What a turn holds that a model learns from: reasoning, content, its tool calls' arguments; a
    tool result's string values."""
    if turn["role"] == "tool":
        return string_values(turn["content"])
    texts = [turn["reasoning_content"]] if isinstance(turn.get("reasoning_content"), str) else []
    texts.append(turn["content"])
    for call in turn.get("tool_calls") or ():
        texts.extend(string_values(call["function"]["arguments"]))
    return texts


def checked_texts(record: dict, turns: str) -> list[str] | Drop:
    """The texts of a record that are checked (see the module doc), or a Drop saying why it cannot be."""
    if "conversations" in record:
        problem = chat_record.check(record)
        if problem is not None:
            return problem
        conversation = record["conversations"]
        if turns == "user":
            return ["\n".join(t["content"] for t in conversation if t["role"] == "user")]
        texts = ["\n".join(text for turn in conversation for text in turn_texts(turn))]
        for role in chat_record.ROLES:
            mine = [turn for turn in conversation if turn["role"] == role]
            if len(mine) > 1:  # one turn's n-grams are all in the conversation's already
                texts.append("\n".join(text for turn in mine for text in turn_texts(turn)))
        return texts
    if isinstance(record.get("text"), str):
        return [record["text"]]
    return Drop(NOT_CHECKABLE, f'expected a document record {{"text"}} or a chat record {{"conversations"}}, found '
                               f"{record_kind(record)} (`fuelline chat prepare` makes chat records of other "
                               "chat forms)")
