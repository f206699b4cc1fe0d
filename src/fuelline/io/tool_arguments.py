"""Tool-call arguments, read and checked in one place, so the text a model is trained on holds
exactly the values the data wrote.

Arguments come as a JSON string (OpenAI's wire form, ShareGPT's function_call values, Hermes
`<tool_call>` blocks, a server's answer) or as an object (the chat record's form; a few servers
send it too). `parse_arguments` reads either into a dict, or refuses it under a reason of
`REASONS`:

- `bad_tool_arguments`: not JSON, or not a JSON object;
- `unrepresentable_number`: a number the rendering would change: a float literal whose value a
  double does not hold (1.00000000000000000001 would be rendered 1.0), one out of the double
  range, an integer of more digits than Python converts (4300). Integers of any size in range
  are kept exact (`fuelline.io.json_exact` keeps them exact in records too);
- `lone_surrogate`: a string holding half of a UTF-16 pair (`\\ud800` alone), which encodes no
  character and cannot be written as UTF-8.

An object form's floats were read before they got here (one a reader rounded cannot be told
from one written so). Rendered with `json.dumps` (transformers' `tojson`, `to_json`), an int is its digits.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

REASONS = ("bad_tool_arguments", "unrepresentable_number", "lone_surrogate")


class ArgumentsError(ValueError):
    """Arguments refused; `reason` is one of REASONS, the message says where and what."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def parse_arguments(value: Any, where: str) -> dict[str, Any]:
    """The arguments (a JSON string or an object) as a checked dict; `ArgumentsError` otherwise."""
    subject = f"{where}: arguments"
    parsed = parse_json(value, subject) if isinstance(value, str) else value
    if not isinstance(parsed, dict):
        raise ArgumentsError("bad_tool_arguments", f"{subject} are {type(parsed).__name__}, expected a JSON object")
    _check(parsed, subject)
    return parsed


def to_json(arguments: dict[str, Any]) -> str:
    """The arguments as the API's compact JSON string, every integer written exactly."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def parse_json(text: str, subject: str, not_json: str = "bad_tool_arguments") -> Any:
    """The JSON value of a text a model wrote (a call's arguments, or a whole call as ShareGPT's
    function_call and Hermes' <tool_call> write it), under the rules above; `subject` names it in
    errors, and text that is not JSON is refused under `not_json`."""
    def number(kind):
        def parse(literal: str):
            try:
                value = kind(literal)
            except ValueError:  # an int of more digits than Python converts
                value = None
            if value is None or (kind is float and (not math.isfinite(value)
                                                   or Decimal(literal) != Decimal(repr(value)))):
                shown = literal if len(literal) <= 40 else literal[:37] + "..."
                raise ArgumentsError("unrepresentable_number", f"{subject}: the number {shown} would not be "
                                                               "rendered as written")
            return value
        return parse

    def constant(name: str):
        raise ArgumentsError(not_json, f"{subject}: {name} is not JSON")

    try:
        value = json.loads(text, parse_int=number(int), parse_float=number(float), parse_constant=constant)
    except json.JSONDecodeError as e:
        short = text if len(text) <= 80 else text[:77] + "..."
        raise ArgumentsError(not_json, f"{subject} is not JSON: {short!r} ({e.msg})") from None
    except RecursionError:
        raise ArgumentsError(not_json, f"{subject} is nested too deep") from None
    _check(value, subject)
    return value


def _check(value: Any, subject: str) -> None:
    """Refuse a lone surrogate in any string or key, a non-finite float, or a value JSON cannot hold."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _no_lone_surrogate(item, subject)
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise ArgumentsError("bad_tool_arguments", f"{subject}: the key {key!r} is not a string")
                _no_lone_surrogate(key, subject)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ArgumentsError("unrepresentable_number", f"{subject}: {item} is not JSON")
        elif item is not None and not isinstance(item, (int, float)):
            raise ArgumentsError("bad_tool_arguments", f"{subject}: a {type(item).__name__} is not JSON")


def _no_lone_surrogate(text: str, subject: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentsError("lone_surrogate", f"{subject}: the lone surrogate U+{ord(text[e.start]):04X} (half of a "
                             f"UTF-16 pair: no character) in "
                             f"{text[:60].encode('utf-8', 'backslashreplace').decode()!r}") from None
