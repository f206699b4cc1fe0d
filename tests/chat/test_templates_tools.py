"""Tools, tool calls, tool results and reasoning: the exact text and the exact tokens trained on.

References: Qwen3's published chat template rendered by transformers (the text, character for
character), the same template with `{% generation %}` blocks through transformers'
`apply_chat_template(..., tools=..., return_assistant_tokens_mask=True)` (ids and mask), and
supervised strings written out by hand from the contract's rule: assistant contents, tool-call
blocks, kept reasoning and `<|im_end|>`; never headers, tool results, tool schemas or the empty
think block.
"""

import numpy as np
import pytest

from fuelline.chat.encode import EncodedChat, encode_chat, encode_chats, load_tokenizer
from fuelline.chat.templates import ChatTemplate, render
from fuelline.records import Drop

from .test_encode import decode, runs
from .test_templates import CHATML_JINJA
from .tool_conversations import (CONVERSATIONS, ERROR, PARALLEL, ROUNDS, SINGLE, THINKING, TOOLS,
                                 QWEN3_GENERATION_TEMPLATE, QWEN3_TEMPLATE, assistant, tool, user)
from .tool_template_families import with_chat_template


def without_reasoning(turns):
    return [{k: v for k, v in t.items() if k != "reasoning_content"} for t in turns]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


PARIS_CALL = call("get_weather", '{"city": "Paris"}')
TOKYO_CALL = call("get_weather", '{"city": "東京", "unit": "celsius"}')
TIME_CALL = call("get_time", '{"timezone": "Asia/Tokyo"}')
END = "<|im_end|>"
# What each conversation trains on, written out from the rule
SUPERVISED = {
    "single": [PARIS_CALL + END, "It is 18 °C and cloudy in Paris." + END],
    "parallel": ["Let me check.\n" + PARIS_CALL + "\n" + TOKYO_CALL + "\n" + TIME_CALL + END,
                 "Paris: 18 °C. 東京: 24 °C, where it is 21:04." + END],
    "rounds": [PARIS_CALL + END, TOKYO_CALL + END, "Tokyo, by 6 °C." + END, TIME_CALL + END,
               "It is 21:04 in Tokyo." + END],
    "error": [call("get_weather", '{"city": "Atlantis"}') + END, "I could not find a city called Atlantis." + END],
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("reasoning", ["last", "drop"])
@pytest.mark.parametrize("with_tools", [True, False])
def test_qwen3_text_equals_qwen3s_published_template(hf, name, reasoning, with_tools):
    conversation, tools = CONVERSATIONS[name], TOOLS if with_tools else None
    # `last` is Qwen3's own rule; `drop` is the template given the turns without their reasoning
    given = conversation if reasoning == "last" else without_reasoning(conversation)
    expected = hf.apply_chat_template(given, tools=tools, chat_template=QWEN3_TEMPLATE, tokenize=False)
    assert render(conversation, "qwen3", tools=tools, reasoning=reasoning).text == expected
    record = {"id": name, "conversations": conversation, **({"tools": tools} if tools else {})}
    assert render(record, "qwen3", reasoning=reasoning).text == expected


@pytest.mark.parametrize("name", ["single", "parallel", "rounds", "error"])
def test_qwen3_supervises_exactly_contents_tool_calls_and_end_of_turn(qwen, name):
    conversation = CONVERSATIONS[name]
    result = encode_chat({"id": name, "conversations": conversation, "tools": TOOLS}, qwen, "qwen3")
    text = render(conversation, "qwen3", tools=TOOLS).text
    assert result.input_ids.tolist() == qwen.encode(text, add_special_tokens=False).ids
    assert [decode(qwen, result.input_ids[a:b]) for a, b in runs(result.loss_mask)] == SUPERVISED[name]
    unsupervised = decode(qwen, result.input_ids[~result.loss_mask])
    assert "<tools>" in unsupervised and "<tool_response>" in unsupervised and "<|im_start|>assistant\n" in unsupervised
    assert "<think>\n\n</think>\n\n" in unsupervised  # the final answer's empty block


def test_generation_blocks_with_tools_equal_transformers(hf, qwen, qwen_dir, tmp_path):
    auto = load_tokenizer(with_chat_template(qwen_dir, tmp_path / "qwen3", QWEN3_GENERATION_TEMPLATE, as_file=False))
    records = [{"id": name, "conversations": c, "tools": TOOLS} for name, c in CONVERSATIONS.items()]
    for tokenizer, template in ((auto, "auto"), (qwen, ChatTemplate("gen", jinja=QWEN3_GENERATION_TEMPLATE)),
                                (qwen, "qwen3")):  # the named template trains on what the blocks hold
        got = encode_chats(records, tokenizer, template)
        for record, result in zip(records, got):
            expected = hf.apply_chat_template(record["conversations"], tools=TOOLS, chat_template=QWEN3_GENERATION_TEMPLATE,
                                              tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            assert result.input_ids.tolist() == expected["input_ids"], (template, record["id"])
            assert result.loss_mask.astype(int).tolist() == expected["assistant_masks"], (template, record["id"])
            assert sum(expected["assistant_masks"]) > 20


THOUGHTFUL = [user("Hi"), assistant("Hello.", reasoning="Greet back.")]
THOUGHTS = ["I need both temperatures; Paris first.", "Paris is 18. Now Tokyo.", "24 > 18, by 6.", "Just be polite."]


def think(thought: str) -> str:
    return f"<think>\n{thought}\n</think>\n\n"


@pytest.mark.parametrize("reasoning, kept", [("keep", [0, 1, 2, 3]), ("last", [3]), ("drop", [])])
def test_reasoning_modes_golden(qwen, reasoning, kept):
    answers = [PARIS_CALL, TOKYO_CALL, "Tokyo, by 6 °C.", "You're welcome."]
    thoughts = [think(THOUGHTS[k]) if k in kept else "" for k in range(4)]
    expected = ("<|im_start|>user\nIs it warmer in Paris or Tokyo?<|im_end|>\n"
                f"<|im_start|>assistant\n{thoughts[0]}{PARIS_CALL}<|im_end|>\n"
                '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response><|im_end|>\n'
                f"<|im_start|>assistant\n{thoughts[1]}{TOKYO_CALL}<|im_end|>\n"
                '<|im_start|>user\n<tool_response>\n{"temperature": 24}\n</tool_response><|im_end|>\n'
                f"<|im_start|>assistant\n{thoughts[2]}Tokyo, by 6 °C.<|im_end|>\n"
                "<|im_start|>user\nThanks!<|im_end|>\n"
                f"<|im_start|>assistant\n{thoughts[3] or think('')}You're welcome.<|im_end|>\n")
    assert render(THINKING, "qwen3", reasoning=reasoning).text == expected
    result = encode_chat(THINKING, qwen, "qwen3", reasoning=reasoning)
    assert [decode(qwen, result.input_ids[a:b]) for a, b in runs(result.loss_mask)] == \
           [thought + answer + END for thought, answer in zip(thoughts, answers)]
    last = encode_chat(THINKING, qwen, "qwen3", reasoning=reasoning, train_turns="last")
    assert last.input_ids.tolist() == result.input_ids.tolist()
    assert decode(qwen, last.input_ids[last.loss_mask]) == thoughts[3] + "You're welcome." + END


def test_reasoning_is_stripped_of_newlines_and_an_empty_one_is_not_trained_on(qwen):
    chat = [user("Hi"), assistant("Hello.", reasoning="\n\nGreet back.\n")]
    assert render(chat, "qwen3").text.endswith("<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n")
    empty = encode_chat([user("Hi"), assistant("Hello.", reasoning="\n")], qwen, "qwen3", reasoning="keep")
    assert decode(qwen, empty.input_ids[empty.loss_mask]) == "Hello." + END


def test_train_turns_last_under_every_template_kind(qwen):
    for template in ("qwen3", "chatml", ChatTemplate("gen", jinja=QWEN3_GENERATION_TEMPLATE)):
        chat = ROUNDS if template != "chatml" else [user("a"), assistant("b"), user("c"), assistant("d")]
        tools = TOOLS if template != "chatml" else None
        result = encode_chat(chat, qwen, template, tools=tools, train_turns="last")
        assert decode(qwen, result.input_ids[result.loss_mask]) == chat[-1]["content"] + END
    marked = encode_chat([user("a"), assistant("b"), user("c"), assistant("d")], qwen,
                         ChatTemplate("plain", jinja=CHATML_JINJA), train_turns="last")
    assert decode(qwen, marked.input_ids[marked.loss_mask]) == "d" + END


def test_truncation_keeps_tool_rounds_whole(qwen):
    full = len(encode_chat(ROUNDS, qwen, "qwen3", tools=TOOLS).input_ids)
    first_question = encode_chat(ROUNDS[:7], qwen, "qwen3", tools=TOOLS)
    got = encode_chat(ROUNDS, qwen, "qwen3", full - 1, tools=TOOLS)
    assert got.truncated and got.input_ids.tolist() == first_question.input_ids.tolist()
    assert got.loss_mask.tolist() == first_question.loss_mask.tolist()
    # no cut between a tool call and its result: a call alone would fit, but is not an exchange
    assert len(encode_chat(ROUNDS[:3], qwen, "qwen3", tools=TOOLS).input_ids) < len(first_question.input_ids) - 1
    assert isinstance(encode_chat(ROUNDS, qwen, "qwen3", len(first_question.input_ids) - 1, tools=TOOLS), Drop)


@pytest.mark.parametrize("turns, message", [
    ([user("a"), {"role": "assistant", "content": "",
                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}],
     "turn 1: tool_calls[0].function.arguments must be a JSON object (a dict), found str (a JSON-encoded string"),
    ([user("a"), {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
     "turn 1: tool_calls[0].function.name must be a non-empty string, found None"),
    ([user("a"), {"role": "assistant", "content": "", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}],
     "turn 1: tool_calls[0].type must be 'function', found 'code'"),
    ([user("a"), {"role": "assistant", "content": "", "tool_calls": {"name": "f"}}],
     "turn 1: tool_calls must be a list"),
    ([user("a"), {"role": "assistant", "content": "", "tool_calls": ["f"]}], "turn 1: tool_calls[0] must be"),
    ([{"role": "user", "content": "a", "tool_calls": []}], "turn 0: tool_calls belongs on an assistant turn, not on a user"),
    ([user("a"), {"role": "assistant", "content": "b", "tool_call_id": "c"}],
     "turn 1: tool_call_id belongs on a tool turn, not on an assistant turn"),
    ([user("a"), {"role": "assistant", "content": "b", "reasoning_content": 3}],
     "turn 1: reasoning_content must be a string, found int"),
    ([user("a"), {"role": "tool", "content": "r", "tool_call_id": 7}], "turn 1: tool_call_id must be a string, found int"),
    ([user("a"), {"role": "tool", "content": None}], "turn 1: content must be a string, found NoneType"),
])
def test_malformed_tool_fields_are_named(turns, message):
    with pytest.raises(ValueError) as error:
        render(turns, "qwen3")
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("tools, message", [
    ({"get_weather": {}}, "tools must be a list"),
    ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name must be a non-empty string"),
    ([{"name": "f"}], "tools[0] must be {'type': 'function', 'function'"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
     "tools[0].function.parameters must be a JSON object, found str"),
])
def test_malformed_tools_are_named(tools, message):
    with pytest.raises(ValueError) as error:
        render(SINGLE, "qwen3", tools=tools)
    assert str(error.value).startswith(message)


def test_refusals_name_the_template_turn_and_way_out(qwen):
    with pytest.raises(ValueError, match="tools are given twice"):
        render({"id": "x", "conversations": SINGLE, "tools": TOOLS}, "qwen3", tools=TOOLS)
    with pytest.raises(ValueError, match="the conversation has tools, but chat template 'chatml' has no syntax for "
                                         "tools; use one that has \\(qwen3\\)"):
        render(SINGLE, "chatml", tools=TOOLS)
    with pytest.raises(ValueError, match="turn 1 has tool_calls, but chat template 'llama3'"):
        render(SINGLE, "llama3")
    with pytest.raises(ValueError, match="turn 2 is a tool turn, but chat template 'gemma4'"):
        render([user("a"), assistant("b"), tool("r", "f", "c")], "gemma4")
    with pytest.raises(ValueError, match="turn 1: chat template 'chatml' has no syntax for reasoning_content; "
                                         "use reasoning='drop'"):
        render(THOUGHTFUL, "chatml", reasoning="keep")
    assert render(THOUGHTFUL, "chatml", reasoning="drop").text == render(without_reasoning(THOUGHTFUL), "chatml").text
    for key, value in (("reasoning", "all"), ("train_turns", "first")):
        with pytest.raises(ValueError, match=f"{key} must be one of"):
            render(SINGLE, "qwen3", **{key: value})
        with pytest.raises(ValueError, match=f"{key} must be one of"):
            encode_chat(SINGLE, qwen, "qwen3", **{key: value})
    with pytest.raises(ValueError, match="conversation 1: turn 1: tool_calls\\[0\\].function.arguments"):
        bad = [user("a"), {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                             "arguments": "{}"}}]}]
        encode_chats([SINGLE, bad], qwen, "qwen3")


def test_jinja_without_generation_blocks_refuses_what_it_cannot_locate(qwen):
    """Qwen3's template rewrites earlier turns (an assistant turn gets an empty think block only while it is
    the last message), so a turn's text cannot be found by rendering turn by turn: marks are the fallback,
    and they cannot locate tool calls or reasoning."""
    plain = ChatTemplate("qwen3-plain", jinja=QWEN3_TEMPLATE)
    with pytest.raises(ValueError, match="^turn 1: the Jinja chat template of 'qwen3-plain' rewrites turn 1 once "
                                         "later turns follow it: at character [0-9]+, '.*<think>.*' becomes "
                                         "'.*<tool_call>.*'.* its tool calls are written outside its content"):
        render(SINGLE, plain, tools=TOOLS)
    two_rounds = [*THOUGHTFUL, user("Again"), assistant("Hello again.", reasoning="Once more.")]
    with pytest.raises(ValueError, match="^turn 1: the Jinja chat template of 'qwen3-plain' rewrites turn 1 "
                                         ".* its reasoning .*or reasoning='drop'"):
        render(two_rounds, plain, reasoning="keep")
    # one round is rendered turn by turn: the reasoning block is the model's, after the generation prompt
    thoughtful = render(THOUGHTFUL, plain)
    assert [thoughtful.text[a:b] for a, b in thoughtful.spans] == ["<think>\nGreet back.\n</think>\n\nHello." + END]
    # tool results and schemas are never trained on, so a conversation whose answers are plain contents is fine
    chat = [user("Weather?"), assistant("Sunny, said the forecast."), user("Sure?"), assistant("Yes.")]
    got = encode_chat(chat, qwen, plain, tools=TOOLS)
    assert decode(qwen, got.input_ids[got.loss_mask]) == "Sunny, said the forecast." + END + "Yes." + END
    with pytest.raises(ValueError, match="turn 1: reasoning_content holds U\\+FDD1"):
        render([user("a"), assistant("b", reasoning="x\ufdd1")], ChatTemplate("g", jinja=QWEN3_GENERATION_TEMPLATE))
    with pytest.raises(ValueError, match="tools holds U\\+FDD0"):
        render(SINGLE, ChatTemplate("g", jinja=QWEN3_GENERATION_TEMPLATE),
               tools=[{"type": "function", "function": {"name": "f\ufdd0"}}])


def test_turns_not_trained_on_are_never_refused_for_where_they_are(qwen):
    """Qwen3's template rewrites the tool-call turns of earlier rounds, so they cannot be located; under
    `train_turns="last"` or with weight 0 they are not trained on, so the conversation is kept, and the
    trained turn is masked as the named `qwen3` masks it."""
    plain = ChatTemplate("qwen3-plain", jinja=QWEN3_TEMPLATE)
    with pytest.raises(ValueError, match="^turn 2: .* rewrites turn 2 once later turns follow it"):
        render(ROUNDS, plain, tools=TOOLS)
    last = render(ROUNDS, plain, tools=TOOLS, train_turns="last")
    assert [last.text[a:b] for a, b in last.spans] == ["It is 21:04 in Tokyo." + END]
    got, named = (encode_chat(ROUNDS, qwen, template, tools=TOOLS, train_turns="last") for template in (plain, "qwen3"))
    assert got.input_ids.tolist() == named.input_ids.tolist() and np.array_equal(got.loss_mask, named.loss_mask)
    weighted = [{**turn, "weight": 0} if turn.get("tool_calls") else turn for turn in SINGLE]
    kept = render(weighted, plain, tools=TOOLS)
    assert [kept.text[a:b] for a, b in kept.spans] == ["It is 18 °C and cloudy in Paris." + END]


def test_plain_chats_render_as_before_under_every_reasoning_and_tools_setting(qwen):
    chat = [user("Hi"), assistant("Hello!")]
    base = encode_chat(chat, qwen, "qwen3")
    for reasoning in ("keep", "drop", "last"):
        got = encode_chat({"id": "x", "conversations": chat}, qwen, "qwen3", reasoning=reasoning)
        assert isinstance(got, EncodedChat) and got.input_ids.tolist() == base.input_ids.tolist()
        assert np.array_equal(got.loss_mask, base.loss_mask)
    assert render(chat, "qwen3", tools=[]).text == render(chat, "qwen3").text  # no tools: no tools block
    assert ('<|im_start|>assistant\nLet me check.\n' + PARIS_CALL + "\n" + TOKYO_CALL + "\n" + TIME_CALL + END + "\n"
            '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response>\n<tool_response>\n'
            '{"temperature": 24}\n</tool_response>\n<tool_response>\n{"time": "21:04"}\n</tool_response><|im_end|>\n'
            ) in render(PARALLEL, "qwen3").text  # the three results share one user turn
    assert ERROR[2]["content"] in render(ERROR, "qwen3").text
