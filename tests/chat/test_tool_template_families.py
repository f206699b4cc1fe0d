"""Tool-call and reasoning conversations on served templates without generation blocks (issue 38).

Six served templates reconstructed in `tool_template_families` (GLM-4-0414's among them) and Qwen3's own, each as a
tokenizer directory's chat template. The references, from transformers alone:

- `rule`: the incremental rule run on transformers' renderings of the served template (which
  turns it keeps, which it refuses, each kept turn's span), written here from the rule's words;
- each family's variant with `{% generation %}` blocks, through transformers'
  `apply_chat_template(..., return_assistant_tokens_mask=True)`: it renders the served text,
  and its mask is the rule's (checked here on fixed and generated conversations);
- the supervised strings of fixed conversations written out by hand, which the variant's mask
  must decode to, so that the references are not wrong in the same way as the code under test.

The check itself: `encode_chats(records, <family directory>, "auto", on_error="skip",
reasoning="keep")` gives transformers' ids and mask on the variant for every conversation the
rule keeps, and a Drop (`unrenderable`) naming the turn for every one it refuses.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuelline.chat.encode import EncodedChat, encode_chats
from fuelline.formats import chat_record
from fuelline.records import Drop

from .test_encode import runs
from .tool_conversation_strategies import records
from .tool_conversations import CONVERSATIONS, SINGLE, TOOLS, assistant, tool, user
from .tool_template_families import FAMILIES, Family, family_dirs

# End-of-turn tokens besides the tokenizer's eos token, and the marks of the fallback.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")
OPEN, CLOSE = "\ufdd2", "\ufdd3"
PROBE = "probe-content"
CALL_PROBE = {"id": "probecall", "type": "function", "function": {"name": "probe_call_name", "arguments": {}}}


@pytest.fixture(scope="module")
def dirs(qwen_dir, tmp_path_factory):
    return family_dirs(qwen_dir, tmp_path_factory.mktemp("families"))


class Reference:
    """One family's transformers tokenizer, its served template and its variant."""

    def __init__(self, family: Family, directory):
        import transformers

        self.family, self.directory = family, directory
        self.hf = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.end_of_turn = tuple(dict.fromkeys((family.eos, *END_OF_TURN)))

    def render(self, turns: list[dict], tools, generation_prompt: bool = False, template: str | None = None) -> str:
        return self.hf.apply_chat_template(turns, tools=tools, chat_template=template or self.family.plain,
                                           tokenize=False, add_generation_prompt=generation_prompt)

    def variant(self, turns: list[dict], tools) -> tuple[list[int], list[int]]:
        out = self.hf.apply_chat_template(turns, tools=tools, chat_template=self.family.variant, tokenize=True,
                                          return_dict=True, return_assistant_tokens_mask=True)
        return out["input_ids"], out["assistant_masks"]

    def mask(self, text: str, spans: list[tuple[int, int]]) -> list[int]:
        """transformers' rule: a token is supervised when it overlaps a span."""
        offsets = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return [int(any(s < end and start < e for s, e in spans)) for start, end in offsets]

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)


@pytest.fixture(scope="module")
def references(dirs):
    loaded = {}

    def get(name: str) -> Reference:
        if name not in loaded:
            loaded[name] = Reference(FAMILIES[name], dirs[name])
        return loaded[name]
    return get


# ------------------------------------------------------------------------------------------- the rule

def rule(ref: Reference, turns: list[dict], tools) -> Expected:
    """What the rule makes of a conversation on `ref`'s served template.

    Each assistant turn is located by the probe (or incremental rendering) and kept when its
    text stays a prefix of every later rendering; otherwise a turn without tool calls and
    reasoning falls back to its content's marks, and one with either is refused. A rewritten
    turn whose reasoning the template leaves out of the text anyway (Qwen3's before the last
    user turn, or a template that never renders reasoning) may go either way (`unsure`): the
    rule refuses "rendered reasoning", and whether that is reasoning rendered anywhere is the
    implementation's call.
    """
    full = ref.render(turns, tools)
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    after = {i: ref.render(turns[:i + 1], tools) for i in assistant}
    expected = Expected(full)
    for k, i in enumerate(assistant):
        start = _located(ref, turns, tools, i, after[i])
        later = [after[j] for j in assistant[k + 1:]] + [full]
        if start is not None and all(text.startswith(after[i]) for text in later):
            expected.spans.append((start, start + _supervised_length(after[i][start:], ref.end_of_turn)))
            continue
        span = None if turns[i].get("tool_calls") else _marked(ref, turns, tools, i, full)
        if span is None:
            expected.refused.append(i)
        elif turns[i].get("reasoning_content"):
            without = [{k: v for k, v in t.items() if k != "reasoning_content"} if j == i else t
                       for j, t in enumerate(turns)]
            (expected.unsure if ref.render(without, tools) == full else expected.refused).append(i)
            expected.spans.append(span)
        else:
            expected.spans.append(span)
    return expected


@dataclass
class Expected:
    """The served text; the supervised spans of the turns kept (and of the `unsure` ones, by their
    marks); the assistant turns refused, and those that may be refused or kept."""

    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    unsure: list[int] = field(default_factory=list)


def _located(ref: Reference, turns: list[dict], tools, i: int, rendered: str) -> int | None:
    """Where turn i's text starts in `rendered` (its rendering through turn i), or None: where the content of
    an assistant probe turn after turns[:i] starts, if the text before it is a prefix of `rendered` (what the
    template writes before every answer, whatever it says); else where rendering turns[:i] with the
    generation prompt ends, if that is a prefix of it. The probe's start moves back to where a probe turn
    with one call parts from it, if that call is written (a call is written there instead: the model's
    choice), never before where the generation prompt parts from `rendered`; where no call is written, to
    the generation prompt's end, if that is earlier, a prefix of `rendered`, and only whitespace is between."""
    probed = ref.render(turns[:i] + [{"role": "assistant", "content": PROBE}], tools)
    prompt = ref.render(turns[:i], tools, generation_prompt=True)
    if probed.count(PROBE) == 1 and rendered.startswith(probed[:probed.index(PROBE)]):
        start = probed.index(PROBE)
        try:
            call = ref.render(turns[:i] + [{"role": "assistant", "content": "", "tool_calls": [CALL_PROBE]}], tools)
        except Exception:  # a template that renders no call (it raises on one)
            call = ""
        parted = len(os.path.commonprefix([probed, call]))
        if CALL_PROBE["function"]["name"] in call[parted:]:
            return min(start, max(parted, len(os.path.commonprefix([prompt, rendered]))))
        between = rendered[len(prompt):start]
        return len(prompt) if len(prompt) < start and rendered.startswith(prompt) and not between.strip() else start
    return len(prompt) if rendered.startswith(prompt) else None


def _supervised_length(text: str, end_of_turn: tuple[str, ...]) -> int:
    """Up to and including the last end-of-turn token of a turn's text; all of it without one."""
    ends = [text.rfind(token) + len(token) for token in end_of_turn if token in text]
    return max(ends) if ends else len(text)


def _marked(ref: Reference, turns: list[dict], tools, i: int, full: str) -> tuple[int, int] | None:
    """Turn i's content, where its marks are in the rendering with them, then an end-of-turn token right after."""
    content = turns[i]["content"]
    marked = [{**turn, "content": OPEN + content + CLOSE} if j == i else turn for j, turn in enumerate(turns)]
    raw = ref.render(marked, tools)
    if raw.count(OPEN) != 1 or raw.count(CLOSE) != 1 or raw.replace(OPEN, "").replace(CLOSE, "") != full:
        return None
    start, end = raw.index(OPEN), raw.index(CLOSE) - 1
    if full[start:end] != content:
        return None
    return start, end + len(next((t for t in ref.end_of_turn if full.startswith(t, end)), ""))


# ------------------------------------------------------------------------------- fixed conversations

def adapted(family: Family, turns: list[dict]) -> list[dict] | None:
    """A conversation of tool_conversations for `family`: mistral's 9-character ids (call_k becomes
    call0000k), None where the family cannot render it (llama3.1: several calls in a turn;
    deepseek-r1: any tool)."""
    calls = [len(t.get("tool_calls", ())) for t in turns]
    if (not family.tools and (any(calls) or any(t["role"] == "tool" for t in turns))) or max(calls) > family.max_calls:
        return None
    if not family.call_ids:
        return turns
    count, out = 0, []
    for turn in turns:
        if turn.get("tool_calls"):
            with_ids = []
            for call in turn["tool_calls"]:
                count += 1
                with_ids.append({"id": f"call{count:05d}", **call})
            turn = {**turn, "tool_calls": with_ids}
        elif turn["role"] == "tool":
            turn = {**turn, "tool_call_id": f"call{int(turn['tool_call_id'].split('_')[1]):05d}"}
        out.append(turn)
    return out


SYSTEM = {"role": "system", "content": "You are a travel assistant."}
PLAIN = {"hello": [user("Hi"), assistant("Hello!")],
         "poem": [SYSTEM, user("床前明月光 👨‍👩‍👧 next line?"), assistant("疑是地上霜。🙂 Then: 举头望明月"),
                  user("Thanks!"), assistant("You're welcome.")],
         # answers that start with a digit: a " " before a digit is a token of its own
         "numbers": [SYSTEM, user("How warm is Paris?"), assistant("18 °C."), user("And Tokyo?"), assistant("24 °C.")]}
DIGITS = [user("How warm is it?"), assistant("18 °C.")]
# the last message's reasoning, which deepseek-r1 keeps; and reasoning before a later user turn, which it cuts
DEEPSEEK_THINK = [user("Is 7 prime?"), assistant("<think>\nNo divisor but 1 and 7.\n</think>\n\nYes.")]
DEEPSEEK_EARLIER_THINK = [user("Hi"), assistant("<think>\nGreet back.\n</think>\n\nHello."), user("Bye"),
                          assistant("Goodbye.")]
MISTRAL_MOVED = [user("Weather in Paris?"), assistant("", ("get_weather", {"city": "Paris"})),
                 tool('{"temperature": 18}', "get_weather", "call_1"), assistant("18 °C."),
                 user("Thanks!"), assistant("You're welcome.")]
# conversations the rule refuses, and the first turn it refuses
REFUSED = {"mistral": (MISTRAL_MOVED, 1), "qwen3": (SINGLE, 1), "deepseek-r1": (DEEPSEEK_EARLIER_THINK, 1)}
# (refused, unsure) turns of the fixed conversations; every other one is kept whole. With a system
# message, mistral's first answer after a user turn is located only by the probe, which a tool-call
# turn (no " " before it) fails; with tools, every turn before the last user turn is rewritten.
REFUSED_FIXED = {("mistral", "rounds"): ([2, 4, 8], []), ("mistral", "thinking"): ([1, 3], [5]),
                 ("mistral", "refused"): ([1], []), ("deepseek-r1", "refused"): ([1], []),
                 **{("qwen3", chat): ([1], []) for chat in ("single", "parallel", "error", "refused")},
                 ("qwen3", "rounds"): ([2, 4, 8], []), ("qwen3", "thinking"): ([1, 3], [5])}


def fixed(family: Family) -> dict[str, list[dict]]:
    """The fixed conversations of a family: tool_conversations' that it can render, its own, the plain ones."""
    chats = {name: c for name, turns in CONVERSATIONS.items() if (c := adapted(family, turns)) is not None}
    chats.update(PLAIN, digits=DIGITS)
    if family.name in REFUSED:
        chats["refused"] = adapted(family, REFUSED[family.name][0])
    if family.reasoning_in_content:
        chats["think"] = DEEPSEEK_THINK
    return chats


def tools_of(family: Family, turns: list[dict]):
    return TOOLS if family.tools and any(t.get("tool_calls") for t in turns) else None


FIXED = [(name, chat) for name, family in FAMILIES.items() for chat in fixed(family)]


@pytest.mark.parametrize("name, chat", FIXED)
def test_variant_renders_the_served_text_and_the_rules_mask(references, name, chat):
    ref = references(name)
    turns = fixed(ref.family)[chat]
    tools = tools_of(ref.family, turns)
    expected = rule(ref, turns, tools)
    assert ref.render(turns, tools, template=ref.family.variant) == expected.text
    ids, mask = ref.variant(turns, tools)
    assert ids == ref.hf(expected.text, add_special_tokens=False)["input_ids"]
    if not expected.refused:
        assert mask == ref.mask(expected.text, expected.spans)
    assert (expected.refused, expected.unsure) == REFUSED_FIXED.get((name, chat), ([], []))


# ----------------------------------------------------------------------------------------- by hand

def hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def llama_call(name: str, arguments: str) -> str:
    return f'{{"name": "{name}", "parameters": {arguments}}}<|eot_id|>'


def mistral_calls(*calls: tuple[str, str, int]) -> str:
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{name}", "arguments": {arguments}, "id": "call{k:05d}"}}'
                                        for name, arguments, k in calls) + "]</s>"


PARIS, TOKYO, TIME = ("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "東京", "unit": "celsius"}'), \
    ("get_time", '{"timezone": "Asia/Tokyo"}')
ATLANTIS = ("get_weather", '{"city": "Atlantis"}')
END, EOS = "<|im_end|>", "<｜end▁of▁sentence｜>"
ANSWERS = {"single": "It is 18 °C and cloudy in Paris.", "parallel": "Paris: 18 °C. 東京: 24 °C, where it is 21:04.",
           "error": "I could not find a city called Atlantis."}
# What each assistant turn trains on, written out from the rule
BY_HAND = {
    ("hermes", "single"): [hermes_call(*PARIS) + END, ANSWERS["single"] + END],
    ("hermes", "parallel"): ["\n".join(hermes_call(*c) for c in (PARIS, TOKYO, TIME)) + END, ANSWERS["parallel"] + END],
    ("hermes", "rounds"): [hermes_call(*PARIS) + END, hermes_call(*TOKYO) + END, "Tokyo, by 6 °C." + END,
                           hermes_call(*TIME) + END, "It is 21:04 in Tokyo." + END],
    ("llama3.1", "single"): [llama_call(*PARIS), ANSWERS["single"] + "<|eot_id|>"],
    ("llama3.1", "error"): [llama_call(*ATLANTIS), ANSWERS["error"] + "<|eot_id|>"],
    ("llama3.1", "rounds"): [llama_call(*PARIS), llama_call(*TOKYO), "Tokyo, by 6 °C.<|eot_id|>", llama_call(*TIME),
                             "It is 21:04 in Tokyo.<|eot_id|>"],
    # the " " before an answer is the model's: where it writes [TOOL_CALLS] for a call (no generation prompt)
    ("mistral", "single"): [mistral_calls((*PARIS, 1)), " " + ANSWERS["single"] + "</s>"],
    ("mistral", "parallel"): [mistral_calls((*PARIS, 1), (*TOKYO, 2), (*TIME, 3)), " " + ANSWERS["parallel"] + "</s>"],
    ("mistral", "digits"): [" 18 °C.</s>"],
    # a system message (written into the last user turn only): the probes locate the answers, the " " included
    ("mistral", "numbers"): [" 18 °C.</s>", " 24 °C.</s>"],
    ("qwen2.5", "parallel"): ["Let me check.\n" + "\n".join(hermes_call(*c) for c in (PARIS, TOKYO, TIME)) + END,
                              ANSWERS["parallel"] + END],
    ("qwen2.5", "error"): [hermes_call(*ATLANTIS) + END, ANSWERS["error"] + END],
    # the probe's content starts right after <｜Assistant｜>: the last message's think block is its text
    ("deepseek-r1", "think"): ["<think>\nNo divisor but 1 and 7.\n</think>\n\nYes." + EOS],
    ("deepseek-r1", "poem"): ["疑是地上霜。🙂 Then: 举头望明月" + EOS, "You're welcome." + EOS],
    ("qwen3", "thinking-round"): [
        "<think>\nI need both temperatures; Paris first.\n</think>\n\n" + hermes_call(*PARIS) + END,
        "<think>\nParis is 18. Now Tokyo.\n</think>\n\n" + hermes_call(*TOKYO) + END,
        "<think>\n24 > 18, by 6.\n</think>\n\nTokyo, by 6 °C." + END],
    # the last message's empty think block is written before every last answer: the prompt's, as in `qwen3`;
    # the earlier answer, rewritten, by its marks
    ("qwen3", "poem"): ["疑是地上霜。🙂 Then: 举头望明月" + END, "You're welcome." + END],
    # no end-of-turn token; the "\n" after <|assistant|> is the model's (where a call writes its function's name)
    ("glm-4-0414", "poem"): ["\n疑是地上霜。🙂 Then: 举头望明月", "\nYou're welcome."],
    ("glm-4-0414", "hello"): ["\nHello!"],
}


@pytest.mark.parametrize("name, chat", list(BY_HAND))
def test_the_variants_mask_decodes_to_the_strings_written_by_hand(references, name, chat):
    ref = references(name)
    turns = fixed(ref.family)[chat]
    tools = tools_of(ref.family, turns)
    ids, mask = ref.variant(turns, tools)
    assert [ref.decode(ids[a:b]) for a, b in runs(np.array(mask))] == BY_HAND[name, chat]
    expected = rule(ref, turns, tools)  # its spans, through transformers' overlap rule, mark the same tokens
    assert not expected.refused
    rule_mask = np.array(ref.mask(expected.text, expected.spans))
    assert [ref.decode(ids[a:b]) for a, b in runs(rule_mask)] == BY_HAND[name, chat]


# ---------------------------------------------------------------------------------------- the check

def encode_one(ref: Reference, record: dict, **options):
    return encode_chats([record], ref.directory, "auto", on_error="skip", reasoning="keep", **options)[0]


def assert_encoded_as_the_rule_says(ref: Reference, record: dict) -> None:
    turns, tools = record["conversations"], record.get("tools")
    expected = rule(ref, turns, tools)
    got = encode_one(ref, record)
    if expected.refused or (expected.unsure and isinstance(got, Drop)):
        assert isinstance(got, Drop) and got.reason == "unrenderable", got
        named = re.search(r"\bturn (\d+)\b", got.detail or "")
        assert named and int(named.group(1)) in expected.refused + expected.unsure, (got.detail, expected)
        return
    ids, mask = ref.variant(turns, tools)
    assert isinstance(got, EncodedChat), got
    assert got.input_ids.tolist() == ids
    assert got.loss_mask.astype(int).tolist() == mask


@pytest.mark.parametrize("name, chat", [(n, c) for n, c in FIXED if c != "refused"])
def test_fixed_conversations_encode_as_the_variant(references, name, chat):
    ref = references(name)
    turns = fixed(ref.family)[chat]
    record = {"id": chat, "conversations": turns, **({"tools": tools} if (tools := tools_of(ref.family, turns)) else {})}
    assert_encoded_as_the_rule_says(ref, record)


@pytest.mark.parametrize("name", list(REFUSED))
def test_rewritten_turns_with_calls_or_reasoning_are_refused_naming_turn_and_cause(references, name):
    ref = references(name)
    turns = fixed(ref.family)["refused"]
    tools = tools_of(ref.family, turns)
    assert rule(ref, turns, tools).refused[0] == REFUSED[name][1]
    got = encode_one(ref, {"id": "refused", "conversations": turns, **({"tools": tools} if tools else {})})
    assert isinstance(got, Drop) and got.reason == "unrenderable", got
    assert re.search(rf"\bturn {REFUSED[name][1]}\b", got.detail), got.detail
    assert re.search(r"mov|chang|rewrit|drop|cut", got.detail, re.IGNORECASE), got.detail


@pytest.mark.parametrize("name", list(FAMILIES))
def test_plain_conversations_keep_their_masks(references, name):
    """No tools, no reasoning: where today's marks locate every answer, the rule gives the same mask (Qwen3's
    empty think block before the last answer is the template's; Mistral's " " before each is the model's)."""
    ref = references(name)
    batch = [{"id": chat, "conversations": turns} for chat, turns in PLAIN.items()]
    for record, got in zip(batch, encode_chats(batch, ref.directory, "auto")):
        ids, mask = ref.variant(record["conversations"], None)
        assert isinstance(got, EncodedChat), got
        assert got.input_ids.tolist() == ids and got.loss_mask.astype(int).tolist() == mask, record["id"]


GENERATED = settings(max_examples=50, derandomize=True, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
GENERATED_MORE = settings(GENERATED, max_examples=500)


def check_variant(ref: Reference, record: dict) -> None:
    assert chat_record.check(record) is None
    turns, tools = record["conversations"], record.get("tools")
    expected = rule(ref, turns, tools)
    assert ref.render(turns, tools, template=ref.family.variant) == expected.text
    if not expected.refused:
        _, mask = ref.variant(turns, tools)
        assert mask == ref.mask(expected.text, expected.spans)


@pytest.mark.parametrize("name", list(FAMILIES))
@GENERATED
@given(data=st.data())
def test_generated_variant_renders_the_served_text_and_the_rules_mask(references, name, data):
    ref = references(name)
    check_variant(ref, data.draw(records(ref.family)))


@pytest.mark.parametrize("name", list(FAMILIES))
@GENERATED
@given(data=st.data())
def test_generated_conversations_encode_as_the_rule_says(references, name, data):
    ref = references(name)
    assert_encoded_as_the_rule_says(ref, data.draw(records(ref.family)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
@GENERATED_MORE
@given(data=st.data())
def test_more_generated_conversations(references, name, data):
    ref = references(name)
    record = data.draw(records(ref.family))
    check_variant(ref, record)
    assert_encoded_as_the_rule_says(ref, record)
