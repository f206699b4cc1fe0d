"""The web profile: normalization, C4-style line rules and Gopher-style document rules.

Thresholds follow the published Gopher (Rae et al. 2021) and C4 (Raffel et al. 2020) rules,
with every count made CJK-aware through `text.words`: a line of Han characters has as many
words as characters, so Chinese pages are not dropped as "too few words".

The mean-word-length and stop-word rules judge the spaced words only (`text.is_spaced_word`:
English and other space-separated words, not Han characters, digits or punctuation). Counted
together with one-character Han words, the English of a bilingual page would pull the mean
under 3 and the page would be dropped though both halves are fine. The two rules apply once
spaced words are `min_spaced_word_share` (30%) of all words: an English page is judged as
before (its numbers and lone symbols no longer count in the mean), a Chinese one (0%) is not,
nor Chinese prose dotted with English terms such as PyTorch or GPU (~20%), which has no stop
words to find, while a page of English and Chinese sentences in turn (~35-40%) has its
English judged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fuelline.records import Drop
from fuelline.text import is_spaced_word, normalize_text, words

TERMINAL = tuple('.!?"”」』。！？…') + ("'",)
BULLETS = ("•", "·", "-", "*", "●", "▪", "–", "—", "►")
STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
C4_LINE_BANS = ("javascript", "cookie", "terms of use", "privacy policy")
C4_DOC_BANS = ("lorem ipsum",)


@dataclass(frozen=True)
class WebRules:
    min_chars: int = 50
    max_chars: int = 500_000
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_ratio: float = 0.1
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    min_spaced_word_share: float = 0.3
    min_stop_words: int = 2
    max_duplicate_lines: float = 0.3
    max_duplicate_line_chars: float = 0.2
    top_ngram_limits: tuple = ((2, 0.20), (3, 0.18), (4, 0.16))
    duplicate_ngram_limits: tuple = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    c4_min_line_words: int = 3
    c4_min_sentences: int = 3


def c4_lines(text: str, rules: WebRules) -> tuple[list[str], int]:
    """Lines C4 would keep: ending in terminal punctuation, long enough, no script warnings."""
    kept, removed = [], 0
    for line in text.split("\n"):
        lowered = line.lower()
        if (line.endswith(TERMINAL) and len(words(line)) >= rules.c4_min_line_words
                and not any(ban in lowered for ban in C4_LINE_BANS)):
            kept.append(line)
        elif line:
            removed += 1
    return kept, removed


def _duplicate_ngram_fraction(tokens: list[str], n: int, total_chars: int) -> float:
    """Share of characters inside n-grams that occur more than once (each character once)."""
    counts = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    covered = [False] * len(tokens)
    for i in range(len(tokens) - n + 1):
        if counts[tuple(tokens[i:i + n])] > 1:
            covered[i:i + n] = [True] * n
    return sum(len(t) for t, c in zip(tokens, covered) if c) / total_chars


def repetition_reason(text: str, tokens: list[str], rules: WebRules) -> str | None:
    lines = [line for line in text.split("\n") if line]
    line_counts = Counter(lines)
    duplicated = [line for line in lines if line_counts[line] > 1]
    if len(duplicated) / len(lines) > rules.max_duplicate_lines:
        return "duplicate_lines"
    if sum(map(len, duplicated)) / max(1, sum(map(len, lines))) > rules.max_duplicate_line_chars:
        return "duplicate_line_chars"
    total_chars = sum(map(len, tokens)) or 1
    for n, limit in rules.top_ngram_limits:
        grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        if grams:
            gram, count = grams.most_common(1)[0]
            if count > 1 and sum(map(len, gram)) * count / total_chars > limit:
                return f"top_{n}gram"
    for n, limit in rules.duplicate_ngram_limits:
        if len(tokens) >= n and _duplicate_ngram_fraction(tokens, n, total_chars) > limit:
            return f"duplicate_{n}gram"
    return None


def quality_reason(text: str, tokens: list[str], rules: WebRules) -> str | None:
    if not rules.min_words <= len(tokens) <= rules.max_words:
        return "word_count"
    spaced = [t for t in tokens if is_spaced_word(t)]
    if spaced and len(spaced) >= rules.min_spaced_word_share * len(tokens):
        mean_length = sum(map(len, spaced)) / len(spaced)
        if not rules.min_mean_word_length <= mean_length <= rules.max_mean_word_length:
            return "mean_word_length"
        if sum(1 for t in spaced if t.lower() in STOP_WORDS) < rules.min_stop_words:
            return "stop_words"
    if (text.count("#") + text.count("...") + text.count("…")) / len(tokens) > rules.max_symbol_ratio:
        return "symbol_ratio"
    lines = [line for line in text.split("\n") if line]
    if sum(line.startswith(BULLETS) for line in lines) / len(lines) > rules.max_bullet_lines:
        return "bullet_lines"
    if sum(line.endswith(("...", "…")) for line in lines) / len(lines) > rules.max_ellipsis_lines:
        return "ellipsis_lines"
    if sum(1 for t in tokens if any(c.isalpha() for c in t)) / len(tokens) < rules.min_alpha_words:
        return "alpha_words"
    return None


def clean_web_text(text: str, rules: WebRules) -> tuple[str | Drop, int]:
    """(clean text or Drop, number of lines removed by the C4 line rules)."""
    text = normalize_text(text)
    if any(ban in text.lower() for ban in C4_DOC_BANS):
        return Drop("lorem_ipsum"), 0
    lines, removed = c4_lines(text, rules)
    text = "\n".join(lines)
    if not text:
        return Drop("empty_after_line_rules"), removed
    if not rules.min_chars <= len(text) <= rules.max_chars:
        return Drop("char_count"), removed
    if len(lines) < rules.c4_min_sentences:
        return Drop("too_few_sentences"), removed
    tokens = words(text)
    reason = quality_reason(text, tokens, rules) or repetition_reason(text, tokens, rules)
    return (Drop(reason) if reason else text), removed
