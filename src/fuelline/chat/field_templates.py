"""Templates made of strings (`chatml`, `qwen3`, `llama3`, …): a conversation rendered by appending.

`render_fields` appends a conversation's pieces one after the other and records, while
appending, where each assistant turn's supervised body (reasoning block, content, tool calls,
end-of-turn string) starts and ends, so a span is known by construction, never searched for.
Contents are rendered verbatim: Qwen3's Jinja template strips leading newlines from the final
answer and splits a content at `</think>`, so `qwen3` matches it for contents without either
(the chat data in ../shared/data has neither; `jinja_templates` refuses them).
"""

from __future__ import annotations

from fuelline.chat.template_registry import ChatTemplate, Rendering
from fuelline.chat.tool_rendering import system_turn_with_tools, tool_calls, tool_result


def render_fields(turns: list[dict], tools: list[dict] | None, t: ChatTemplate,
                  add_generation_prompt: bool) -> Rendering:
    """A field template's rendering: the pieces appended, each assistant body's span recorded on the way."""
    headers = {"system": t.system_header, "user": t.user_header, "assistant": t.assistant_header}
    parts, skip = [t.bos], 0
    system = turns[0]["content"] if turns[0]["role"] == "system" else t.default_system
    if tools:  # the tool schemas join the system turn's content
        parts.append(system_turn_with_tools(system, tools, t))
        skip = turns[0]["role"] == "system"
    elif t.default_system is not None and turns[0]["role"] != "system":
        parts.append(t.system_header + t.default_system + t.end_of_turn + t.after_turn)
    pos = sum(map(len, parts))
    spans, ends, last = [], [], len(turns) - 1
    after = t.after_turn if t.loss_mask == "overlap" else ""  # deepspec's spans run over it
    for i, turn in enumerate(turns):
        role = turn["role"]
        if i < skip:
            head = body = tail = ""
        elif role == "assistant":
            head, body = _assistant(i, turn, t, i == last)
            tail = t.after_turn
            spans.append((pos + len(head), pos + len(head) + len(body) + len(t.after_turn) - len(after)))
        elif role == "tool":
            head, body, tail = tool_result(turns, i, t)
        else:
            head, body, tail = headers[role], turn["content"] + t.end_of_turn, t.after_turn
        parts += (head, body, tail)
        pos += len(head) + len(body) + len(tail)
        ends.append(pos)
    if add_generation_prompt:
        parts.append(t.generation_prompt)
    return Rendering("".join(parts), tuple(spans), tuple(ends))


def _assistant(i: int, turn: dict, t: ChatTemplate, is_last: bool) -> tuple[str, str]:
    """An assistant turn's unsupervised head and supervised body; a reasoning is stripped of newlines at
    both ends, as Qwen3's template does, and supervised unless nothing is left."""
    head, body = t.assistant_header, turn["content"]
    reasoning = turn.get("reasoning_content")
    if reasoning:
        if not (t.reasoning_open or t.reasoning_close):
            raise ValueError(f"turn {i}: chat template {t.name!r} has no syntax for reasoning_content; "
                             f"use reasoning='drop', or a template that has one (qwen3)")
        thought = t.reasoning_open + reasoning.strip("\n") + t.reasoning_close
        head, body = (head, thought + body) if reasoning.strip("\n") else (head + thought, body)
    elif t.assistant_prefix_on == "all" or is_last:
        head += t.assistant_prefix
    return head, body + tool_calls(i, turn, t) + t.end_of_turn
