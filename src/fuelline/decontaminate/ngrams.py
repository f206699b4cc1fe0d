"""The n-grams decontamination compares: what a text may go through and still be "the same prompt".

A text loses the characters that render as nothing (`fuelline.text.invisible`: soft hyphens,
zero-width spaces and joiners, byte order marks, variation selectors: scraped text is full of them,
and one inside a word would cut it in two), is NFKC-normalized and case-folded, then cut into tokens: a run of letters and digits of a
script written with spaces is a word, and every Han, kana or hangul character is a token of its
own (those scripts put no spaces between words); an apostrophe between two letters is dropped
("don't" is "dont"); everything else (spaces, newlines, punctuation, symbols) only separates tokens. So "Natalia sold clips to 48 of her friends" and "natalia  sold
CLIPS, to 48 of her friends!" give the same tokens, and mixed text ("用 Python 写一个函数") is one
sequence of words and characters. An n-gram is n tokens in a row, hashed to 64 bits.

The hashes: a token is the FNV-style fold of its code points (`fuelline.dedup.minhash.shingle_hash`),
an n-gram a polynomial of its n token hashes that rolls along the text, finished by splitmix64;
`reference_ngrams` computes the same bits in plain Python. One batch of texts is one encode,
one table look-up per character for its class and folded form, and one numba pass: ~100 MB of
text a second on one core, where splitting and joining words in Python is ~15 MB/s
(benchmarks/bench_decontaminate.py).
"""

from __future__ import annotations

import functools
import sys
import unicodedata

import numpy as np
from numba import njit

from fuelline.dedup.minhash import FNV_OFFSET, FNV_PRIME, MASK64, finish, mix64, shingle_hash
from fuelline.text import cjk_characters, invisible, without_invisible

NGRAM_BASE = 0x9E3779B97F4A7C15  # odd: the n-gram polynomial's base, mod 2**64
UNKNOWN, SEPARATOR, WORD, CJK, BOUNDARY, APOSTROPHE, INVISIBLE = range(7)  # a character's class; UNKNOWN: not yet
APOSTROPHES = "'\u2019\u02bc"  # inside a word they join its two halves; elsewhere they separate
NEEDS_NFKC, KIND = 8, 7  # a flag on the class: the text must be NFKC-normalized whole; the class without it


def lower(c: str) -> str:
    """A character in lower case, when that is one character ("İ" and the like stay as they are)."""
    lowered = c.lower()
    return lowered if len(lowered) == 1 else c


def normal(text: str) -> str:
    """`text` without its invisible characters, then NFKC (full-width letters and digits, ligatures,
    compatibility ideographs): a soft hyphen between a letter and its accent no longer keeps them apart."""
    text = without_invisible(text)
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def fold(text: str) -> str:
    """`normal`, then `lower`."""
    return "".join(map(lower, normal(text)))


def char_class(c: str) -> int:
    """SEPARATOR, WORD (a letter, digit or combining mark), CJK or APOSTROPHE, of a character as `fold`
    leaves it."""
    if c in APOSTROPHES:
        return APOSTROPHE
    if cjk_characters(np.array([ord(c)], dtype=np.uint32))[0]:
        return CJK
    return WORD if c.isalnum() or unicodedata.category(c)[0] == "M" else SEPARATOR


def _entry(c: str) -> tuple[int, int]:
    """(class, folded code point) of an original character. Most characters are folded one by one
    (their NFKC form is one character, or only punctuation: "，" is ",", "…" is "..."); those that
    are not, or may combine with a neighbour (marks, conjoining jamo, ligatures such as "ﬁ"), are
    flagged, and a text holding one is normalized whole first. An invisible character is left out
    wherever it is, inside a word too."""
    if invisible(c):
        return INVISIBLE, ord(c)
    nfkc = unicodedata.normalize("NFKC", c)
    combining = unicodedata.category(c)[0] == "M" or unicodedata.combining(unicodedata.normalize("NFKD", c)[0]) \
        or 0x1100 <= ord(c) <= 0x11FF or 0xA960 <= ord(c) <= 0xA97F or 0xD7B0 <= ord(c) <= 0xD7FF
    if len(nfkc) == 1 and not combining:
        return char_class(nfkc), ord(lower(nfkc))
    if not combining and not any(char_class(x) not in (SEPARATOR, APOSTROPHE) for x in nfkc):
        return SEPARATOR, ord(c)
    return char_class(c) | NEEDS_NFKC, ord(lower(c))


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """The class of every code point and its folded form (`_entry`), filled as code points are first
    seen (`_fill_tables`): 5.6 MB per process, and Python only for code points new to it."""
    classes = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    classes[0] = BOUNDARY
    return classes, np.arange(sys.maxunicode + 1, dtype=np.uint32)


@njit(cache=True)
def _unknown(code_points, table):
    """The distinct code points whose class is not in `table` yet (marked in it meanwhile)."""
    found = []
    for c in code_points:
        if table[c] == UNKNOWN:
            table[c] = 255
            found.append(c)
    return np.array(found, dtype=np.uint32)


def _fill_tables(code_points: np.ndarray, classes: np.ndarray, folded: np.ndarray) -> None:
    new = _unknown(code_points, classes).tolist()
    if new:
        classes[new], folded[new] = zip(*(_entry(chr(c)) for c in new))


@njit(cache=True, inline="always")
def _hash_token(code_points, table, folded, start, length):
    """`shingle_hash` of a token's characters, folded, its apostrophes and invisible characters left out."""
    h = np.uint64(FNV_OFFSET)
    for j in range(length):
        c = code_points[start + j]
        kind = table[c] & KIND
        if kind != APOSTROPHE and kind != INVISIBLE:
            h = (h ^ np.uint64(folded[c])) * np.uint64(FNV_PRIME)
    return finish(h)


@njit(cache=True, inline="always")
def _rolling_ngrams(tokens, count, n, out, total):
    """The n-grams of tokens[:count] into out[total:], each `NGRAM_BASE`-polynomial of its n token hashes
    (one multiply-add per token as the window rolls), finished by splitmix64; returns the new total."""
    base, h, top = np.uint64(NGRAM_BASE), np.uint64(0), np.uint64(1)
    for _ in range(n - 1):
        top *= base  # base ** (n - 1): the weight of the token leaving the window
    for t in range(count):
        if t >= n:
            h -= tokens[t - n] * top
        h = h * base + tokens[t]
        if t >= n - 1:
            out[total] = finish(h)
            total += 1
    return total


@njit(cache=True, inline="always")
def _visible(code_points, table, j):
    """The first position from j on that does not hold an invisible character."""
    while j < code_points.shape[0] and table[code_points[j]] & KIND == INVISIBLE:
        j += 1
    return j


@njit(cache=True)
def _ngram_kernel(code_points, table, folded, n, normalized, tokens, out, out_offsets):
    """Every text's n-gram hashes into `out`, text d's at [out_offsets[d], out_offsets[d + 1]);
    texts end at BOUNDARY. Texts that need NFKC and are not `normalized` yet are flagged there (2):
    what was written for them does not count. Returns 0, having stopped, when a code point is not in
    `table` yet, else 1."""
    total, count, d, i, end = 0, 0, 0, 0, code_points.shape[0]
    out_offsets[0] = 0
    while i <= end:
        entry = BOUNDARY if i == end else table[code_points[i]]
        if entry == UNKNOWN:
            return 0
        if entry & NEEDS_NFKC and normalized[d] == 0:
            normalized[d] = 2
        kind = entry & KIND
        if kind == BOUNDARY:
            total = _rolling_ngrams(tokens, count, n, out, total)
            d += 1
            out_offsets[d] = total
            count = 0
            i += 1
            continue
        if kind == SEPARATOR or kind == APOSTROPHE or kind == INVISIBLE:
            i += 1
            continue
        j = i + 1
        while kind == WORD and j < end:
            entry = table[code_points[j]]
            if entry & KIND == INVISIBLE:
                j += 1  # left out: the word goes on
                continue
            if entry & KIND == APOSTROPHE:
                k = _visible(code_points, table, j + 1)
                if k < end and table[code_points[k]] & KIND == WORD:
                    j += 1  # "don't": the word goes on after it
                    continue
            if entry & KIND != WORD:
                break
            if entry & NEEDS_NFKC and normalized[d] == 0:
                normalized[d] = 2
            j += 1
        tokens[count] = _hash_token(code_points, table, folded, i, j - i)
        count += 1
        i = j
    return 1


def _joined(texts: list[str]) -> np.ndarray:
    joined = "\0".join(texts)
    if joined.count("\0") != max(len(texts) - 1, 0):
        joined = "\0".join(text.replace("\0", " ") for text in texts)
    return np.frombuffer(joined.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


def ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the n-gram hashes of every text back to back, uint64; offsets, int64): text i's n-grams are
    `hashes[offsets[i]:offsets[i + 1]]`, in order, repeats kept. A text of fewer than n tokens has none.

    The texts are one string, NUL between them (a NUL inside a text is a space), cut where the
    kernel meets a NUL; NFKC and case are folded there, character by character, by table
    (`_entry`), and only a text with a character that needs more is normalized in Python."""
    code_points = _joined(texts)
    classes, folded = _tables()
    normalized = np.zeros(len(texts) + 1, dtype=np.uint8)
    while True:
        tokens = np.empty(len(code_points) + 1, dtype=np.uint64)  # at most one token per character
        hashes = np.empty(len(code_points) + 1, dtype=np.uint64)
        offsets = np.empty(len(texts) + 1, dtype=np.int64)
        status = _ngram_kernel(code_points, classes, folded, n, normalized, tokens, hashes, offsets)
        if (normalized == 2).any():  # flagged before the kernel stopped or finished
            texts = [normal(text) if flag == 2 else text
                     for text, flag in zip(texts, normalized.tolist())]
            normalized[normalized == 2] = 1
            code_points = _joined(texts)
        elif status == 0:
            _fill_tables(code_points, classes, folded)
        else:
            return hashes[:offsets[-1]].copy(), offsets


def tokens(text: str) -> list[str]:
    """The tokens of one text, the plain way (for tests and messages): words and CJK characters."""
    found, word = [], []
    folded = fold(text)
    for k, c in enumerate(folded):
        kind = char_class(c)
        if kind == APOSTROPHE and word and k + 1 < len(folded) and char_class(folded[k + 1]) == WORD:
            continue  # inside a word: left out, the word goes on
        if kind != WORD and word:
            found.append("".join(word))
            word = []
        if kind == WORD:
            word.append(c)
        elif kind == CJK:
            found.append(c)
    return found + (["".join(word)] if word else [])


def reference_ngrams(text: str, n: int) -> list[int]:
    """`ngram_hashes([text], n)[0]`, computed the slow and obvious way (for tests)."""
    hashed = [shingle_hash([ord(c) for c in token]) for token in tokens(text)]
    found = []
    for i in range(len(hashed) - n + 1):
        h = 0
        for token in hashed[i:i + n]:
            h = (h * NGRAM_BASE + token) & MASK64
        found.append(mix64(h))
    return found
