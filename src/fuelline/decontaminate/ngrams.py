"""The n-grams decontamination compares: what a text may go through and still be "the same prompt".

A text is NFKC-normalized and case-folded, then cut into tokens: a run of letters and digits of a
script written with spaces is a word, and every Han, kana or hangul character is a token of its
own (those scripts put no spaces between words); everything else (spaces, newlines, punctuation,
symbols) only separates tokens. So "Natalia sold clips to 48 of her friends" and "natalia  sold
CLIPS, to 48 of her friends!" give the same tokens, and mixed text ("用 Python 写一个函数") is one
sequence of words and characters. An n-gram is n tokens in a row, hashed to 64 bits.

The hashes: a token is the FNV-style fold of its code points, an n-gram the fold of its n token
hashes, each finished by splitmix64 (`fuelline.dedup.minhash.hash_symbols`, the same bits as its
plain-Python `shingle_hash`, which `reference_ngrams` uses). One batch of texts is one encode,
one table look-up per character for its class, and one numba pass: ~100 MB of text a second on
one core, where splitting and joining words in Python is ~5 MB/s (benchmarks/bench_decontaminate.py).
"""

from __future__ import annotations

import unicodedata

import numpy as np
from numba import njit

from fuelline.dedup.minhash import hash_symbols, shingle_hash
from fuelline.text import cjk_characters, word_characters

SEPARATOR, WORD, CJK = 0, 1, 2  # the class of a character


def fold(text: str) -> str:
    """NFKC (full-width letters and digits, ligatures, compatibility ideographs) and case folding."""
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return text.casefold()


def _classes(code_points: np.ndarray) -> np.ndarray:
    kinds = word_characters(code_points).astype(np.uint8)
    kinds[cjk_characters(code_points)] = CJK
    return kinds


@njit(cache=True)
def _ngram_kernel(code_points, kinds, offsets, n, tokens, out, out_offsets):
    """Every text's n-gram hashes into `out`, text d's at [out_offsets[d], out_offsets[d + 1])."""
    total = 0
    for d in range(offsets.shape[0] - 1):
        count, i, end = 0, offsets[d], offsets[d + 1]
        while i < end:
            kind = kinds[i]
            if kind == SEPARATOR:
                i += 1
                continue
            j = i + 1
            if kind == WORD:
                while j < end and kinds[j] == WORD:
                    j += 1
            tokens[count] = hash_symbols(code_points, i, j - i)
            count += 1
            i = j
        out_offsets[d] = total
        for t in range(count - n + 1):
            out[total] = hash_symbols(tokens, t, n)
            total += 1
    out_offsets[offsets.shape[0] - 1] = total


def ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the n-gram hashes of every text back to back, uint64; offsets, int64): text i's n-grams are
    `hashes[offsets[i]:offsets[i + 1]]`, in order, repeats kept. A text of fewer than n tokens has none."""
    folded = [fold(text) for text in texts]
    offsets = np.zeros(len(folded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, folded), dtype=np.int64, count=len(folded)), out=offsets[1:])
    code_points = np.frombuffer("".join(folded).encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    tokens = np.empty(len(code_points), dtype=np.uint64)  # a text has at most one token per character
    hashes = np.empty(len(code_points), dtype=np.uint64)
    out_offsets = np.empty(len(folded) + 1, dtype=np.int64)
    _ngram_kernel(code_points, _classes(code_points), offsets, n, tokens, hashes, out_offsets)
    return hashes[:out_offsets[-1]].copy(), out_offsets


def tokens(text: str) -> list[str]:
    """The tokens of one text, the plain way (for tests and messages): words and CJK characters."""
    found, word = [], []
    for c in fold(text):
        kind = CJK if cjk_characters(np.array([ord(c)], dtype=np.uint32))[0] else WORD if c.isalnum() else SEPARATOR
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
    return [shingle_hash(hashed[i:i + n]) for i in range(len(hashed) - n + 1)]
