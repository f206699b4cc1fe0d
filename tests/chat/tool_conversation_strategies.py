"""Hypothesis strategies for chat records with tools, shaped for each template family.

A record keeps the chat record contract (`fuelline.formats.chat_record`): an optional system
turn, then rounds of a user turn, zero to two tool steps (an assistant turn with one to three
calls, some with content, some with reasoning, then one result per call, some of them errors) and
an answer; the last round may stop on its tool calls. Contents hold the edge cases of rendering:
leading and trailing spaces and newlines (which llama3.1 and mistral trim), an empty content,
CJK, emoji with joiners, a digit first (a " " before a digit is a token of its own). Per family:
llama3.1 makes one call per turn, mistral's calls and results carry ids of 9 letters and digits,
deepseek-r1 has no tools and writes reasoning into the content (`<think>\\n…\\n</think>\\n\\n`).
User contents are distinct within a record (mistral finds the last user message by equality).
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

from .tool_conversations import TOOLS
from .tool_template_families import Family

PIECES = ["Paris", "東京は晴れ", "🙂", "👨‍👩‍👧", "18 °C", "42", " ", "  ", "\n", "\n\n", "ok.", "a b", "—", "天气"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=4).map("".join)
ANSWER = st.one_of(TEXT, st.sampled_from(["It is 18 °C in Paris.", "12 degrees.", " spaced ", "\nnewline first",
                                          "last newline\n", "東京: 24 °C 🙂"]))
USER = st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join)
REASONING = st.sampled_from(["Paris first.", "\nCheck the units.\n", "18 < 24, so Tokyo. 🤔", "先查天气。"])
CALL_CONTENT = st.sampled_from(["", "", "Let me check.", " Checking… ", "\n"])
RESULT = st.one_of(st.sampled_from(['{"temperature": 18}', '{"time": "21:04", "zone": "東京"}', "Error: unknown city",
                                    "  padded result \n"]), TEXT)
ARGUMENT_VALUES = st.one_of(st.sampled_from(["Paris", "東京", "São Paulo", " spaced ", "🙂"]), st.integers(-1000, 10**6),
                            st.booleans(), st.lists(st.integers(0, 9), max_size=2))
ARGUMENTS = {"get_weather": st.fixed_dictionaries({"city": ARGUMENT_VALUES},
                                                  optional={"unit": st.sampled_from(["celsius", "fahrenheit"])}),
             "get_time": st.fixed_dictionaries({"timezone": st.sampled_from(["Asia/Tokyo", "Europe/Paris"])},
                                               optional={"days": ARGUMENT_VALUES})}
MISTRAL_ID = st.text(alphabet=string.ascii_letters + string.digits, min_size=9, max_size=9)


@st.composite
def records(draw, family: Family) -> dict:
    """A chat record for `family`'s template."""
    turns = [{"role": "system", "content": draw(TEXT)}] if draw(st.integers(0, 2)) == 0 else []
    rounds = draw(st.sampled_from([1, 1, 2, 3]))  # mistral and qwen3 rewrite turns before a later user turn
    users = draw(st.lists(USER, min_size=rounds, max_size=rounds, unique=True))
    ids = iter(draw(st.lists(MISTRAL_ID, min_size=rounds * 6, max_size=rounds * 6, unique=True)))
    any_calls = False
    for r, asked in enumerate(users):
        turns.append({"role": "user", "content": asked})
        steps = draw(st.integers(0, 2)) if family.tools else 0
        for step in range(steps):
            turns += draw(_tool_step(family, ids))
            any_calls = True
            if r == rounds - 1 and step == steps - 1 and draw(st.integers(0, 5)) == 0:
                turns = turns[:next(i for i in range(len(turns) - 1, -1, -1) if turns[i].get("tool_calls")) + 1]
                break  # the conversation stops on its calls
        else:
            turns.append(_assistant(family, draw(ANSWER), draw(st.none() | REASONING)))
    record = {"id": f"{family.name}-generated", "conversations": turns}
    if family.tools and (any_calls or draw(st.booleans())):
        record["tools"] = TOOLS
    return record


@st.composite
def _tool_step(draw, family: Family, ids) -> list[dict]:
    """An assistant turn with calls, then one result per call."""
    count = draw(st.integers(1, family.max_calls))
    names = [draw(st.sampled_from(sorted(ARGUMENTS))) for _ in range(count)]
    with_ids = family.call_ids or draw(st.booleans())
    calls = []
    for name in names:
        call = {"type": "function", "function": {"name": name, "arguments": draw(ARGUMENTS[name])}}
        if with_ids:
            call = {"id": next(ids), **call}
        calls.append(call)
    turn = _assistant(family, draw(CALL_CONTENT), draw(st.none() | REASONING))
    results = []
    for call in calls:
        result = {"role": "tool", "content": draw(RESULT), "name": call["function"]["name"]}
        if with_ids:
            result["tool_call_id"] = call["id"]
        results.append(result)
    return [{**turn, "tool_calls": calls}, *results]


def _assistant(family: Family, content: str, reasoning: str | None) -> dict:
    if reasoning is None:
        return {"role": "assistant", "content": content}
    if family.reasoning_in_content:
        return {"role": "assistant", "content": f"<think>\n{reasoning.strip()}\n</think>\n\n{content}"}
    return {"role": "assistant", "content": content, "reasoning_content": reasoning}
