"""Assistant turns of a Jinja template without generation blocks, found by rendering turn by turn.

What a template writes for assistant turn i is what rendering the conversation through turn i
(A_i) adds beyond what it writes before any assistant turn's own text there: the model's answer.
That start is found by a probe, turns[:i] and an assistant turn whose empty content is marked:
the text before the mark is a prefix of A_i whatever the template writes there (the generation
prompt, Hermes' tool results closed as they are when a turn follows, Qwen3's empty think block on
the last turn, which the named `qwen3` does not supervise either). Where it is not a prefix (a turn
whose reasoning replaces that think block), the turn starts after the generation prompt, where
rendering turns[:i] with the generation prompt (P_i) ends, if P_i is a prefix of A_i.

Used where the template is consistent with itself, proven per conversation: each A_i is a prefix
of the full rendering, each turn's text starts where the previous one has ended, and it holds what
the turn says (the name of each tool call, else its content, stripped: a template that writes a
turn only once another follows, or ignores `tool_calls`, is caught so). So every piece is where
the full text has it. A turn that is not so is given a `NotIncremental`, naming the turn and
what moved (Qwen3's template drops the think block of earlier turns, Mistral's moves the tools
before the last user message); the caller locates that turn by other means or refuses it.

Supervised of a turn's text: up to and including its last end-of-turn token; what follows
(ChatML's "\n") the template writes, not the model. Cost: two renderings per assistant turn,
the full rendering counted among them, and P_i for a turn with reasoning.
"""

from __future__ import annotations

from typing import Callable

from fuelline.chat.content_marks import CONTENT_MARK, CONTENT_OPEN, marked

Render = Callable[[list[dict], bool], str]  # (turns, add_generation_prompt) -> text


class NotIncremental(ValueError):
    """A conversation the template does not render turn by turn: `turn`, and `moved`, what changes where."""

    def __init__(self, turn: int, moved: str):
        super().__init__(f"turn {turn}: {moved}")
        self.turn, self.moved = turn, moved


def incremental_spans(turns: list[dict], assistant: list[int], text: str, generation_prompt: bool, render: Render,
                      ends_of_turn: tuple[str, ...]) -> list[tuple[tuple[int, int], int] | NotIncremental]:
    """For each assistant turn, its supervised span in `text` (the full rendering) and where its text ends, or
    the `NotIncremental` that says why it cannot be found so (the caller falls back to marks for that turn)."""
    found, previous_end = [], 0
    for i in assistant:
        try:
            span, end = _turn(turns, i, text, generation_prompt, render, ends_of_turn, previous_end)
        except NotIncremental as moved:
            found.append(moved)
            continue
        found.append((span, end))
        previous_end = end
    return found


def _turn(turns: list[dict], i: int, text: str, generation_prompt: bool, render: Render,
          ends_of_turn: tuple[str, ...], previous_end: int) -> tuple[tuple[int, int], int]:
    through = text if i == len(turns) - 1 and not generation_prompt else render(turns[:i + 1], False)
    if not text.startswith(through):
        raise NotIncremental(i, f"rewrites turn {i} once later turns follow it{_where(through, text)}")
    start = _start(turns, i, through, render)
    if start < previous_end:
        raise NotIncremental(i, f"ends the generation prompt of turn {i} before the previous assistant turn ends "
                                f"(character {start}, not {previous_end})")
    _require_said(turns[i], i, text[start:len(through)])
    return (start, _end_of_turn(text, start, len(through), ends_of_turn)), len(through)


def _start(turns: list[dict], i: int, through: str, render: Render) -> int:
    """Where turn i's own text starts in A_i: where a probe's empty content starts, else where P_i ends."""
    try:
        probe = render(marked([*turns[:i], {"role": "assistant", "content": ""}], [i]), False)
    except ValueError:  # a template that refuses an empty answer: P_i alone says where the turn starts
        probe = ""
    marks = list(CONTENT_MARK.finditer(probe))
    if len(marks) == 2 and marks[0].group(1) == CONTENT_OPEN and through.startswith(probe[:marks[0].start()]):
        return marks[0].start()
    prompt = render(turns[:i], True)
    if not through.startswith(prompt):
        raise NotIncremental(i, f"rewrites the turns before turn {i} once turn {i} follows them"
                                f"{_where(prompt, through)}")
    return len(prompt)


def _require_said(turn: dict, i: int, written: str) -> None:
    """A turn's text must hold each of its tool calls' names, or, without calls, its content (stripped): else it
    is another turn's text (a template that writes a turn only once another follows) or an answer without its
    calls (a template that ignores `tool_calls`). A content or reasoning the template leaves out beside tool calls
    (Hermes' and Llama 3.1's write only the calls) is not trained on, as it is not in the text."""
    calls = (turn.get("tool_calls") or ()) if len(turn) > 2 else ()
    said = [(f"tool_calls[{j}] ({call['function']['name']!r})", call["function"]["name"])
            for j, call in enumerate(calls)] or [("content", turn["content"].strip())]
    for what, value in said:
        if value not in written:
            raise NotIncremental(i, f"writes a text for turn {i} that lacks its {what}")


def _end_of_turn(text: str, start: int, end: int, ends_of_turn: tuple[str, ...]) -> int:
    """The end of the last end-of-turn token in text[start:end], else `end`."""
    found = [at + len(token) for token in ends_of_turn if token and (at := text.rfind(token, start, end)) >= 0]
    return max(found, default=end)


def _where(shorter: str, longer: str) -> str:
    """Where two renderings part: the first differing character and a few characters of each around it."""
    at = next((k for k, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
    return (f": at character {at}, {shorter[max(0, at - 24):at + 12]!r} becomes "
            f"{longer[max(0, at - 24):at + 12]!r}")
