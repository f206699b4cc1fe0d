"""FastEncoder: tiktoken's ids and offsets must be exactly the tokenizer's own, or it must not be used."""

import re

import numpy as np
import pytest
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers

from fuelline.io import read_records
from fuelline.tokenizer.fast import TWO_SPACES, FastEncoder, tiktoken_ranks
from fuelline.tokenizer.tiktoken_convert import byte_alphabet

from ..conftest import shared_file
from .test_tiktoken_convert import ADVERSARIAL


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen_encoder_once(qwen):
    return FastEncoder(qwen)


@pytest.fixture
def qwen_encoder(qwen_encoder_once):
    """The Qwen vocabulary's encoder, built once in the module (the ranks of 151k tokens take
    seconds); a test may change its threads."""
    threads = qwen_encoder_once.threads
    yield qwen_encoder_once
    qwen_encoder_once.threads = threads


def reference(tokenizer, texts):
    return [(e.ids, [list(o) for o in e.offsets]) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def assert_same(encoder: FastEncoder, texts: list[str]) -> None:
    got = encoder.encode(texts, offsets=True)
    for text, (ids, offsets), (want_ids, want_offsets) in zip(texts, got, reference(encoder.tokenizer, texts)):
        assert ids.dtype == np.int32 and ids.tolist() == want_ids, text[:80]
        assert offsets.tolist() == want_offsets, text[:80]


def test_qwen_vocabulary_runs_on_tiktoken_with_the_tokenizers_ids_and_offsets(qwen_encoder):
    encoder = qwen_encoder
    encoder.threads = 2
    extra = ["<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n👨‍👩‍👧 ok<|im_end|>", ""]
    assert_same(encoder, ADVERSARIAL + extra)
    assert encoder.engine == "tiktoken"


def test_texts_that_start_with_a_special_token_are_encoded_joined_with_each_texts_own_ids(qwen_encoder):
    """A batch whose texts each open with a special token is encoded in one call per thread; the
    ids, tokens per text and offsets must still be each text's own, whatever its previous text
    ended with (spaces, a newline run, half a word, a special token, nothing)."""
    ends = [" ", "\n\n", "  \t", "abc", "你好", "<|im_end|>", "", "'s", "123", "👨‍👩‍👧"]
    texts = [f"<|im_start|>user\n{a}{end}" for a in ADVERSARIAL[:20] for end in ends]
    texts += ["<|im_start|>", "<|im_end|><|im_start|>x", "<|im_start|>  "]
    encoder = qwen_encoder
    encoder.threads = 3
    assert encoder._special_starts and all(t.startswith(encoder._special_starts) for t in texts)
    assert_same(encoder, texts)
    assert_same(encoder, ["plain first text ", *texts])  # only the texts after the first must open so
    assert_same(encoder, [*texts[:5], "no special token here", *texts[5:9]])  # one does not: text by text


def test_batches_encode_in_order_whatever_the_threads_and_the_texts_lengths(qwen_encoder):
    """`encode_batches` hands back each batch under its key, encoded as `encode_batch` alone would;
    the pieces each thread encodes are cut by characters, so one text far longer than the others
    (a piece of its own) or a batch of fewer texts than threads changes nothing."""
    long = "<|im_start|>user\n" + "你好，世界。 words and 123 numbers\n" * 500
    short = [f"<|im_start|>assistant\n{a}" for a in ADVERSARIAL[:30]]
    batches = [short[:3] + [long] + short[3:], [long], short[:1], [], short + [long, long]]
    encoder = qwen_encoder
    encoder.threads = 1
    expected = [encoder.encode_batch(texts, offsets=True) for texts in batches]
    for threads in (2, 3, 8):
        encoder.threads = threads
        got = list(encoder.encode_batches(enumerate(batches), offsets=True))
        assert [key for key, _ in got] == list(range(len(batches)))
        for (_, batch), want in zip(got, expected):
            assert batch.ids.tolist() == want.ids.tolist() and batch.counts.tolist() == want.counts.tolist()
            assert batch.offsets.tolist() == want.offsets.tolist()
    assert_same(encoder, batches[0])


@pytest.mark.parametrize("stride", [4, pytest.param(1, marks=pytest.mark.slow)], ids=["every-4th-text", "every-text"])
def test_real_chat_text_gives_identical_ids_and_offsets(qwen, qwen_encoder, stride):
    """ShareGPT's Chinese conversations and Alpaca's English and code (3.2 M characters in all)."""
    texts = ["\n".join(t["value"] for t in r["conversations"])
             for r in read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst"))][::stride]
    texts += [r["instruction"] + r["response"] for r in read_records(shared_file("chat/codegen-instruct.json.zst"))
              ][::stride]
    encoder = qwen_encoder
    assert_same(encoder, texts)
    assert encoder.engine == "tiktoken"
    assert [a.tolist() for a in encoder.encode(texts[:50])] == [i for i, _ in reference(qwen, texts[:50])]


def test_a_trained_poetry_tokenizer_converts(tokenizer_dir, poems):
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encoder = FastEncoder(tokenizer)
    assert_same(encoder, [d["text"] for d in poems[1][:3000]] + ["<s><|title|>静夜思</s> Latin, 2026!"])
    assert encoder.engine == "tiktoken"


def byte_level_bpe(extra_tokens: list[str], merges: list[tuple[str, str]]) -> tokenizers.Tokenizer:
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    vocab.update({t: 256 + i for i, t in enumerate(extra_tokens)})
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


def test_a_difference_found_on_the_first_texts_falls_back_to_the_tokenizer():
    # "abc" is a token, but reached only through (a, bc): the tokenizer merges (a, b) first and
    # stops at [ab, c], where tiktoken takes the whole piece "abc". Merge order and ranks agree,
    # so only the comparison of ids can find this.
    tokenizer = byte_level_bpe(["ab", "bc", "abc"], [("a", "b"), ("b", "c"), ("a", "bc")])
    assert not isinstance(tiktoken_ranks(tokenizer), str)
    encoder = FastEncoder(tokenizer)
    assert [a.tolist() for a in encoder.encode(["abc", "xbc"])] == [[256, ord("c")], [ord("x"), 257]]
    assert encoder.engine == "tokenizers" and "differed" in encoder.reason


@pytest.mark.parametrize("change, reason", [
    (lambda t: setattr(t, "normalizer", normalizers.NFC()), "normalizer"),
    (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()), "pre-tokenizer"),
])
def test_tokenizers_that_tiktoken_cannot_express_are_refused_with_a_reason(change, reason):
    tokenizer = byte_level_bpe(["ab"], [("a", "b")])
    change(tokenizer)
    encoder = FastEncoder(tokenizer)
    assert encoder.engine == "tokenizers" and reason in encoder.reason
    assert encoder.encode(["ab ab"])[0].tolist() == tokenizer.encode("ab ab", add_special_tokens=False).ids


def test_merges_out_of_rank_order_are_refused():
    tokenizer = byte_level_bpe(["bc", "ab"], [("a", "b"), ("b", "c")])  # "ab" merged first, ranked later
    assert "merge order" in tiktoken_ranks(tokenizer)


def test_every_whitespace_character_of_the_regex_is_one_that_two_spaces_finds():
    """tiktoken's regex means Unicode White_Space by \\s; a text where TWO_SPACES finds nothing must
    have no two of them in a row, so each must be whitespace to Python's re as well."""
    regex = pytest.importorskip("regex")  # tiktoken's own dependency
    white = [chr(c) for c in range(0x110000) if regex.match(r"\p{White_Space}", chr(c))]
    assert len(white) == 25 and all(re.match(r"\s", c) for c in white)


def test_texts_without_two_spaces_in_a_row_encode_alike_without_the_lookahead(qwen, qwen_encoder):
    """The adversarial texts with every whitespace run cut to its first character, joined as a batch
    is (Qwen's merges hold many whitespace pieces, so a piece split otherwise changes the ids)."""
    texts = [re.sub(r"\s+", lambda m: m.group()[0], t) for t in ADVERSARIAL]
    texts += ["a b\nc\td\u3000e\u00a0f", " lead", "trail ", "中 文\n英"]
    assert not any(TWO_SPACES.search(t) for t in texts)
    assert qwen_encoder._encoder_for(qwen_encoder._separator[0].join(texts)) is not qwen_encoder._tiktoken
    assert_same(qwen_encoder, texts)
    without = qwen_encoder._encoder_for("a b")
    assert without.encode_ordinary("a  b") != qwen_encoder._tiktoken.encode_ordinary("a  b")  # what it finds


def test_a_batch_with_two_spaces_in_a_row_is_encoded_with_the_lookahead(qwen_encoder):
    texts = ["床前 明月光", "疑是\n地上霜", "举头  望明月", "低头\n\n思故乡", "\u3000\u3000静夜思", "end  ", "a \tb"]
    assert_same(qwen_encoder, texts)
    assert_same(qwen_encoder, [t for t in texts if not TWO_SPACES.search(t)])
    assert qwen_encoder.engine == "tiktoken"  # the first batch's check found no difference
