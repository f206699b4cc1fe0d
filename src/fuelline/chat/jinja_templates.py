"""Jinja chat templates (`auto`, or a template with a `jinja` source): where the spans to supervise are.

The text is what `fuelline.chat.jinja_sandbox` renders, as transformers renders it; this module
locates in it the span of every assistant turn. The spans are the template's `{% generation %}`
blocks when it has them (ids and mask then equal `apply_chat_template(messages, tools=tools,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`). Otherwise the
conversation is rendered a second time with each assistant content between two marks that name
its turn (Unicode noncharacters; a content holding any of U+FDD0-U+FDEF is refused), and a
content's span is where its marks are, extended over an end-of-turn token right after it (the
template's `end_of_turn`, else the eos token or one of END_OF_TURN_TOKENS). Never a text search:
"a" is also in the next "assistant" header. The marks locate a content only when the marked
text, marks removed, is the plain text, and each content is between its own marks once,
verbatim, in order; otherwise the conversation is refused, naming the turn, since its span would
be a guess (a template that strips, splits, slices, repeats, leaves out or reorders a content).
The second rendering costs about as much as the first (GSM8K, Qwen3's template: ~100 µs more per
conversation). Tool calls and reasoning are rendered outside the content, where no mark can
locate them, so without generation blocks an assistant turn with either is refused.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from fuelline.chat.jinja_sandbox import GENERATION_CLOSE, GENERATION_OPEN, has_generation_blocks, run_jinja, tojson
from fuelline.chat.template_registry import ChatTemplate, Rendering, registered

# Tried, after the tokenizer's eos token, as the end-of-turn token of a Jinja template.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<turn|>", "<end_of_turn>", "<|end|>")
_GENERATION_MARKS = re.compile(f"[{GENERATION_OPEN}{GENERATION_CLOSE}]")
# The marks of assistant contents, each followed by the turn's number in 16 digits of their own.
_CONTENT_OPEN, _CONTENT_CLOSE = "\ufdd2", "\ufdd3"
_DIGITS = "".join(map(chr, range(0xFDD4, 0xFDE4)))
_CONTENT_MARK = re.compile(f"([{_CONTENT_OPEN}{_CONTENT_CLOSE}])([{_DIGITS}]+)")
_RESERVED = re.compile("[\ufdd0-\ufdef]")


def render_jinja(turns: list[dict], tools: list[dict] | None, t: ChatTemplate, add_generation_prompt: bool,
                 variables: Mapping[str, Any]) -> Rendering:
    _refuse_reserved(turns, tools)
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    text, blocks = _remove_generation_marks(run_jinja(t, turns, tools, add_generation_prompt, variables))
    if has_generation_blocks(t.jinja):
        # one block per assistant turn: a turn ends with its block; else 0, a lower bound for every turn
        ends = [end for _, end in blocks] if len(blocks) == len(assistant) else [0] * len(assistant)
        return Rendering(text, tuple(blocks), _turn_ends(turns, ends))
    spans = _marked_spans(turns, assistant, t, text,
                          lambda marked: run_jinja(t, marked, tools, add_generation_prompt, variables),
                          variables)
    return Rendering(text, tuple(spans), _turn_ends(turns, [end for _, end in spans]))


def _refuse_reserved(turns: list[dict], tools: list[dict] | None) -> None:
    fields = [(f"turn {i}: {key}", value) for i, turn in enumerate(turns)
              for key, value in (turn.items() if len(turn) > 2 else [("content", turn["content"])])]
    for where, value in [*fields, ("tools", tools or "")]:
        if (reserved := _RESERVED.search(value if isinstance(value, str) else tojson(value))) is not None:
            raise ValueError(f"{where} holds U+{ord(reserved.group()):04X}, one of the Unicode noncharacters "
                             f"U+FDD0-U+FDEF that mark spans while a Jinja template renders")


def _marked_spans(turns: list[dict], assistant: list[int], t: ChatTemplate, text: str,
                  render_marked: Callable[[list[dict]], str], variables: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The spans of a template without generation blocks: each assistant content and the end-of-turn token after it."""
    for i in assistant:
        for key, what in (("tool_calls", "tool calls"), ("reasoning_content", "reasoning")):
            if turns[i].get(key):
                raise ValueError(f"turn {i}: the Jinja chat template of {t.name!r} has no {{% generation %}} blocks, "
                                 f"and this turn's {what} would be rendered outside its content, where no mark can "
                                 f"locate it; put {{% generation %}}…{{% endgeneration %}} around what the template "
                                 f"renders of an assistant turn, or use a named template (qwen3)"
                                 + (", or reasoning='drop'" if key == "reasoning_content" else ""))
    eot = (t.end_of_turn,) if t.end_of_turn else (variables.get("eos_token") or "", *END_OF_TURN_TOKENS)
    return [(start, end + len(next((e for e in eot if e and text.startswith(e, end)), "")))
            for start, end in _content_spans(turns, assistant, t, text, render_marked)]


def _turn_ends(turns: list[dict], assistant_ends: list[int]) -> tuple[int, ...]:
    """Each turn's end: its assistant span's end, or that of the last assistant turn before it (0 if none)."""
    ends, found, end = [], iter(assistant_ends), 0
    for turn in turns:
        if turn["role"] == "assistant":
            end = next(found)
        ends.append(end)
    return tuple(ends)


def _content_spans(turns: list[dict], assistant: list[int], t: ChatTemplate, text: str,
                   render_marked: Callable[[list[dict]], str]) -> list[tuple[int, int]]:
    """Where each assistant content is in `text`: its marks in a rendering with the contents marked.

    One extra rendering marks all contents at once. Only when their marks do not give the
    spans, and do not tell which turn is at fault, is each content marked alone in turn, to
    name the first one that cannot be located.
    """
    if not assistant:
        return []
    found = _spans_from_marks(render_marked(_marked(turns, assistant)), text, turns, assistant)
    if isinstance(found, list):
        return found
    turn, problem = found
    if turn is None:
        alone = (_spans_from_marks(render_marked(_marked(turns, [i])), text, turns, [i]) for i in assistant)
        turn = next((i for i, spans in zip(assistant, alone) if not isinstance(spans, list)), assistant[0])
    raise ValueError(f"turn {turn}: the Jinja chat template of {t.name!r} {problem}, so its loss span is "
                     f"unknown; use a named template ({', '.join(n for n, _ in registered() if n != 'auto')}) "
                     f"or put {{% generation %}}…{{% endgeneration %}} around the assistant content in the template")


def _marked(turns: list[dict], which: list[int]) -> list[dict]:
    """The turns with the contents of turns `which` between an opening and a closing mark naming the turn."""
    return [{**turn, "content": f"{_CONTENT_OPEN}{_digits(i)}{turn['content']}{_CONTENT_CLOSE}{_digits(i)}"}
            if i in which else turn for i, turn in enumerate(turns)]


def _digits(number: int) -> str:
    return "".join(_DIGITS[int(d, 16)] for d in f"{number:x}")


def _spans_from_marks(raw: str, text: str, turns: list[dict],
                      which: list[int]) -> list[tuple[int, int]] | tuple[int | None, str]:
    """The spans in `text` of the contents marked in `raw`, or (the turn, if known; what is wrong)."""
    if _CONTENT_MARK.sub("", raw) != text:
        return None, "transforms this assistant content (it strips, splits, slices or tests it)"
    marks: dict[int, dict[str, list[int]]] = {i: {_CONTENT_OPEN: [], _CONTENT_CLOSE: []} for i in which}
    removed = 0
    for mark in _CONTENT_MARK.finditer(raw):
        turn = int("".join(f"{_DIGITS.index(d):x}" for d in mark.group(2)), 16)
        if turn in marks:  # a number no content was given (the template cut its digits): that content lacks it
            marks[turn][mark.group(1)].append(mark.start() - removed)
        removed += len(mark.group())
    spans = []
    for i in which:
        opens, closes = marks[i][_CONTENT_OPEN], marks[i][_CONTENT_CLOSE]
        if not opens and not closes:
            return i, "does not render this assistant content"
        if len(opens) == len(closes) > 1:
            return i, f"renders this assistant content {len(opens)} times"
        if len(opens) != 1 or len(closes) != 1 or text[opens[0]:closes[0]] != turns[i]["content"]:
            return i, "does not render this assistant content verbatim"
        spans.append((opens[0], closes[0]))
    for i, before, after in zip(which[1:], spans, spans[1:]):
        if after[0] < before[1]:
            return i, "renders the assistant contents out of their order"
    return spans


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
