"""Tools, tool calls and tool results in a field template, as Qwen3's published template writes them.

The one tool syntax (`ChatTemplate.tool_syntax="qwen"`, the built-in `qwen3`): the schemas
(`tojson`, one a line) in `<tools></tools>` at the end of the system turn; each call
`<tool_call>\\n{"name": N, "arguments": JSON}\\n</tool_call>` after the content, a newline
before each but a first one with empty content; consecutive tool results in one user turn,
each `\\n<tool_response>\\n…\\n</tool_response>`. A template without a tool syntax refuses a
conversation with tools, tool calls or tool turns, naming what it has and the templates that
would render it. `fuelline.chat.field_templates` places these pieces; their supervision is its.
"""

from __future__ import annotations

from fuelline.chat.jinja_sandbox import tojson
from fuelline.chat.template_registry import ChatTemplate, registered

_QWEN_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
               "with function signatures within <tools></tools> XML tags:\n<tools>",
               "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")


def system_turn_with_tools(system: str | None, tools: list[dict], t: ChatTemplate) -> str:
    """The system turn, its content (if any) followed by the tool schemas: Qwen's way of giving tools."""
    _need_tool_syntax(t, "the conversation has tools")
    return (t.system_header + ("" if system is None else system + "\n\n") + _QWEN_TOOLS[0]
            + "".join("\n" + tojson(tool) for tool in tools) + _QWEN_TOOLS[1] + t.end_of_turn + t.after_turn)


def tool_calls(i: int, turn: dict, t: ChatTemplate) -> str:
    """Assistant turn i's tool calls, written after its content (empty without calls)."""
    calls = turn.get("tool_calls")
    if not calls:
        return ""
    _need_tool_syntax(t, f"turn {i} has tool_calls")
    return "".join(("\n" if j or turn["content"] else "") + '<tool_call>\n{"name": "' + call["function"]["name"]
                   + '", "arguments": ' + tojson(call["function"]["arguments"]) + "}\n</tool_call>"
                   for j, call in enumerate(calls))


def tool_result(turns: list[dict], i: int, t: ChatTemplate) -> tuple[str, str, str]:
    """Tool turn i as head, content and tail: consecutive results share one user turn."""
    _need_tool_syntax(t, f"turn {i} is a tool turn")
    head = ("" if i and turns[i - 1]["role"] == "tool" else "<|im_start|>user") + "\n<tool_response>\n"
    tail = "\n</tool_response>" + ("" if i < len(turns) - 1 and turns[i + 1]["role"] == "tool" else
                                   t.end_of_turn + t.after_turn)
    return head, turns[i]["content"], tail


def _need_tool_syntax(t: ChatTemplate, what: str) -> None:
    if not t.tool_syntax:
        raise ValueError(f"{what}, but chat template {t.name!r} has no syntax for tools; use one that has "
                         f"({', '.join(n for n, k in registered() if k.tool_syntax)}) or the "
                         f"tokenizer's own (auto)")
