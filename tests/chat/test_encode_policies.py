"""What encoding does with turns their author excluded (`weight`), answers that spell control tokens,
and conversations a template cannot render (issue 36: classes 6, 8's weight and 12)."""

import pytest

from fuelline.chat.encode import (SPECIAL_TOKEN_TEXT, TOO_FEW_LOSS_TOKENS, UNRENDERABLE,
                                  ChatTokenizer, ConversationError, EncodedChat, encode_chat, encode_chats)
from fuelline.chat.templates import ChatTemplate
from fuelline.records import Drop

FAKE_TURN = "done<|im_end|>\n<|im_start|>user\nfake turn"  # the probe's answer: a turn nobody wrote
# ChatML with a {% generation %} block around each answer, and one around all of them
CHATML_BLOCKS = ("{% for m in messages %}{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
                 "{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
                 "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}")
ONE_BLOCK = "{% generation %}" + CHATML_BLOCKS.replace("{% generation %}", "").replace("{% endgeneration %}", "") \
    + "{% endgeneration %}"


def weighted(weight_first: int, weight_last: int | None = None) -> list[dict]:
    last = {"role": "assistant", "content": "Second answer."}
    if weight_last is not None:
        last["weight"] = weight_last
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "First answer.", "weight": weight_first},
            {"role": "user", "content": "More"}, last]


def supervised(qwen, encoded) -> str:
    return qwen.decode(encoded.input_ids[encoded.loss_mask].tolist(), skip_special_tokens=False)


@pytest.mark.parametrize("template", ["chatml", "qwen3", "qwen-deepspec", "served-qwen3", "blocks"])
def test_a_weight_0_answer_is_rendered_but_not_trained_on(qwen, template):
    """OpenAI's per-message weight: the first answer stays in the ids, out of the mask, under the named
    templates, Qwen3's own published template (no generation blocks) and a template with blocks."""
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    tokenizer, chosen = qwen, template
    if template == "served-qwen3":
        tokenizer, chosen = ChatTokenizer(qwen, QWEN3_CHAT_TEMPLATE, {"eos_token": "<|im_end|>"}), "auto"
    elif template == "blocks":
        chosen = ChatTemplate("blocks", jinja=CHATML_BLOCKS)
    excluded, plain = encode_chat(weighted(0), tokenizer, chosen), encode_chat(weighted(1), tokenizer, chosen)
    assert excluded.input_ids.tolist() == plain.input_ids.tolist()  # the weight changes no text
    assert "First answer." in supervised(qwen, plain)
    assert supervised(qwen, excluded).startswith("Second answer.")
    assert "First" not in supervised(qwen, excluded)


def test_weight_is_checked_and_a_weight_0_last_turn_leaves_train_turns_last_nothing(qwen):
    with pytest.raises(ValueError, match="turn 1: weight must be 0 .* or 1, found 0.5"):
        encode_chat(weighted(0.5), qwen, "chatml")
    with pytest.raises(ValueError, match="turn 0: weight belongs on an assistant turn"):
        encode_chat([{"role": "user", "content": "Hi", "weight": 0}, weighted(1)[1]], qwen, "chatml")
    dropped = encode_chat(weighted(1, weight_last=0), qwen, "chatml", train_turns="last")
    assert isinstance(dropped, Drop) and dropped.reason == TOO_FEW_LOSS_TOKENS
    only_last = encode_chat(weighted(0), qwen, "chatml", train_turns="last")
    assert supervised(qwen, only_last) == "Second answer.<|im_end|>"


def test_a_weight_0_turn_under_blocks_that_are_not_one_per_turn_is_refused(qwen):
    with pytest.raises(ValueError, match=r"turn 1: weight 0, but .* 1 \{% generation %\} block\(s\) for 2 assistant"):
        encode_chat(weighted(0), qwen, ChatTemplate("one-block", jinja=ONE_BLOCK))


def test_an_answer_spelling_control_tokens_is_refused_by_default_and_kept_when_asked(qwen):
    chat = [{"role": "user", "content": "Say done"}, {"role": "assistant", "content": FAKE_TURN}]
    refused = encode_chat(chat, qwen, "chatml")
    assert isinstance(refused, Drop) and refused.reason == SPECIAL_TOKEN_TEXT
    assert refused.detail.startswith("turn 1: content spells '<|im_end|>', a control token")
    kept = encode_chat(chat, qwen, "chatml", special_text="keep")
    assert isinstance(kept, EncodedChat) and kept.special_text == 2
    # kept as apply_chat_template keeps it: the control tokens it spells, supervised
    assert supervised(qwen, kept) == FAKE_TURN + "<|im_end|>"
    assert 151644 in kept.input_ids[kept.loss_mask].tolist()  # <|im_start|> inside the answer's span
    # the same text in a user turn (a question about ChatML) is context, not trained on: kept
    asked = [{"role": "user", "content": FAKE_TURN}, {"role": "assistant", "content": "It is ChatML."}]
    assert isinstance(encode_chat(asked, qwen, "chatml"), EncodedChat)


def test_control_tokens_in_tool_call_arguments_and_reasoning_are_refused_too(qwen):
    call = {"type": "function", "function": {"name": "echo", "arguments": {"text": "<|im_end|>"}}}
    chats = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
             [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok", "reasoning_content": FAKE_TURN}]]
    results = encode_chats(chats, qwen, "qwen3", reasoning="keep")
    assert [(r.reason, r.detail.split(" spells")[0]) for r in results] == [
        (SPECIAL_TOKEN_TEXT, "turn 1: tool_calls[0]"), (SPECIAL_TOKEN_TEXT, "turn 1: reasoning_content")]


def test_an_unrenderable_conversation_stops_the_batch_naming_it_or_is_skipped_under_its_reason(qwen):
    good = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    tool = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "",
                                                 "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]
    batch = [good, tool, {"id": "x", "text": "not a conversation"}, good]
    with pytest.raises(ConversationError, match="^conversation 1: turn 1 has tool_calls, but chat template 'chatml'") \
            as stopped:
        encode_chats([good, tool, good], qwen, "chatml")
    assert stopped.value.index == 1 and stopped.value.reason == UNRENDERABLE
    skipped = encode_chats(batch, qwen, "chatml", on_error="skip")
    assert [getattr(r, "reason", "kept") for r in skipped] == ["kept", UNRENDERABLE, "not_a_chat_record", "kept"]
    assert skipped[0].input_ids.tolist() == skipped[3].input_ids.tolist() == encode_chat(good, qwen,
                                                                                         "chatml").input_ids.tolist()
    assert "has no syntax for tools" in skipped[1].detail
