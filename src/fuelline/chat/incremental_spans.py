"""Assistant turns of a Jinja template without generation blocks, found by rendering turn by turn.

What a template writes for assistant turn i is what rendering the conversation through turn i
(A_i) adds beyond what it writes before any assistant turn's own text there: the model's answer.
That start is found by a probe, turns[:i] and an assistant turn whose empty content is marked:
the text before the mark is a prefix of A_i whatever the template writes there (the generation
prompt, Hermes' tool results closed as they are when a turn follows, Qwen3's empty think block on
the last turn, which the named `qwen3` does not supervise either). Where it is not a prefix (a turn
whose reasoning replaces that think block), the turn starts after the generation prompt, where
rendering turns[:i] with the generation prompt (P_i) ends, if P_i is a prefix of A_i.

What the probe has before its content is the template's only where the template writes it before a
tool call too (a second probe, an assistant turn with one call): where a call is written in its
place (Mistral's " " before an answer, where `[TOOL_CALLS]` starts a call) the turn starts where
the two probes part, never before where P_i and A_i part; where the template shows no call, at the
end of P_i when only whitespace is between it and the probe's content (GLM-4-0414's "\n" after
`<|assistant|>`, where its model writes a function name; a think block is a mode the template sets).
Either way that position is the model's choice between answering and calling, and it is supervised.

Used where the template is consistent with itself, proven per conversation: each A_i is a prefix
of the full rendering, each turn's text starts where the previous one has ended, and the turn's
supervised text holds what the turn says: each tool call's name and argument strings, found by
rendering A_i again with each held by a placeholder of its own (never by a search of the text: a
tool named `end` is in `<|im_end|>`, which the template writes anyway); else its content, stripped,
among what A_i has beyond the empty probe. A template that writes a turn only once another follows,
or ignores `tool_calls`, is caught so. So every piece is where the full text has it. A turn that is
not so is given a `NotIncremental`, naming the turn and what moved (Qwen3's template drops the
think block of earlier turns, Mistral's moves the tools before the last user message); the caller
locates that turn by other means or refuses it.

Supervised of a turn's text: up to and including its last end-of-turn token; what follows
(ChatML's "\n") the template writes, not the model. Cost: three renderings per assistant turn (the
full rendering counted among them; the second probe, or P_i; a turn with calls, which is its own
second probe, renders its placeholders instead), four for Mistral's answers, and P_i where the
probe's text is not a prefix of A_i. Where two or more turns have calls, their placeholders are all
rendered at once, in one rendering of the whole conversation written back to its text, instead of
one per turn; a turn that rendering does not prove is checked alone.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from fuelline.chat.content_marks import CONTENT_MARK, CONTENT_OPEN, marked

Render = Callable[[list[dict], bool], str]  # (turns, add_generation_prompt) -> text

# The call of the second probe: a name no data holds (a noncharacter, refused in a conversation), an id of
# 9 letters (Mistral's templates require that), no arguments.
_PROBE_NAME = "\ufdd0"
_PROBE_CALL = {"id": "probecall", "type": "function", "function": {"name": _PROBE_NAME, "arguments": {}}}
# The placeholders of a call's name and argument strings: number k in noncharacter digits, between two U+FDD1.
_HOLD = "\ufdd1"
_TO_DIGITS = str.maketrans("0123456789", "".join(map(chr, range(0xFDE4, 0xFDEE))))
_FROM_DIGITS = str.maketrans("".join(map(chr, range(0xFDE4, 0xFDEE))), "0123456789")
_PLACEHOLDER = re.compile(f"{_HOLD}([\ufde4-\ufded]+){_HOLD}")


class NotIncremental(ValueError):
    """A conversation the template does not render turn by turn: `turn`, and `moved`, what changes where."""

    def __init__(self, turn: int, moved: str):
        super().__init__(f"turn {turn}: {moved}")
        self.turn, self.moved = turn, moved


def incremental_spans(turns: list[dict], assistant: list[int], text: str, generation_prompt: bool, render: Render,
                      ends_of_turn: tuple[str, ...], reads_calls: bool = True
                      ) -> list[tuple[tuple[int, int], int] | NotIncremental]:
    """For each assistant turn, its supervised span in `text` (the full rendering) and where its text ends, or
    the `NotIncremental` that says why it cannot be found so (the caller falls back to marks for that turn).
    `reads_calls`: False for a template whose source never names `tool_calls` (it shows no call: the second
    probe is not rendered)."""
    found, previous_end = [], 0
    placed = _placed_at_once(turns, assistant, text, generation_prompt, render)
    for i in assistant:
        try:
            span, end = _turn(turns, i, text, generation_prompt, render, ends_of_turn, previous_end, reads_calls,
                              placed)
        except NotIncremental as moved:
            found.append(moved)
            continue
        found.append((span, end))
        previous_end = end
    return found


def _turn(turns: list[dict], i: int, text: str, generation_prompt: bool, render: Render,
          ends_of_turn: tuple[str, ...], previous_end: int, reads_calls: bool, placed: dict[int, list] | None
          ) -> tuple[tuple[int, int], int]:
    through = text if i == len(turns) - 1 and not generation_prompt else render(turns[:i + 1], False)
    if not text.startswith(through):
        raise NotIncremental(i, f"rewrites turn {i} once later turns follow it{_where(through, text)}")
    start, bare = _start(turns, i, through, render, reads_calls)
    if start < previous_end:
        raise NotIncremental(i, f"ends the generation prompt of turn {i} before the previous assistant turn ends "
                                f"(character {start}, not {previous_end})")
    span = (start, _end_of_turn(text, start, len(through), ends_of_turn))
    _require_said(turns, i, through, span, bare, render, placed)
    return span, len(through)


def _start(turns: list[dict], i: int, through: str, render: Render, reads_calls: bool) -> tuple[int, str | None]:
    """Where turn i's own text starts in A_i (module docstring), and the empty probe's text without its marks
    (the turn said nothing: no content, calls or reasoning), None if the template refuses that probe."""
    try:
        probe = render(marked([*turns[:i], {"role": "assistant", "content": ""}], [i]), False)
    except ValueError:  # a template that refuses an empty answer: P_i alone says where the turn starts
        probe = ""
    bare = CONTENT_MARK.sub("", probe) if probe else None
    marks = list(CONTENT_MARK.finditer(probe))
    if len(marks) == 2 and marks[0].group(1) == CONTENT_OPEN and through.startswith(probe[:marks[0].start()]):
        return _before_a_call(turns, i, through, marks[0].start(), probe, render, reads_calls), bare
    prompt = render(turns[:i], True)
    if not through.startswith(prompt):
        raise NotIncremental(i, f"rewrites the turns before turn {i} once turn {i} follows them"
                                f"{_where(prompt, through)}")
    return len(prompt), bare


def _before_a_call(turns: list[dict], i: int, through: str, start: int, probe: str, render: Render,
                   reads_calls: bool) -> int:
    """`start` (where the empty probe's content starts) moved back to where the probe and a probe with a call
    part, if the template shows that call, never before where P_i and A_i part (what the generation prompt
    writes is the prompt's); else to the end of P_i, where P_i is a prefix of A_i and only whitespace is
    between (a separator the prompt leaves to the model; a think block is a mode the template sets)."""
    if len(turns[i]) > 2 and turns[i].get("tool_calls"):
        return start  # A_i writes a call (else the turn is refused) after the probe's text: that is the template's
    parted = None
    if reads_calls:
        try:
            call = render([*turns[:i], {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}], False)
        except ValueError:
            call = ""
        at = _common_prefix(probe, call)
        if _find(call, _PROBE_NAME, at, len(call)) >= 0:
            if at >= start:
                return start
            parted = at
    prompt = render(turns[:i], True)
    if parted is not None:
        return max(parted, _common_prefix(prompt, through))
    return len(prompt) if len(prompt) < start and through.startswith(prompt) and not through[len(prompt):start].strip() \
        else start


def _require_said(turns: list[dict], i: int, through: str, span: tuple[int, int], bare: str | None,
                  render: Render, placed: dict[int, list] | None) -> None:
    """The supervised text of turn i must hold what the turn says, among what the turn adds (module docstring):
    else it is another turn's text (a template that writes a turn only once another follows) or an answer
    without its calls (a template that ignores `tool_calls`). A content or reasoning the template leaves out
    beside tool calls (Hermes' and Llama 3.1's write only the calls) is not trained on, as it is not in the text."""
    turn = turns[i]
    if _calls(turn):
        if placed is None or not _all_in(placed[i], span):
            _require_calls(turns, i, through, span, render)
        return
    content = turn["content"].strip()
    lo, hi = _added(through, bare) if bare is not None else (0, len(through))
    if content and through.find(content, max(lo, span[0]), min(hi, span[1])) < 0:
        raise NotIncremental(i, f"writes a text for turn {i} that lacks its content")


def _placed_at_once(turns: list[dict], assistant: list[int], text: str, generation_prompt: bool,
                    render: Render) -> dict[int, list[list[tuple[int, int]]]] | None:
    """Where in `text` each string of the calls of turns `assistant` is, from one rendering of the whole
    conversation with all of them held by placeholders (each its own number): per turn, per string, the places
    its placeholder is written back. None where fewer than two turns have calls (each turn's own rendering, a
    prefix, costs less), or where that rendering is refused or does not write back to `text`: each turn is then
    checked alone, as a template that matches a tool result to its call by name needs."""
    with_calls = [i for i in assistant if _calls(turns[i])]
    if len(with_calls) < 2:
        return None
    held: list[str] = []
    firsts, part = {}, list(turns)
    for i in with_calls:
        firsts[i] = len(held)
        part[i] = _held_turn(turns[i], held)
    try:
        places = _written_back(render(part, generation_prompt), held, text)
    except ValueError:
        return None
    if places is None:
        return None
    return {i: places[first:first + _count(turns[i])] for i, first in firsts.items()}


def _require_calls(turns: list[dict], i: int, through: str, span: tuple[int, int], render: Render) -> None:
    """Each call's name and argument strings must be in turn i's supervised text: A_i is rendered again with each
    of them held by a placeholder of its own (noncharacters, which no data holds), each of which must be there;
    and the placeholders written back must give A_i (the template writes them as they are, or JSON-escaped)."""
    held: list[str] = []
    try:
        placed = render([*turns[:i], _held_turn(turns[i], held)], False)
    except ValueError as e:
        raise NotIncremental(i, f"cannot render turn {i} with its tool calls' names and arguments held by "
                                f"placeholders ({e}), so whether it writes them is unknown") from None
    places = _written_back(placed, held, through)
    if places is None:
        raise NotIncremental(i, f"transforms the names or arguments of turn {i}'s tool calls (or escapes them), "
                                f"so whether it writes them is unknown")
    k = 0
    for j, call in enumerate(turns[i]["tool_calls"]):
        function = call["function"]
        for what in ("its name", *(repr(value) for value in held[k + 1:k + 1 + _strings(function["arguments"])])):
            if not _all_in(places[k:k + 1], span):
                raise NotIncremental(i, f"writes a text for turn {i} that lacks its tool_calls[{j}] "
                                        f"({function['name']!r}): {what} is not in the turn's supervised text")
            k += 1


def _calls(turn: dict) -> bool:
    return len(turn) > 2 and bool(turn.get("tool_calls"))


def _held_turn(turn: dict, held: list[str]) -> dict:
    """The turn with each of its calls' names and argument strings held by a placeholder (numbered on in `held`)."""
    return {**turn, "tool_calls": [{**call, "function": {**call["function"],
                                                         "name": _hold(call["function"]["name"], held),
                                                         "arguments": _hold(call["function"]["arguments"], held)}}
                                   for call in turn["tool_calls"]]}


def _count(turn: dict) -> int:
    """How many strings `_held_turn` holds of the turn's calls."""
    return sum(_strings(call["function"]["name"]) + _strings(call["function"]["arguments"])
               for call in turn["tool_calls"])


def _all_in(places: list[list[tuple[int, int]]], span: tuple[int, int]) -> bool:
    """Whether each string is written back at least once within `span`."""
    return all(any(span[0] <= lo and hi <= span[1] for lo, hi in where) for where in places)


def _hold(value, held: list[str]):
    """`value` with each non-empty string (a name, an argument's string leaves) replaced by its placeholder."""
    if isinstance(value, dict):
        return {key: _hold(v, held) for key, v in value.items()}
    if isinstance(value, list):
        return [_hold(v, held) for v in value]
    if isinstance(value, str) and value:
        held.append(value)
        return _HOLD + str(len(held) - 1).translate(_TO_DIGITS) + _HOLD
    return value


def _strings(value) -> int:
    """How many non-empty strings a JSON value's leaves hold (a call's argument values)."""
    if isinstance(value, dict):
        return sum(map(_strings, value.values()))
    if isinstance(value, list):
        return sum(map(_strings, value))
    return int(isinstance(value, str) and value != "")


def _written_back(placed: str, held: list[str], through: str) -> list[list[tuple[int, int]]] | None:
    """Where in `through` each held string is, if `through` is `placed` with each placeholder its string, as it
    is or as a JSON string writes it (the form after which the text goes on as `placed` does); else None."""
    pieces = _PLACEHOLDER.split(placed)  # text, number, text, …, text
    at = len(pieces[0])
    if not through.startswith(pieces[0]):
        return None
    places: list[list[tuple[int, int]]] = [[] for _ in held]
    for number, after in zip(pieces[1::2], pieces[2::2]):
        k = int(number.translate(_FROM_DIGITS))
        forms = sorted(_written(held[k]), key=len, reverse=True)
        form = next((f for f in forms if through.startswith(f + after[:64], at)), None)
        if form is None or not through.startswith(after, at + len(form)):
            return None
        places[k].append((at, at + len(form)))
        at += len(form) + len(after)
    return places if at == len(through) else None


def _added(text: str, other: str) -> tuple[int, int]:
    """Where in `text` what it has beyond `other` is: between their common prefix and common suffix; where
    those overlap (a text inserted beside copies of itself), wherever such an insertion may be."""
    n = min(len(text), len(other))
    prefix = _common_prefix(text, other)
    suffix = _common_suffix(text, other)
    if prefix + suffix < n:
        return prefix, len(text) - suffix
    return (n - suffix, prefix + len(text) - n) if len(text) > len(other) else (prefix, prefix)


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b (a binary search of whole-slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a.startswith(b[:mid]) else (lo, mid - 1)
    return lo


def _common_suffix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if a.endswith(b[len(b) - mid:]) else (lo, mid - 1)
    return lo


def _find(text: str, value: str, lo: int, hi: int) -> int:
    """Where `value` is in text[lo:hi], as it is or as a JSON string writes it (escaped), or -1."""
    return max(text.find(form, lo, hi) for form in _written(value))


def _written(value: str) -> set[str]:
    return {value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]}


def _end_of_turn(text: str, start: int, end: int, ends_of_turn: tuple[str, ...]) -> int:
    """The end of the last end-of-turn token in text[start:end], else `end`."""
    found = [at + len(token) for token in ends_of_turn if token and (at := text.rfind(token, start, end)) >= 0]
    return max(found, default=end)


def _where(shorter: str, longer: str) -> str:
    """Where two renderings part: the first differing character and a few characters of each around it."""
    at = _common_prefix(shorter, longer)
    return (f": at character {at}, {shorter[max(0, at - 24):at + 12]!r} becomes "
            f"{longer[max(0, at - 24):at + 12]!r}")
