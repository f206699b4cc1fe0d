"""Chat templates: a conversation rendered to text once, with the character spans to train on.

`render` checks a conversation against the chat record contract (`fuelline.formats.chat_record`),
applies `reasoning`, renders with a template of `template_registry` (by appending strings,
`field_templates`, or with Jinja, `jinja_templates`), then applies `train_turns` and the turns'
weights to the spans. The loss mask comes from these spans and the token offsets of one encoding
of the text (`fuelline.chat.encode`), never from re-tokenized prefixes or a text search.
Worked example, `chatml`, one exchange ("Hi", "Hello!"):

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    supervised span [52, 68) = "Hello!<|im_end|>"; turns end at 30 and 69

`reasoning="last"` (the default) keeps `reasoning_content` only on the assistant turns after the
last user turn: Qwen3's own rule for history, which keeps the reasoning of the tool-calling steps
of the final round too. An assistant turn with `"weight": 0` is rendered but never supervised,
under every template; a Jinja template whose `{% generation %}` blocks are not one per assistant
turn cannot say which block is that turn's, so such a conversation is refused.
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
    the last user turn. `train_turns`: supervise every assistant turn, or only the last one.
    """
    return render_checked(conversation_turns(conversation), conversation_tools(conversation, tools), template,
                          add_generation_prompt, variables=variables, reasoning=reasoning, train_turns=train_turns)


def render_checked(turns: list[dict], tools: list[dict] | None, template: str | ChatTemplate,
                   add_generation_prompt: bool = False, *, variables: Mapping[str, Any] | None = None,
                   reasoning: str = "last", train_turns: str = "all") -> Rendering:
    """`render` of turns and tools that `conversation_turns` and `conversation_tools` have checked
    (`encode_chats` checks each conversation once, before it renders it, maybe several times)."""
    for key, value, allowed in (("reasoning", reasoning, REASONING), ("train_turns", train_turns, TRAIN_TURNS)):
        if value not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
    if reasoning != "keep" and any(len(turn) > 2 and "reasoning_content" in turn for turn in turns):
        turns = _reasoning_kept(turns, reasoning)
    if isinstance(template, str):
        template = get_template(template)
    trained = _trained_turns(turns, train_turns)
    if template.jinja is None:
        rendering = render_fields(turns, tools, template, add_generation_prompt)
    elif not template.jinja:
        raise ValueError(f"chat template {template.name!r} renders with a tokenizer's own Jinja template; "
                         f"encode_chat finds it, or pass the Jinja source as ChatTemplate(jinja=...)")
    else:
        rendering = render_jinja(turns, tools, template, add_generation_prompt, variables or {}, trained)
    spans = _supervised_spans(rendering.spans, turns, template, train_turns, trained)
    return rendering if spans == rendering.spans else dataclasses.replace(rendering, spans=spans)


def _trained_turns(turns: list[dict], train_turns: str) -> list[int]:
    """The assistant turns `train_turns` and the weights leave to train on."""
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    return [i for i in (assistant[-1:] if train_turns == "last" else assistant) if turns[i].get("weight", 1)]


def _supervised_spans(spans: tuple[tuple[int, int], ...], turns: list[dict], t: ChatTemplate, train_turns: str,
                      trained: list[int]) -> tuple[tuple[int, int], ...]:
    """The spans of the `trained` turns. Without a weight-0 turn a span need not be a turn's (a Jinja template's
    generation blocks may not be one per assistant turn), so `train_turns="last"` keeps the last span."""
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    if all(turns[i].get("weight", 1) for i in assistant):
        return spans[-1:] if train_turns == "last" else spans
    if len(spans) != len(assistant):
        raise ValueError(f"turn {next(i for i, turn in enumerate(turns) if turn.get('weight') == 0)}: weight 0, but "
                         f"the Jinja chat template of {t.name!r} has {len(spans)} {{% generation %}} block(s) for "
                         f"{len(assistant)} assistant turn(s), so which tokens are this turn's is unknown")
    return tuple(span for i, span in zip(assistant, spans) if i in trained)


def _reasoning_kept(turns: list[dict], reasoning: str) -> list[dict]:
    """The turns without the `reasoning_content` that `reasoning` (drop or last) leaves out."""
    last_user = max((i for i, turn in enumerate(turns) if turn["role"] == "user"), default=-1)
    return [{k: v for k, v in turn.items() if k != "reasoning_content"}
            if "reasoning_content" in turn and (reasoning == "drop" or i < last_user) else turn
            for i, turn in enumerate(turns)]
