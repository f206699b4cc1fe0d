"""Conversations to ids and loss masks, with Qwen's real vocabulary, checked against transformers.

The references are hand-written expectations (the exact supervised text of each assistant turn)
and transformers' `apply_chat_template`, given Jinja templates written here from each format's
rules. The comparison with transformers runs, in one batch each way, on every 20th conversation
of each file of ../shared/data/chat with a complete exchange (650 of them) plus a few edge cases;
the slow tests run it on all 13,007 (999 ShareGPT, 4,535 Alpaca, 7,473 GSM8K; 2.8 M tokens).
"""

import json
import shutil

import numpy as np
import pytest
import tokenizers

from fuelline.chat.encode import (ChatTokenizer, EncodedChat, encode_chat, encode_chats, load_tokenizer,
                                  supervised_tokens)
from fuelline.chat.templates import ChatTemplate, get_template, render
from fuelline.io import read_records
from fuelline.records import Drop

from ..conftest import shared_file
from .test_templates import CHATML_GENERATION_JINJA, CHATML_JINJA
from .tool_template_families import with_chat_template

# Qwen3's rendering with enable_thinking=False, from its rules: ChatML; the last message, if it
# is an assistant turn after the last user turn, opens with an empty think block; so does the
# generation prompt when thinking is off.
QWEN3_NO_THINKING_JINJA = """{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m['role'] == 'assistant' and loop.last and loop.index0 > ns.last_user %}
{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{% endif %}
{%- endif %}"""

SYSTEM = {"role": "system", "content": "你是一个乐于助人的助手。"}
POEM = [
    {"role": "user", "content": "床前明月光 👨‍👩‍👧 next line?"},
    {"role": "assistant", "content": "疑是地上霜。🙂 Then: 举头望明月"},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "不客气 — you're welcome.\n"},
]
EDGES = [
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\nstarts on a newline"}],
    [{"role": "user", "content": "🙂"}, {"role": "assistant", "content": "👨‍👩‍👧‍👦🇨🇳 ok"}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": " spaced "}, {"role": "assistant", "content": "  trailing  \n\n"}],
    [SYSTEM, *POEM],
]
# llama3 and gemma4 control tokens, single ids in a copy of Qwen's tokenizer
EXTRA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]


@pytest.fixture(scope="module")
def qwen_plus(qwen_dir):
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    assert tokenizer.add_special_tokens(EXTRA_SPECIAL) == len(EXTRA_SPECIAL)
    return tokenizer


TEMPLATE_SOURCES = {"config": CHATML_JINJA, "file": CHATML_GENERATION_JINJA}


@pytest.fixture(scope="module")
def template_dirs(qwen_dir, tmp_path_factory):
    """Copies of the Qwen tokenizer directory with a ChatML template in tokenizer_config.json, and
    one with generation blocks in chat_template.jinja; shared, so each is loaded (and its fast
    encoder built, seconds for 151k tokens) once in the module."""
    base = tmp_path_factory.mktemp("templates")
    return {where: with_chat_template(qwen_dir, base / where, source, as_file=where == "file")
            for where, source in TEMPLATE_SOURCES.items()}


def sharegpt(record) -> list[dict]:
    """The complete human/gpt pairs from the start (some conversations end on a human turn)."""
    turns, raw = [], record["conversations"]
    for asked, answered in zip(raw[0::2], raw[1::2]):
        if (asked["from"], answered["from"]) != ("human", "gpt"):
            break
        turns += [{"role": "user", "content": asked["value"]}, {"role": "assistant", "content": answered["value"]}]
    return turns


def alpaca(record) -> list[dict]:
    user = record["instruction"] + ("\n\n" + record["input"] if record["input"] else "")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": record["response"]}]


def qa(record) -> list[dict]:
    return [{"role": "user", "content": record["question"]}, {"role": "assistant", "content": record["answer"]}]


CHAT_FILES = {"chat/sharegpt_zh_1K.jsonl.zst": sharegpt, "chat/codegen-instruct.json.zst": alpaca,
              "chat/gsm8k-train.jsonl.zst": qa}
SAMPLE_STRIDE = 20


@pytest.fixture(scope="module")
def chat_records():
    return {name: list(read_records(shared_file(name))) for name in CHAT_FILES}


def conversations(chat_records, stride: int = 1) -> list[list[dict]]:
    """Every `stride`-th record of each file as a conversation (those without a complete exchange left out)."""
    return [c for name, records in chat_records.items() for r in records[::stride] if (c := CHAT_FILES[name](r))]


@pytest.fixture(scope="module")
def real_chats(chat_records):
    chats = conversations(chat_records)
    assert len(chats) == 999 + 4_535 + 7_473
    return chats + EDGES


@pytest.fixture(scope="module")
def sample_chats(chat_records):
    """Every 20th record of each file and the edge cases: each kind of conversation of the whole set."""
    sharegpt_sample = [len(sharegpt(r)) // 2 for r in chat_records["chat/sharegpt_zh_1K.jsonl.zst"][::SAMPLE_STRIDE]]
    assert 1 in sharegpt_sample and max(sharegpt_sample) >= 5  # one exchange, and many
    inputs = {bool(r["input"]) for r in chat_records["chat/codegen-instruct.json.zst"][::SAMPLE_STRIDE]}
    assert inputs == {True, False}  # Alpaca instructions with an input, and without
    return conversations(chat_records, SAMPLE_STRIDE) + EDGES


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) token ranges where the mask is set."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2], edges[1::2]))


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


@pytest.mark.parametrize("name", ["chatml", "qwen3", "llama3", "gemma4"])
@pytest.mark.parametrize("system", [False, True])
def test_golden_masks_decode_to_each_answer_and_its_end_of_turn(qwen_plus, name, system):
    chat = [SYSTEM, *POEM] if system else POEM
    template = get_template(name)
    result = encode_chat(chat, qwen_plus, name)
    text = render(chat, name).text
    assert isinstance(result, EncodedChat) and not result.truncated
    assert result.input_ids.dtype == np.int32 and result.loss_mask.dtype == bool
    assert result.input_ids.tolist() == qwen_plus.encode(text, add_special_tokens=False).ids
    answers = [t["content"] + template.end_of_turn for t in chat if t["role"] == "assistant"]
    assert [decode(qwen_plus, result.input_ids[a:b]) for a, b in runs(result.loss_mask)] == answers
    # everything else, headers, system and user turns, think block and prefix included, is not trained on
    unsupervised = text
    for answer in answers:
        unsupervised = unsupervised.replace(answer, "", 1)
    assert decode(qwen_plus, result.input_ids[~result.loss_mask]) == unsupervised


def test_think_block_and_gemma_prefix_are_single_tokens_outside_the_mask(qwen_plus):
    think = [qwen_plus.token_to_id(t) for t in ("<think>", "</think>")]
    result = encode_chat(POEM, qwen_plus, "qwen3")
    assert np.isin(result.input_ids, think).sum() == 2
    assert not result.loss_mask[np.isin(result.input_ids, think)].any()
    channel = [qwen_plus.token_to_id(t) for t in ("<|channel>", "<channel|>")]
    result = encode_chat(POEM, qwen_plus, "gemma4")
    assert np.isin(result.input_ids, channel).sum() == 2
    assert not result.loss_mask[np.isin(result.input_ids, channel)].any()
    assert result.loss_mask[result.input_ids == qwen_plus.token_to_id("<turn|>")].tolist() == [0, 1, 0, 1]


def test_offsets_are_code_point_positions_even_inside_a_character(qwen):
    text = "a👨‍👩‍👧床<|im_end|>"
    encoding = qwen.encode(text, add_special_tokens=False)
    # U+200D is 3 UTF-8 bytes, split in two byte-level tokens; both carry the character's span
    assert encoding.offsets.count((2, 3)) == 2 and encoding.offsets.count((4, 5)) == 2
    assert encoding.offsets[-2:] == [(6, 7), (7, 17)]  # 床, then the special token's own characters
    offsets = np.array(encoding.offsets)
    assert supervised_tokens(offsets, np.array([[2, 3]])).sum() == 2  # both halves of the ZWJ
    assert supervised_tokens(offsets, np.array([[6, 17]])).tolist() == [0] * (len(offsets) - 2) + [1, 1]
    assert not supervised_tokens(offsets, np.zeros((0, 2), dtype=np.int64)).any()


def test_a_token_straddling_a_span_edge_is_supervised(qwen):
    result = encode_chat(EDGES[0], qwen, "chatml")
    tokens = [qwen.id_to_token(int(i)) for i in result.input_ids]
    straddling = tokens.index("ĊĊ")  # the header's "\n" merged with the content's leading "\n"
    assert tokens[straddling - 1] == "assistant" and result.loss_mask[straddling]


@pytest.mark.parametrize("chats", ["sample_chats", pytest.param("real_chats", marks=pytest.mark.slow)])
def test_ids_equal_transformers_for_chatml_and_qwen3_jinja(hf, chats, request):
    chats = request.getfixturevalue(chats)
    for name, source in (("chatml", CHATML_JINJA), ("qwen3", QWEN3_NO_THINKING_JINJA)):
        expected = hf.apply_chat_template(chats, chat_template=source, tokenize=True, return_dict=True,
                                          enable_thinking=False)["input_ids"]
        got = encode_chats(chats, hf, name, min_loss_tokens=0)
        bad = [k for k, (g, e) in enumerate(zip(got, expected)) if g.input_ids.tolist() != e]
        assert bad == [], (name, len(bad), bad[:5])
    prompt = hf.apply_chat_template(POEM[:3], chat_template=QWEN3_NO_THINKING_JINJA, tokenize=False,
                                    add_generation_prompt=True, enable_thinking=False)
    assert render(POEM[:3], "qwen3", add_generation_prompt=True).text == prompt


@pytest.mark.parametrize("chats, supervised", [("sample_chats", 50_000),
                                                pytest.param("real_chats", 500_000, marks=pytest.mark.slow)])
def test_masks_equal_transformers_generation_blocks(hf, chats, supervised, request, template_dirs):
    chats = request.getfixturevalue(chats)
    expected = hf.apply_chat_template(chats, chat_template=CHATML_GENERATION_JINJA, tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)
    auto = load_tokenizer(template_dirs["file"])
    for tokenizer, name in ((hf, "chatml"), (auto, "auto")):
        got = encode_chats(chats, tokenizer, name, min_loss_tokens=0)
        bad = [k for k, (g, ids, mask) in enumerate(zip(got, expected["input_ids"], expected["assistant_masks"]))
               if g.input_ids.tolist() != ids or g.loss_mask.astype(int).tolist() != mask]
        assert bad == [], (name, len(bad), bad[:5])
    assert sum(sum(mask) for mask in expected["assistant_masks"]) > supervised


@pytest.mark.parametrize("where", TEMPLATE_SOURCES)
def test_auto_equals_named_chatml(template_dirs, qwen, where):
    directory = template_dirs[where]
    chats = [*EDGES, POEM, POEM[:3]]
    named = encode_chats(chats, qwen, "chatml")
    for tokenizer in (directory, directory / "tokenizer.json", ChatTokenizer(qwen, TEMPLATE_SOURCES[where])):
        auto = encode_chats(chats, tokenizer, "auto")
        assert [r.input_ids.tolist() for r in auto] == [r.input_ids.tolist() for r in named]
        assert [r.loss_mask.tolist() for r in auto] == [r.loss_mask.tolist() for r in named]


def test_auto_needs_a_chat_template(qwen, hf):
    for tokenizer in (qwen, hf):
        with pytest.raises(ValueError, match="template 'auto' renders with the tokenizer's own Jinja chat template, "
                                             "but this tokenizer has none"):
            encode_chat(POEM, tokenizer, "auto")


def test_tokenizer_forms_give_the_same_ids(qwen_dir, qwen, hf):
    expected = encode_chat(POEM, qwen, "chatml").input_ids.tolist()
    for tokenizer in (qwen_dir, qwen_dir / "tokenizer.json", str(qwen_dir), hf, load_tokenizer(qwen_dir)):
        assert encode_chat(POEM, tokenizer, "chatml").input_ids.tolist() == expected
    with pytest.raises(TypeError, match="expected a tokenizers.Tokenizer, a transformers fast tokenizer"):
        encode_chat(POEM, 42, "chatml")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        encode_chat(POEM, qwen_dir / "missing", "chatml")


def test_a_truncating_tokenizer_is_refused(qwen_dir):
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tokenizer.enable_truncation(16)
    with pytest.raises(ValueError, match="the tokenizer has truncation enabled .* call .no_truncation"):
        encode_chat(POEM, tokenizer, "chatml")


def lengths(tokenizer, name, chat, cuts) -> list[int]:
    return [len(encode_chat(chat[:c], tokenizer, name).input_ids) for c in cuts]


def test_truncation_keeps_the_longest_prefix_of_whole_exchanges(qwen):
    chat = [SYSTEM, *POEM, *POEM]  # system + 4 exchanges
    one, two, four = lengths(qwen, "chatml", chat, (3, 5, 9))
    for max_length in (two, four - 1):
        result = encode_chat(chat, qwen, "chatml", max_length)
        expected = encode_chat(chat[:5 if max_length == two else 7], qwen, "chatml")
        assert result.truncated and result.input_ids.tolist() == expected.input_ids.tolist()
        assert result.loss_mask.tolist() == expected.loss_mask.tolist()
    assert not encode_chat(chat, qwen, "chatml", four).truncated
    assert encode_chat(chat, qwen, "chatml", one - 1) == Drop(
        "too_long", f"{four} tokens, and the first exchange alone exceeds max_length {one - 1}")
    assert encode_chat(chat, qwen, "chatml", four - 1, overflow="drop") == Drop(
        "too_long", f"{four} tokens, max_length {four - 1}")


def test_qwen3_truncation_re_renders_the_think_block_on_the_new_last_turn(qwen):
    chat = [*POEM, *POEM[:2]]  # 3 exchanges
    plain_two = lengths(qwen, "chatml", chat, (4,))[0]  # what the full qwen3 encoding says two exchanges take
    one, two = lengths(qwen, "qwen3", chat, (2, 4))
    assert two == plain_two + 4  # <think>, "\n\n", </think>, "\n\n"
    result = encode_chat(chat, qwen, "qwen3", plain_two)
    assert result.truncated and result.input_ids.tolist() == encode_chat(chat[:2], qwen, "qwen3").input_ids.tolist()
    two_exchanges = encode_chat(chat[:4], qwen, "qwen3").input_ids.tolist()
    assert encode_chat(chat, qwen, "qwen3", two).input_ids.tolist() == two_exchanges
    assert encode_chat(chat, qwen, "qwen3", one - 1) == Drop(
        "too_long", f"the first exchange alone is {one} tokens, max_length {one - 1}")


def test_min_loss_tokens(qwen):
    empty_answer = [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]
    assert encode_chat(empty_answer, qwen, "chatml").loss_mask.sum() == 1  # <|im_end|> alone
    assert encode_chat(empty_answer, qwen, "chatml", min_loss_tokens=2) == Drop(
        "too_few_loss_tokens", "1 of 11 tokens supervised, min_loss_tokens 2")
    no_answer = POEM[:1]
    assert encode_chat(no_answer, qwen, "chatml").reason == "too_few_loss_tokens"
    assert encode_chat(no_answer, qwen, "chatml", min_loss_tokens=0).loss_mask.sum() == 0


def test_batch_results_keep_their_order(qwen):
    chats = [POEM, POEM[:1], POEM[:2], {"id": "r", "conversations": EDGES[1]}]
    results = encode_chats(chats, qwen, "qwen3", max_length=60)
    singles = [encode_chat(c, qwen, "qwen3", max_length=60) for c in chats]
    assert [type(r) for r in results] == [EncodedChat, Drop, EncodedChat, EncodedChat]
    for batch, single in zip(results, singles):
        if isinstance(single, Drop):
            assert batch == single
        else:
            assert (batch.input_ids.tolist(), batch.loss_mask.tolist(), batch.truncated) == \
                   (single.input_ids.tolist(), single.loss_mask.tolist(), single.truncated)


def test_bad_inputs_are_named(qwen):
    bad = [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]
    with pytest.raises(ValueError, match="^conversation 1: turn 1: role 'bot' is not one of system, user, assistant"):
        encode_chats([POEM, bad], qwen, "chatml")
    with pytest.raises(ValueError, match="^turn 0: content must be a string, found list"):
        encode_chat([{"role": "user", "content": ["a"]}], qwen, "chatml")
    shouting = ChatTemplate("shout", jinja="{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(ValueError, match="^conversation 0: turn 1: the Jinja chat template of 'shout'"):
        encode_chats([POEM], qwen, shouting)
    for options, message in (({"overflow": "cut"}, "overflow must be one of truncate, drop"),
                              ({"max_length": 0}, "max_length must be at least 1, found 0"),
                              ({"max_length": True}, "max_length must be a whole number, not True"),
                              ({"min_loss_tokens": -1}, "min_loss_tokens must be at least 0, found -1"),
                              ({"min_loss_tokens": 0.5}, "min_loss_tokens must be a whole number, not 0.5")):
        with pytest.raises(ValueError, match=message):
            encode_chat(POEM, qwen, "chatml", **options)
    with pytest.raises(ValueError, match="unknown chat template 'chatgpt'"):
        encode_chat(POEM, qwen, "chatgpt")


def test_auto_with_qwen3s_own_template_supervises_each_answer_never_a_header(qwen):
    # Issue 25: `cache build --chat-template auto` on a Qwen3 model, whose template has no
    # generation blocks, found the answer "a" inside the next header ("assistant") and
    # supervised <|im_start|> instead.
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    own = ChatTokenizer(qwen, QWEN3_CHAT_TEMPLATE, {"eos_token": "<|im_end|>"})  # as tiny_qwen3 saves it
    letters = [[{"role": "user", "content": "Pick a letter"}, {"role": "assistant", "content": answer}]
               for answer in ("a", "|>", "m", "t")]
    headers = [[{"role": "user", "content": c}, {"role": "assistant", "content": c},
                {"role": "user", "content": c}, {"role": "assistant", "content": "x" + c}]
               for c in ("assistant", "<|im_start|>", "im_end", "\n", "")]  # a final "\n" would be stripped
    chats = [*letters, *headers, *EDGES[1:], POEM, POEM[:3]]
    # "<|im_start|>" as an answer is kept as the control token it spells: the spans are what is tested
    auto, named = (encode_chats(chats, own, "auto", special_text="keep"),
                   encode_chats(chats, qwen, "qwen3", special_text="keep"))
    assert [decode(qwen, r.input_ids[r.loss_mask]) for r in auto[:4]] == ["a<|im_end|>", "|><|im_end|>",
                                                                         "m<|im_end|>", "t<|im_end|>"]
    assert [r.input_ids.tolist() for r in auto] == [r.input_ids.tolist() for r in named]
    assert [r.loss_mask.tolist() for r in auto] == [r.loss_mask.tolist() for r in named]
    # Qwen3 strips the final answer's leading newlines: rendered turn by turn, what it writes is supervised
    stripped = encode_chats([EDGES[0]], own, "auto")[0]
    assert decode(qwen, stripped.input_ids[stripped.loss_mask]) == "starts on a newline<|im_end|>"
    # an earlier turn keeps them but loses the think block of the last turn: marks locate the answers there
    earlier = encode_chats([[*EDGES[0], *EDGES[1]]], own, "auto")[0]
    # (the header's "\n" and the answer's are one token, which overlaps the answer: supervised, as in transformers)
    assert decode(qwen, earlier.input_ids[earlier.loss_mask]) == "\n\nstarts on a newline<|im_end|>👨‍👩‍👧‍👦🇨🇳 ok<|im_end|>"


def test_truncation_under_jinja_templates_equals_the_named_template(qwen):
    chat = [SYSTEM, *POEM, *POEM]
    one, two, four = lengths(qwen, "chatml", chat, (3, 5, 9))
    for max_length in (one, two, four - 1):
        named = encode_chat(chat, qwen, "chatml", max_length)
        for source in (CHATML_JINJA, CHATML_GENERATION_JINJA):
            got = encode_chat(chat, qwen, ChatTemplate("mine", jinja=source), max_length)
            assert got.truncated and (got.input_ids.tolist(), got.loss_mask.tolist()) == \
                   (named.input_ids.tolist(), named.loss_mask.tolist())


def test_truncation_when_generation_blocks_are_not_one_per_assistant_turn(qwen):
    # only the last assistant turn is trained on: the turn ends are unknown, so every cut is tried
    source = CHATML_GENERATION_JINJA.replace("m['role'] == 'assistant'", "m['role'] == 'assistant' and loop.last")
    template = ChatTemplate("last-only", jinja=source)
    chat = [SYSTEM, *POEM, *POEM]
    three = len(encode_chat(chat[:7], qwen, template).input_ids)
    got = encode_chat(chat, qwen, template, three)
    expected = encode_chat(chat[:7], qwen, template)
    assert got.truncated and (got.input_ids.tolist(), got.loss_mask.tolist()) == \
           (expected.input_ids.tolist(), expected.loss_mask.tolist())
    assert decode(qwen, got.input_ids[got.loss_mask]) == POEM[1]["content"] + "<|im_end|>"
