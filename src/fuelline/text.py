"""Character classes and text normalization, shared by the cleaning profiles, dedup and chat.

CJK text has no spaces between words, so every count here that a Latin-script rule would make
by splitting on whitespace is made per character for Han, kana and hangul: `words("江南好，风景旧曾谙")`
is 8 words, not 1.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

import numpy as np

HAN_SPANS = (
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),  # CJK extension A, unified ideographs, compatibility
    (0x20000, 0x2A6DF), (0x2A700, 0x2EBEF), (0x30000, 0x3134F),  # extensions B-G
)
CJK_SPANS = HAN_SPANS + ((0x3040, 0x30FF), (0xAC00, 0xD7AF))  # + kana and hangul syllables


def _char_class(spans: tuple[tuple[int, int], ...]) -> str:
    """The inside of a regex character class that matches the code points of `spans` (inclusive)."""
    return "".join(f"{chr(first)}-{chr(last)}" for first, last in spans)


HAN_RANGES = _char_class(HAN_SPANS)
CJK_RANGES = _char_class(CJK_SPANS)
HAN = re.compile(f"[{HAN_RANGES}]")
CJK = re.compile(f"[{CJK_RANGES}]")
WORD = re.compile(f"[{CJK_RANGES}]|[^\\s{CJK_RANGES}]+")
PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
# Control and format characters except tab and newline; includes zero-width spaces and BOMs.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\ufeff]")
SPACES = re.compile(r"[^\S\n]+")
BLANK_LINES = re.compile(r"\n{3,}")


# What renders as nothing besides the format characters (category Cf: soft hyphen, zero-width space,
# non-joiner and joiner, word joiner, byte order mark, bidi controls, tags): the rest of Unicode's
# default-ignorable code points (DerivedCoreProperties.txt), marks and fillers: the combining grapheme
# joiner, Hangul fillers, Khmer inherent vowels, Mongolian and other variation selectors.
INVISIBLE_SPANS = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
                   (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xE0000, 0xE0FFF))


def invisible(c: str) -> bool:
    """Whether a character renders as nothing: inserted anywhere, it leaves a text looking the same."""
    return unicodedata.category(c) == "Cf" or any(first <= ord(c) <= last for first, last in INVISIBLE_SPANS)


@functools.cache
def _invisible_table() -> dict[int, None]:
    return dict.fromkeys(c for c in range(sys.maxunicode + 1) if invisible(chr(c)))  # ~0.2 s, once


def without_invisible(text: str) -> str:
    """`text` less its invisible characters (`invisible`)."""
    return text.translate(_invisible_table())


def han_count(text: str) -> int:
    return len(HAN.findall(text))


@functools.cache
def _is_cjk_table() -> np.ndarray:
    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    for first, last in CJK_SPANS:
        table[first:last + 1] = True
    return table


def cjk_characters(code_points: np.ndarray) -> np.ndarray:
    """Which of `code_points` (uint32) are Han, kana or hangul: one table look-up each."""
    return _is_cjk_table()[code_points]


def per_document_counts(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """How many of each document's characters are set in `mask`, which holds every document's
    characters back to back, document i's at [offsets[i], offsets[i + 1])."""
    # reduceat sums [offsets[i], offsets[i + 1]); an empty document would get mask[offsets[i]], and
    # trailing empty ones would start past the end but for the extra element.
    counts = np.add.reduceat(np.append(mask, False), offsets[:-1], dtype=np.int64)
    counts[offsets[:-1] == offsets[1:]] = 0
    return counts


def cjk_shares(code_points: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per document, the share of CJK characters among its non-space characters (not " ", not
    "\\n"), for documents back to back in `code_points` (uint32, see `per_document_counts`). One
    table look-up per character, for a whole batch: ~15 ms for 50,000 poems, where a regex findall
    per text took ~190 ms."""
    cjk = per_document_counts(cjk_characters(code_points), offsets)
    spaces = per_document_counts((code_points == ord(" ")) | (code_points == ord("\n")), offsets)
    return cjk / np.maximum(1, np.diff(offsets) - spaces)


class _WordCharacters:
    """Whether code points are word characters, as the regex `\\w` decides but for "_" (str.isalnum):
    letters and digits of any script, not punctuation, symbols or whitespace. The table is filled
    as code points are first seen (a poetry shard brings ~7,000, the whole table would be 1.1 M)."""

    UNKNOWN, OTHER, WORD = 0, 1, 2

    def __init__(self):
        self._table = np.zeros(sys.maxunicode + 1, dtype=np.uint8)

    def __call__(self, code_points: np.ndarray) -> np.ndarray:
        kinds = self._table[code_points]
        if (kinds == self.UNKNOWN).any():
            new = np.flatnonzero(np.bincount(code_points[kinds == self.UNKNOWN], minlength=len(self._table)))
            self._table[new] = [self.WORD if chr(c).isalnum() else self.OTHER for c in new.tolist()]
            kinds = self._table[code_points]
        return kinds == self.WORD


@functools.cache
def _word_table() -> _WordCharacters:
    return _WordCharacters()


def word_characters(code_points: np.ndarray) -> np.ndarray:
    """Which of `code_points` (uint32) are letters or digits of any script (dedup's and decontaminate's
    "words"), the rest being punctuation, symbols and whitespace."""
    return _word_table()(code_points)


def words(text: str) -> list[str]:
    """Whitespace-separated words, with every CJK character a word of its own."""
    return WORD.findall(text)


def is_spaced_word(token: str) -> bool:
    """Whether a `words` token is a word of a script written with spaces (Latin, Cyrillic, …).

    It holds a letter and no CJK character: "GPU" and "naïve" are, "2026", "。" and "江" are not.
    """
    return not CJK.search(token) and any(c.isalpha() for c in token)


def normalize_text(text: str, form: str | None = "NFKC") -> str:
    """Unicode normalization, control characters removed, spaces collapsed, lines stripped.

    NFKC folds full-width Latin letters and digits and compatibility ideographs; pass
    form=None to keep the text's own code points (the poetry profile does: NFKC would turn
    the full-width punctuation of classical texts into ASCII).
    """
    if form:
        text = unicodedata.normalize(form, text)
    text = CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = [SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
