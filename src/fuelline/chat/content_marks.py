"""Assistant contents located by marks: the fallback of a Jinja template that cannot be rendered turn by turn.

The conversation is rendered a second time with each assistant content between two marks that
name its turn (Unicode noncharacters; a content holding any of U+FDD0-U+FDEF is refused), and a
content's span is where its marks are. Never a text search: "a" is also in the next "assistant"
header. The marks locate a content only when the marked text, marks removed, is the plain text,
and each content is between its own marks once, verbatim, in order; otherwise the conversation
is refused, naming the turn, since its span would be a guess (a template that strips, splits,
slices, repeats, leaves out or reorders a content). Tool calls and reasoning are rendered outside
the content, where no mark can locate them. The second rendering costs about as much as the
first (GSM8K, Qwen3's template: ~100 µs more per conversation).
"""

from __future__ import annotations

import re
from typing import Callable

from fuelline.chat.jinja_sandbox import tojson

# The marks of assistant contents, each followed by the turn's number in 16 digits of their own.
CONTENT_OPEN, CONTENT_CLOSE = "\ufdd2", "\ufdd3"
_DIGITS = "".join(map(chr, range(0xFDD4, 0xFDE4)))
CONTENT_MARK = re.compile(f"([{CONTENT_OPEN}{CONTENT_CLOSE}])([{_DIGITS}]+)")
_RESERVED = re.compile("[\ufdd0-\ufdef]")


class Unlocated(ValueError):
    """An assistant content the marks do not locate: `turn` (None when no single content is at fault), `problem`."""

    def __init__(self, turn: int | None, problem: str):
        super().__init__(f"turn {turn}: {problem}")
        self.turn, self.problem = turn, problem


def refuse_reserved(turns: list[dict], tools: list[dict] | None) -> None:
    """Refuse a conversation that spells a mark, so that no mark is ever taken for the data's own text."""
    fields = [(f"turn {i}: {key}", value) for i, turn in enumerate(turns)
              for key, value in (turn.items() if len(turn) > 2 else [("content", turn["content"])])]
    for where, value in [*fields, ("tools", tools or "")]:
        if (reserved := _RESERVED.search(value if isinstance(value, str) else tojson(value))) is not None:
            raise ValueError(f"{where} holds U+{ord(reserved.group()):04X}, one of the Unicode noncharacters "
                             f"U+FDD0-U+FDEF that mark spans while a Jinja template renders")


def content_spans(turns: list[dict], assistant: list[int], text: str,
                  render_marked: Callable[[list[dict]], str]) -> list[tuple[int, int]]:
    """Where each assistant content is in `text`: its marks in a rendering with the contents marked.

    One extra rendering marks all contents at once. Only when their marks do not give the
    spans, and do not tell which turn is at fault, is each content marked alone in turn, to
    name the first one that cannot be located (`Unlocated`).
    """
    if not assistant:
        return []
    found = _spans_from_marks(render_marked(marked(turns, assistant)), text, turns, assistant)
    if isinstance(found, list):
        return found
    turn, problem = found
    if turn is None:
        alone = (_spans_from_marks(render_marked(marked(turns, [i])), text, turns, [i]) for i in assistant)
        turn = next((i for i, spans in zip(assistant, alone) if not isinstance(spans, list)), assistant[0])
    raise Unlocated(turn, problem)


def marked(turns: list[dict], which: list[int]) -> list[dict]:
    """The turns with the contents of turns `which` between an opening and a closing mark naming the turn."""
    return [{**turn, "content": f"{CONTENT_OPEN}{_digits(i)}{turn['content']}{CONTENT_CLOSE}{_digits(i)}"}
            if i in which else turn for i, turn in enumerate(turns)]


def _digits(number: int) -> str:
    return "".join(_DIGITS[int(d, 16)] for d in f"{number:x}")


def _spans_from_marks(raw: str, text: str, turns: list[dict],
                      which: list[int]) -> list[tuple[int, int]] | tuple[int | None, str]:
    """The spans in `text` of the contents marked in `raw`, or (the turn, if known; what is wrong)."""
    if CONTENT_MARK.sub("", raw) != text:
        return None, "transforms this assistant content (it strips, splits, slices or tests it)"
    marks: dict[int, dict[str, list[int]]] = {i: {CONTENT_OPEN: [], CONTENT_CLOSE: []} for i in which}
    removed = 0
    for mark in CONTENT_MARK.finditer(raw):
        turn = int("".join(f"{_DIGITS.index(d):x}" for d in mark.group(2)), 16)
        if turn in marks:  # a number no content was given (the template cut its digits): that content lacks it
            marks[turn][mark.group(1)].append(mark.start() - removed)
        removed += len(mark.group())
    spans = []
    for i in which:
        opens, closes = marks[i][CONTENT_OPEN], marks[i][CONTENT_CLOSE]
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
