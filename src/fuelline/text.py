"""Character classes and text normalization, shared by the cleaning profiles, dedup and chat.

CJK text has no spaces between words, so every count here that a Latin-script rule would make
by splitting on whitespace is made per character for Han, kana and hangul: `words("江南好，风景旧曾谙")`
is 8 words, not 1.
"""

from __future__ import annotations

import re
import unicodedata

HAN_RANGES = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK extension A, unified ideographs, compatibility
    "\U00020000-\U0002a6df\U0002a700-\U0002ebef\U00030000-\U0003134f"  # extensions B-G
)
CJK_RANGES = HAN_RANGES + "\u3040-\u30ff\uac00-\ud7af"  # + kana and hangul syllables
HAN = re.compile(f"[{HAN_RANGES}]")
CJK = re.compile(f"[{CJK_RANGES}]")
WORD = re.compile(f"[{CJK_RANGES}]|[^\\s{CJK_RANGES}]+")
PRIVATE_USE = re.compile("[\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]")
# Control and format characters except tab and newline; includes zero-width spaces and BOMs.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\ufeff]")
SPACES = re.compile(r"[^\S\n]+")
BLANK_LINES = re.compile(r"\n{3,}")


def han_count(text: str) -> int:
    return len(HAN.findall(text))


def cjk_share(text: str) -> float:
    """Share of CJK characters among the non-space characters of `text`."""
    visible = len(text) - text.count(" ") - text.count("\n")
    return len(CJK.findall(text)) / max(1, visible)


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
