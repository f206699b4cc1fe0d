"""Chat templates: a conversation rendered to text once, with the character spans to train on.

`render` is the entry: it checks a conversation against the chat record contract
(`fuelline.formats.chat_record`), applies `reasoning`, renders with the template named or given,
and applies `train_turns` and the turns' weights to the spans. The loss mask is derived from
these spans and the token offsets of one encoding of the text (`fuelline.chat.encode`), never
from re-tokenized prefixes or a search in the rendered text. The rest lives beside it, one job
a module: the templates by name, built-in or the user's (`fuelline.chat.template_registry`);
templates made of strings, rendered by appending (`fuelline.chat.field_templates`, their tools
in `fuelline.chat.tool_rendering`); Jinja templates, run as transformers runs them
(`fuelline.chat.jinja_sandbox`), their spans located in `fuelline.chat.jinja_templates`.
Worked example, `chatml`, one exchange ("Hi", "Hello!"):

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    supervised span [52, 68) = "Hello!<|im_end|>"; turns end at 30 and 69

Reasoning (`reasoning_content`) is kept on every assistant turn (`keep`), removed before
rendering (`drop`: the non-thinking rendering), or kept only on the assistant turns after the
last user turn (`last`, the default: Qwen3's own rule for history, which keeps the reasoning
of the tool-calling steps of the final round too); templates without a reasoning syntax refuse
a turn with one unless it is dropped, and so do those without a tool syntax (all but `qwen3`)
tools, tool calls and tool turns. `train_turns="last"` supervises only the last span. An
assistant turn with `"weight": 0` (OpenAI fine-tuning's per-message weight, 0 or 1) is rendered
but never supervised, under every template; with `train_turns="last"` a weight-0 last turn
leaves nothing supervised. A Jinja template whose `{% generation %}` blocks are not one per
assistant turn cannot say which block is the weight-0 turn's, and such a conversation is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from fuelline.chat.field_templates import render_fields
from fuelline.chat.jinja_templates import render_jinja
from fuelline.chat.template_registry import ChatTemplate, Rendering, get_template, load_templates, register_template
from fuelline.formats import chat_record
from fuelline.formats.chat_record import ChatRecordError
from fuelline.io.bad_records import ON_ERROR

__all__ = ["ON_ERROR", "REASONING", "SPECIAL_TEXT", "TRAIN_TURNS", "ChatTemplate", "Rendering", "conversation_tools",
           "conversation_turns", "get_template", "load_templates", "register_template", "render", "render_checked"]

REASONING = ("keep", "drop", "last")
TRAIN_TURNS = ("all", "last")
SPECIAL_TEXT = ("refuse", "keep")


def conversation_turns(conversation: Any) -> list[dict]:
    """The turns of a conversation (or of a chat record's `conversations`), their shape checked by the
    record contract (`fuelline.formats.chat_record`; a `ChatRecordError` names the turn and the rule)."""
    if isinstance(conversation, dict):
        if not isinstance(conversation.get("conversations"), list):
            raise ChatRecordError("not_a_chat_record", "a chat record needs a 'conversations' list of "
                                                       "{'role', 'content'} turns")
        conversation = conversation["conversations"]
    chat_record.require_turns(conversation)
    return list(conversation)


def conversation_tools(conversation: Any, tools: Any = None) -> list[dict] | None:
    """The tool schemas of a conversation, checked: a chat record's `tools`, or `tools` given for it."""
    own = conversation.get("tools") if isinstance(conversation, dict) else None
    if own is not None and tools is not None:
        raise ChatRecordError("bad_tools", "tools are given twice: the chat record has its own 'tools', and tools= "
                                           "is set too")
    tools = own if own is not None else tools
    chat_record.require_tools(tools)
    return tools


def render(conversation: Any, template: str | ChatTemplate, add_generation_prompt: bool = False, *,
           variables: Mapping[str, Any] | None = None, tools: list[dict] | None = None, reasoning: str = "last",
           train_turns: str = "all") -> Rendering:
    """Render a conversation; `variables` (bos_token, eos_token, …) are given to a Jinja template.

    `tools` are the conversation's tool schemas when it is not a chat record carrying its own.
    `reasoning`: keep every assistant turn's `reasoning_content`, drop it, or keep it only after
    the last user turn (`last`, Qwen3's rule for history). `train_turns`: supervise every
    assistant turn, or only the last one (its span, or the template's last generation block).
    """
    return render_checked(conversation_turns(conversation), conversation_tools(conversation, tools), template,
                          add_generation_prompt, variables=variables, reasoning=reasoning, train_turns=train_turns)


def render_checked(turns: list[dict], tools: list[dict] | None, template: str | ChatTemplate,
                   add_generation_prompt: bool = False, *, variables: Mapping[str, Any] | None = None,
                   reasoning: str = "last", train_turns: str = "all") -> Rendering:
    """`render` of turns and tools that `conversation_turns` and `conversation_tools` have checked
    (`encode_chats` checks each conversation once, before it renders it, maybe several times)."""
    if reasoning not in REASONING or train_turns not in TRAIN_TURNS:
        key, value, allowed = (("reasoning", reasoning, REASONING) if reasoning not in REASONING else
                               ("train_turns", train_turns, TRAIN_TURNS))
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
    if reasoning != "keep" and any(len(turn) > 2 and "reasoning_content" in turn for turn in turns):
        turns = _reasoning_kept(turns, reasoning)
    if isinstance(template, str):
        template = get_template(template)
    if template.jinja is None:
        rendering = render_fields(turns, tools, template, add_generation_prompt)
    elif not template.jinja:
        raise ValueError(f"chat template {template.name!r} renders with a tokenizer's own Jinja template; "
                         f"encode_chat finds it, or pass the Jinja source as ChatTemplate(jinja=...)")
    else:
        rendering = render_jinja(turns, tools, template, add_generation_prompt, variables or {})
    spans = _supervised_spans(rendering.spans, turns, template, train_turns)
    return rendering if spans == rendering.spans else dataclasses.replace(rendering, spans=spans)


def _supervised_spans(spans: tuple[tuple[int, int], ...], turns: list[dict], t: ChatTemplate,
                      train_turns: str) -> tuple[tuple[int, int], ...]:
    """The spans left by `train_turns` and the turns' weights (a weight-0 assistant turn's span goes)."""
    weights = [turn.get("weight", 1) for turn in turns if turn["role"] == "assistant"]
    if 0 not in weights:
        return spans[-1:] if train_turns == "last" else spans
    if len(spans) != len(weights):
        raise ValueError(f"turn {next(i for i, turn in enumerate(turns) if turn.get('weight') == 0)}: weight 0, but "
                         f"the Jinja chat template of {t.name!r} has {len(spans)} {{% generation %}} block(s) for "
                         f"{len(weights)} assistant turn(s), so which tokens are this turn's is unknown")
    if train_turns == "last":
        spans, weights = spans[-1:], weights[-1:]
    return tuple(span for span, weight in zip(spans, weights) if weight)


def _reasoning_kept(turns: list[dict], reasoning: str) -> list[dict]:
    """The turns without the `reasoning_content` that `reasoning` (drop or last) leaves out."""
    last_user = max((i for i, turn in enumerate(turns) if turn["role"] == "user"), default=-1)
    return [{k: v for k, v in turn.items() if k != "reasoning_content"}
            if "reasoning_content" in turn and (reasoning == "drop" or i < last_user) else turn
            for i, turn in enumerate(turns)]
