"""The n-grams decontamination compares: the numba kernel gives the bits of the plain-Python
reference, and the edits a prompt goes through (case, spacing, punctuation, full-width forms,
composed or decomposed accents, characters that render as nothing) leave its n-grams as they were."""

import itertools
import random

import pytest

from fuelline.decontaminate.ngrams import ngram_hashes, reference_ngrams, tokens
from fuelline.io import read_records
from fuelline.text import invisible

from ..conftest import shared_file

TRICKY = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "用 Python 写一个函数，计算两个数的和。",  # mixed: words and characters in one sequence
    "ＡＢＣ ｄｅｆ café ﬁne Straße",  # full-width letters, a ligature
    "cafe\u0301 na\u0308ive",  # decomposed accents: normalized whole
    "हिन्दी भाषा का शब्द",  # combining vowel signs inside words
    "한국어 텍스트 ᄒᆞᆫ글",  # hangul syllables and conjoining jamo
    "㎏ ½ ① … “quoted” ΣΑΣ",
    "a\x00b c",  # a NUL inside a text is a space
    "Don't stop: it's the teacher's 'quoted' word, rock ’n’ roll, o'", "'' a' 'b x'y'z",  # apostrophes
    "con\u00adtami\u00adnation zero\u200bwidth do\u200bn'\u2060t e\u00ad\u0301 \ufeffbom ✌\ufe0f 汉\u200b字",  # invisible
    "",
]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_kernel_gives_the_reference_bits(n):
    texts = TRICKY + [t.upper() for t in TRICKY[:3]]
    hashes, offsets = ngram_hashes(texts, n)
    for i, text in enumerate(texts):
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == reference_ngrams(text, n), text


def test_the_kernel_gives_the_reference_bits_on_real_chat_text():
    texts = [r["conversations"][0]["value"] for r in itertools.islice(
        read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst")), 300)]
    hashes, offsets = ngram_hashes(texts, 8)
    for i, text in enumerate(texts):
        assert hashes[offsets[i]:offsets[i + 1]].tolist() == reference_ngrams(text, 8)


def test_words_and_cjk_characters_are_the_tokens():
    assert tokens("用 Python 写一个函数，计算 2 个数") == ["用", "python", "写", "一", "个", "函", "数", "计", "算", "2",
                                                     "个", "数"]
    assert tokens("Hello,world! It's 3.14") == ["hello", "world", "its", "3", "14"]
    # an apostrophe inside a word joins it; at a word's edge it separates, as other punctuation does
    assert tokens("don’t 'quoted' rock 'n' roll o'") == ["dont", "quoted", "rock", "n", "roll", "o"]


@pytest.mark.parametrize("edited", [
    "natalia  SOLD clips to 48 of her friends\nin april; and then she sold half as many clips in may!!",
    "Ｎａｔａｌｉａ sold clips to ４８ of her friends in April, and then she sold half as many clips in May.",
    "Natalia sold clips to 48 of her friend's in April, and then she sold half as many clip’s in May.",
])
def test_case_spacing_punctuation_and_full_width_forms_change_no_ngram(edited):
    original = TRICKY[0]
    assert reference_ngrams(edited, 8) == reference_ngrams(original, 8)
    hashes, offsets = ngram_hashes([original, edited], 8)
    assert hashes[:offsets[1]].tolist() == hashes[offsets[1]:].tolist()


def test_a_text_shorter_than_n_tokens_has_no_ngram():
    hashes, offsets = ngram_hashes(["one two three", "one two three four"], 4)
    assert offsets.tolist() == [0, 0, 1] and len(hashes) == 1


# Characters that render as nothing, as scraped HTML and copy-paste leave them in text: soft hyphen,
# zero-width space, non-joiner and joiner, word joiner, byte order mark, left-to-right mark,
# variation selector 16, combining grapheme joiner, a tag character, Mongolian variation selector.
INVISIBLE = "\u00ad\u200b\u200c\u200d\u2060\ufeff\u200e\ufe0f\u034f\U000e0041\u180b"


def sprinkled(text: str, char: str, rng: random.Random, share: float = 0.3) -> str:
    """`text` with `char` put between its characters at random, about `share` of the gaps."""
    return "".join(c + (char if rng.random() < share else "") for c in text)


@pytest.mark.parametrize("char", list(INVISIBLE))
def test_invisible_characters_at_random_positions_change_no_ngram(char):
    """Real English, code and Chinese prompts, each invisible character put between their characters
    at random: the same n-grams, in the kernel and in the reference."""
    assert invisible(char)
    texts = [r["instruction"] + "\n" + r["input"] + "\n" + r["response"] for r in itertools.islice(
        read_records(shared_file("chat/codegen-instruct.json.zst")), 20)]
    texts += [r["conversations"][0]["value"] for r in itertools.islice(
        read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst")), 20)]
    texts += TRICKY[:-1]
    rng = random.Random(ord(char))
    hidden = [sprinkled(text, char, rng) for text in texts]
    hashes, offsets = ngram_hashes(texts + hidden, 8)
    k = len(texts)
    for i, text in enumerate(texts):
        assert hashes[offsets[k + i]:offsets[k + i + 1]].tolist() == hashes[offsets[i]:offsets[i + 1]].tolist(), text
        assert reference_ngrams(hidden[i], 8) == reference_ngrams(text, 8), text


def test_visible_format_like_characters_still_separate_words():
    """Only what renders as nothing is left out: a space of any width, a line separator, a
    hyphen still cut two words apart."""
    for separator in (" ", "\u00a0", "\u2009", "\u2028", "-", "\u2010"):
        assert tokens(f"hyper{separator}text") == ["hyper", "text"], repr(separator)
