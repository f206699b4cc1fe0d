"""Jinja chat templates (`auto`, or a template with a `jinja` source): where the spans to supervise are.

The text is what `fuelline.chat.jinja_sandbox` renders, as transformers renders it; this module
locates in it the span of every assistant turn, by one rule on every path (docs/chat.md): what
the model writes after the generation prompt, up to and including the end-of-turn token. Where
it is found:

- the template's `{% generation %}` blocks when it has them (ids and mask then equal
  `apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True)`);
- otherwise by rendering the conversation turn by turn (`fuelline.chat.incremental_spans`),
  for plain turns and turns with tool calls or reasoning alike, where the template proves
  consistent with itself on the conversation;
- where it does not, by marks around each assistant content (`fuelline.chat.content_marks`),
  the content extended over an end-of-turn token right after it; a turn with tool calls or
  reasoning cannot be located so, and the conversation is refused, naming the template, the turn
  and what moved.

The end-of-turn token is the template's `end_of_turn`, else the tokenizer's eos token or one of
END_OF_TURN_TOKENS.
"""

from __future__ import annotations

import re
from typing import Any, Collection, Mapping

from fuelline.chat.content_marks import Unlocated, content_spans, refuse_reserved
from fuelline.chat.incremental_spans import NotIncremental, incremental_spans
from fuelline.chat.jinja_sandbox import (GENERATION_CLOSE, GENERATION_OPEN, has_generation_blocks, one_conversation,
                                         run_jinja)
from fuelline.chat.template_registry import ChatTemplate, Rendering, registered

# Tried, after the tokenizer's eos token, as the end-of-turn token of a Jinja template.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<turn|>", "<end_of_turn>", "<|end|>")
_GENERATION_MARKS = re.compile(f"[{GENERATION_OPEN}{GENERATION_CLOSE}]")


def render_jinja(turns: list[dict], tools: list[dict] | None, t: ChatTemplate, add_generation_prompt: bool,
                 variables: Mapping[str, Any], trained: Collection[int]) -> Rendering:
    """`trained`: the assistant turns whose spans are used. The others get an empty span, so a turn that is
    not trained on (`train_turns="last"`, weight 0) is never refused for where it is."""
    with one_conversation():
        return _render(turns, tools, t, add_generation_prompt, variables, trained)


def _render(turns: list[dict], tools: list[dict] | None, t: ChatTemplate, add_generation_prompt: bool,
            variables: Mapping[str, Any], trained: Collection[int]) -> Rendering:
    refuse_reserved(turns, tools)
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    text, blocks = _remove_generation_marks(run_jinja(t, turns, tools, add_generation_prompt, variables))
    if has_generation_blocks(t.jinja):
        # one block per assistant turn: a turn ends with its block; else 0, a lower bound for every turn
        ends = [end for _, end in blocks] if len(blocks) == len(assistant) else [0] * len(assistant)
        return Rendering(text, tuple(blocks), _turn_ends(turns, ends))

    def render(part: list[dict], generation_prompt: bool) -> str:
        return run_jinja(t, part, tools, generation_prompt, variables)

    ends_of_turn = (t.end_of_turn,) if t.end_of_turn else (variables.get("eos_token") or "", *END_OF_TURN_TOKENS)
    located = [i for i in assistant if i in trained]
    found = dict(zip(located, incremental_spans(turns, located, text, add_generation_prompt, render, ends_of_turn,
                                                reads_calls="tool_calls" in t.jinja)))
    moved = {i: result for i, result in found.items() if isinstance(result, NotIncremental)}
    if moved:
        marked = _marked_spans(turns, list(moved), t, text, lambda part: render(part, add_generation_prompt),
                               ends_of_turn, moved)
        found.update({i: (span, span[1]) for i, span in zip(moved, marked)})
    for before, after in zip(located, located[1:]):
        if found[after][0][0] < found[before][0][1]:
            raise ValueError(f"turn {after}: the Jinja chat template of {t.name!r} writes this turn's span before the "
                             f"previous assistant turn's ends, so its loss span is unknown; {_remedy()}")
    untrained = ((0, 0), 0)  # an empty span, and 0 for its end: a lower bound, as a truncation's estimate needs
    return Rendering(text, tuple(found.get(i, untrained)[0] for i in assistant),
                     _turn_ends(turns, [found.get(i, untrained)[1] for i in assistant]))


def _remedy() -> str:
    return (f"put {{% generation %}}…{{% endgeneration %}} around what the template writes of an assistant turn, "
            f"or use a named template ({', '.join(n for n, _ in registered() if n != 'auto')})")


def _marked_spans(turns: list[dict], which: list[int], t: ChatTemplate, text: str, render_marked,
                  ends_of_turn: tuple[str, ...], moved: dict[int, NotIncremental]) -> list[tuple[int, int]]:
    """The spans of turns `which` by content marks: each content and the end-of-turn token after it."""
    for i in which:
        for key, what in (("tool_calls", "tool calls"), ("reasoning_content", "reasoning")):
            if turns[i].get(key):
                raise ValueError(f"turn {i}: the Jinja chat template of {t.name!r} {moved[i].moved}, so this turn "
                                 f"cannot be found by rendering the conversation turn by turn, and its {what} are "
                                 f"written outside its content, where no mark can locate them; {_remedy()}"
                                 + (", or reasoning='drop'" if key == "reasoning_content" else ""))
    try:
        located = content_spans(turns, which, text, render_marked)
    except Unlocated as e:
        raise ValueError(f"turn {e.turn}: the Jinja chat template of {t.name!r} {e.problem}, so its loss span is "
                         f"unknown (and it {moved[e.turn].moved}, so rendering turn by turn cannot find it either); "
                         f"{_remedy()}") from None
    return [(start, end + len(next((e for e in ends_of_turn if e and text.startswith(e, end)), "")))
            for start, end in located]


def _turn_ends(turns: list[dict], assistant_ends: list[int]) -> tuple[int, ...]:
    """Each turn's end: its assistant span's end, or that of the last assistant turn before it (0 if none)."""
    ends, found, end = [], iter(assistant_ends), 0
    for turn in turns:
        if turn["role"] == "assistant":
            end = next(found)
        ends.append(end)
    return tuple(ends)


def _remove_generation_marks(raw: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without the marks of `{% generation %}` blocks, and the blocks' spans in it."""
    spans, start = [], None
    for k, mark in enumerate(_GENERATION_MARKS.finditer(raw)):
        at = mark.start() - k  # k marks before this one are removed
        if (mark.group() == GENERATION_OPEN) != (start is None):
            raise ValueError("{% generation %} blocks in a chat template must not be nested")
        if start is None:
            start = at
        else:
            spans.append((start, at))
            start = None
    return _GENERATION_MARKS.sub("", raw), spans
