"""Bulk encoding through tiktoken's BPE core when it gives a tokenizer's exact ids.

Which tokenizers convert, and how "exact" is checked (`tiktoken_ranks`, then both engines on the
first CHECK_TEXTS texts, falling back for good and saying why in `FastEncoder.reason`):
docs/tokenizer-and-pack.md. tiktoken encodes ~2.4x faster than `tokenizers` on one thread (3,000
GSM8K chats, Qwen vocabulary: 0.25 s against 0.60 s), because it tracks no offsets, alignments or
normalization; it merges by the rank of the result, hence merges must be ranked in merge order.

Offsets: tiktoken gives none, but every token's bytes are known, so a token's character span
is a cumulative sum over tokens of the characters that start in each (its UTF-8 lead bytes),
with the rule `tokenizers` follows: a token holding part of a character spans the whole
character. Callers see one kind of offsets whichever engine ran, and no pass over the text's
bytes is needed.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from fuelline.tokenizer.tiktoken_convert import byte_alphabet

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
CHECK_TEXTS = 256  # texts of the first batch encoded by both engines
# The byte-level patterns end with a whitespace run: all of it but its last character when a non-space follows
# (the lookahead), else all of it. Without the lookahead, tiktoken's regex needs no backtracking engine and
# encodes poems a third faster (0.23 s against 0.34 s for 48k), and the two split any text alike that has no two
# whitespace characters in a row: a run of one is matched whole by both. Python's \s holds every character the
# regex's \s does (Unicode White_Space), so a text TWO_SPACES does not find is such a text.
WHITESPACE_TAIL, WHITESPACE_TAIL_WITHOUT_LOOKAHEAD = r"|\s+(?!\S)|\s+", r"|\s+"
TWO_SPACES = re.compile(r"\s\s")
ENGINE_ENV = "FUELLINE_ENCODER"  # "tokenizers": never tiktoken (to compare, or to rule it out)


def tiktoken_ranks(tokenizer) -> tuple[dict, dict[bytes, int], dict[str, int]] | str:
    """(pattern, ranks, special tokens) for tiktoken, or the reason the tokenizer does not convert."""
    spec = json.loads(tokenizer.to_str())
    if spec.get("normalizer") is not None:
        return f"it has a normalizer ({spec['normalizer'].get('type')}), which tiktoken does not apply"
    pattern = _byte_level_pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        return "its pre-tokenizer is not ByteLevel, alone or after one Split(regex)"
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("dropout"):
        return "its model is not a plain byte-level BPE (type, byte fallback or dropout)"
    decode = {c: b for b, c in enumerate(byte_alphabet())}
    try:
        ranks = {bytes(decode[c] for c in token): rank for token, rank in model["vocab"].items()}
    except KeyError:
        return "its vocabulary has characters outside the byte-level alphabet"
    if any(bytes([b]) not in ranks for b in range(256)):
        return "its vocabulary lacks some of the 256 single bytes"
    merged = [model["vocab"].get(m[0] + m[1] if isinstance(m, list) else m.replace(" ", "", 1))
              for m in model["merges"]]
    if any(r is None for r in merged) or any(b <= a for a, b in zip(merged, merged[1:])):
        return "its merges do not produce tokens ranked in merge order"
    added = spec.get("added_tokens", [])
    if any(t.get(flag) for t in added for flag in ("lstrip", "rstrip", "single_word")):
        return "an added token strips spaces or matches whole words only"
    return pattern, ranks, {t["content"]: t["id"] for t in added}


def _byte_level_pattern(pre: dict | None) -> str | None:
    if pre is None:
        return None
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    if steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    if len(steps) == 1:
        return GPT2_PATTERN if steps[0].get("use_regex", True) else None
    split = steps[0]
    if (len(steps) != 2 or split.get("type") != "Split" or steps[-1].get("use_regex")
            or split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in split.get("pattern", {})):
        return None
    return split["pattern"]["Regex"]


def joining_separator(special: dict[str, int]) -> tuple[str, int] | None:
    """A special token (text, id) that texts can be joined with and encoded as one, or None.

    tiktoken finds the special tokens first (leftmost match) and encodes the text between two
    with its regex and BPE alone, so texts joined with a separator encode to their own ids with
    the separator's id between them, provided no special-token match can cross a separator: no
    special token (the separator included) may have a proper suffix that starts the separator
    or contains it, and none may start with the separator or be its prefix. A text holding the
    separator itself shows as one id too many and is encoded on its own (`_encode_tiktoken`).
    """
    for separator, separator_id in special.items():
        crosses = any(separator.startswith(token[i:]) or token[i:].startswith(separator)
                      for token in special for i in range(1, len(token)))
        overlaps = any(token != separator and (token.startswith(separator) or separator.startswith(token))
                       for token in special)
        if not crosses and not overlaps:
            return separator, separator_id
    return None


@dataclass(frozen=True)
class EncodedBatch:
    """Texts encoded back to back: `ids` (int32), tokens per text (`counts`), where each text starts
    in the texts joined end to end (`text_starts`, characters) and, when asked for, each token's
    character (start, end) in that joined text (`offsets`, int64 [n, 2])."""

    ids: np.ndarray
    counts: np.ndarray
    text_starts: np.ndarray
    offsets: np.ndarray | None = None

    def split(self) -> list:
        """Per text: ids, or (ids, offsets relative to the text's start)."""
        if not len(self.counts):
            return []
        ends = np.cumsum(self.counts).tolist()
        spans = list(zip([0, *ends[:-1]], ends))
        ids = [self.ids[a:b] for a, b in spans]  # slices: several times faster than np.split
        if self.offsets is None:
            return ids
        offsets = self.offsets_in_texts()
        return list(zip(ids, [offsets[a:b] for a, b in spans]))

    def offsets_in_texts(self) -> np.ndarray:
        """`offsets` with each token's text's start subtracted: positions in its own text."""
        return self.offsets - np.repeat(self.text_starts, self.counts)[:, None]


class FastEncoder:
    """Encodes texts (ids, and character offsets on request) with tiktoken or, failing that, `tokenizers`.

    Added tokens are recognized in the text, as `encode(..., add_special_tokens=False)` does.
    Threads: `threads`, else RAYON_NUM_THREADS (what `tokenizers` obeys), else every core.
    FUELLINE_ENCODER=tokenizers in the environment turns tiktoken off.
    """

    def __init__(self, tokenizer, threads: int | None = None):
        self.tokenizer = tokenizer
        self.threads = threads or int(os.environ.get("RAYON_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
        self._tiktoken, self._checked = None, False
        if os.environ.get(ENGINE_ENV) == "tokenizers":
            converted = f"tokenizers: {ENGINE_ENV}=tokenizers"
        elif isinstance(converted := tiktoken_ranks(tokenizer), str):
            converted = f"tokenizers: the tokenizer does not convert to tiktoken ({converted})"
        if isinstance(converted, str):
            self.reason, self._checked = converted, True
            return
        import tiktoken

        pattern, ranks, special = converted
        self._tiktoken = tiktoken.Encoding("fuelline", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
        self._without_lookahead = None  # built at first use: chat texts never need it
        if pattern.endswith(WHITESPACE_TAIL):
            self._without_lookahead = functools.partial(
                tiktoken.Encoding, "fuelline-without-lookahead", mergeable_ranks=ranks, special_tokens=special,
                pat_str=pattern[:-len(WHITESPACE_TAIL)] + WHITESPACE_TAIL_WITHOUT_LOOKAHEAD)
        self._allowed = set(special)
        self._special_starts = tuple(special)  # empty: no text is known to start a split, none is joined
        self._separator = joining_separator(special)
        # per id: the characters that start in the token (its lead bytes), and whether its first byte is one
        self._lead_bytes = np.zeros(max([*ranks.values(), *special.values()]) + 1, dtype=np.int64)
        self._starts_a_character = np.zeros(len(self._lead_bytes), dtype=np.int64)
        for token, rank in [*ranks.items(), *((c.encode(), r) for c, r in special.items())]:
            self._lead_bytes[rank] = sum((b & 0xC0) != 0x80 for b in token)
            self._starts_a_character[rank] = (token[0] & 0xC0) != 0x80
        self.reason = "tiktoken"

    @property
    def engine(self) -> str:
        return "tiktoken" if self._tiktoken is not None else "tokenizers"

    def encode(self, texts: Sequence[str], offsets: bool = False) -> list:
        """Per text: ids (int32), or (ids, offsets: int64 [n, 2] character start and end) with `offsets`."""
        return self.encode_batch(texts, offsets).split()

    def encode_batch(self, texts: Sequence[str], offsets: bool = False) -> EncodedBatch:
        """The texts' tokens back to back: one array each, so callers work per batch, not per text.

        With one thread, the caller's own thread encodes: nothing else runs meanwhile, and tiktoken
        runs ~20% faster on the thread that first used it (its regex's caches have a fast path for
        their first thread, `_check`'s here) than on a pool's (48k poems: 0.37 s of CPU against 0.45 s).
        """
        if self.threads > 1:
            return next(self.encode_batches([(None, texts)], offsets))[1]
        self._check_once(texts)
        return self._collect(None, texts, self._submit(_InCallerThread(), texts, offsets), offsets)[1]

    def encode_batches(self, batches: Iterable[tuple[Any, Sequence[str]]],
                       offsets: bool = False) -> Iterator[tuple[Any, EncodedBatch]]:
        """(key, encoding) for each (key, texts) of `batches`, in order.

        While one batch encodes on the threads, the next is taken from `batches`: a caller that
        makes its texts lazily (rendering them) makes them on its own thread meanwhile, and
        works on a batch it was given while the next one encodes.
        """
        with ThreadPoolExecutor(self.threads) as pool:  # tiktoken and tokenizers release the GIL while they encode
            pending: deque = deque()
            for key, texts in batches:
                self._check_once(texts)
                pending.append((key, texts, self._submit(pool, texts, offsets)))
                if len(pending) > 1:
                    yield self._collect(*pending.popleft(), offsets)
            while pending:
                yield self._collect(*pending.popleft(), offsets)

    def _check_once(self, texts: Sequence[str]) -> None:
        if self._tiktoken is not None and not self._checked:
            self._check(texts[:CHECK_TEXTS])

    def _submit(self, pool: ThreadPoolExecutor | _InCallerThread, texts: Sequence[str], offsets: bool) -> list[Future]:
        if self._tiktoken is None:
            return [pool.submit(self._encode_tokenizers, texts, offsets)]
        # one piece per thread, of about equal characters (conversation lengths vary a hundredfold)
        ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
        cuts = np.searchsorted(ends, ends[-1] * np.arange(1, self.threads) / self.threads) + 1 if len(texts) else []
        bounds = [0, *sorted(set(int(c) for c in cuts if 0 < c < len(texts))), len(texts)]
        return [pool.submit(self._encode_tiktoken, texts[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]

    def _collect(self, key: Any, texts: Sequence[str], futures: list[Future], offsets: bool) -> tuple[Any, EncodedBatch]:
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        text_starts = np.cumsum(lengths) - lengths
        parts = [future.result() for future in futures]
        if self._tiktoken is None:
            ids, counts, spans = parts[0]
            if spans is not None:
                spans += np.repeat(text_starts, counts)[:, None]
            return key, EncodedBatch(ids, counts, text_starts, spans)
        ids = np.concatenate([p[0] for p in parts]).astype(np.int32) if parts else np.zeros(0, np.int32)
        counts = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        return key, EncodedBatch(ids, counts, text_starts, self._offsets(ids) if offsets else None)

    def _encode_tiktoken(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids back to back (uint32) and tokens per text.

        Texts that each start with a special token are encoded joined, in one call: tiktoken
        cuts its input at special tokens before anything else, so no token can span two of
        them, and one call costs far less than one per text (the GIL is taken once, not once
        per conversation). Each text's first token is then the first one starting at or after
        the text's first character. Other texts are joined with a special token between them
        (`joining_separator`) and cut where its id lands: 48k poems encode in 0.36 s instead of
        0.57 s, 48k titles in 0.04 s instead of 0.19 s (one call and one array per text cost
        more than encoding a title); without the lookahead when no two spaces are in a row
        (WHITESPACE_TAIL).
        """
        encode, allowed = self._tiktoken.encode_to_numpy, self._allowed
        if len(texts) > 1 and all(text.startswith(self._special_starts) for text in texts[1:]):
            ids = encode("".join(texts), allowed_special=allowed)
            lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
            firsts = np.searchsorted(self._offsets(ids)[:, 0], np.cumsum(lengths) - lengths)
            return ids, np.diff(np.append(firsts, len(ids)))
        if len(texts) > 1 and self._separator is not None:
            separator, separator_id = self._separator
            joined = separator.join(texts)
            ids = self._encoder_for(joined).encode_to_numpy(joined, allowed_special=allowed)
            cuts = np.flatnonzero(ids == separator_id)
            if len(cuts) == len(texts) - 1:  # more: a text holds the separator itself, so go text by text
                return np.delete(ids, cuts), np.diff(cuts, prepend=-1, append=len(ids)) - 1
        arrays = [encode(text, allowed_special=allowed) for text in texts]
        counts = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        return (np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)), counts

    def _encoder_for(self, text: str):
        """The tiktoken encoding without the whitespace lookahead where it splits `text` alike, else the exact one."""
        if self._without_lookahead is None or TWO_SPACES.search(text):
            return self._tiktoken
        if isinstance(self._without_lookahead, functools.partial):
            self._without_lookahead = self._without_lookahead()
        return self._without_lookahead

    def _encode_tokenizers(self, texts: Sequence[str], offsets: bool):
        """ids, tokens per text and (with `offsets`) each token's offsets in its own text."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        total = int(counts.sum())
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=total)
        spans = None
        if offsets:
            flat = itertools.chain.from_iterable(x for e in encodings for x in e.offsets)
            spans = np.fromiter(flat, dtype=np.int64, count=2 * total).reshape(-1, 2)
        return ids, counts, spans

    def _offsets(self, ids: np.ndarray) -> np.ndarray:
        """Character (start, end) of each token of a text encoded as `ids`.

        A token ends after the characters started in it and those before; it starts at the
        character its first byte belongs to (the one before, when that byte continues it).
        """
        leads = self._lead_bytes[ids]
        ends = np.cumsum(leads)
        return np.stack([ends - leads + self._starts_a_character[ids] - 1, ends], axis=1)

    def _check(self, texts: Sequence[str]) -> None:
        """Compare both engines on `texts`; on any difference, use `tokenizers` from now on."""
        self._checked = True
        reference = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for k, (text, expected) in enumerate(zip(texts, reference)):
            if self._encode_tiktoken([text])[0].tolist() != expected.ids:
                self._tiktoken = None
                self.reason = (f"tokenizers: tiktoken's ids differed from the tokenizer's on text {k} of the first "
                               f"batch, so the tokenizer's own encoder is used")
                return
        ids, counts = self._encode_tiktoken(texts)  # joined, as batches are encoded
        if (counts.tolist() != [len(e.ids) for e in reference]
                or ids.tolist() != [i for e in reference for i in e.ids]):
            self._tiktoken = None
            self.reason = ("tokenizers: tiktoken's ids of the first batch's texts encoded joined differed from the "
                           "tokenizer's, so the tokenizer's own encoder is used")


class _InCallerThread:
    """An executor whose `submit` runs the call at once, in the caller's thread."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future


_encoders: dict[int, tuple[object, FastEncoder]] = {}


def fast_encoder(tokenizer) -> FastEncoder:
    """The tokenizer's `FastEncoder`, built (and checked against the tokenizer) once per tokenizer object."""
    cached = _encoders.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:  # the reference held keeps ids from being reused
        cached = _encoders[id(tokenizer)] = (tokenizer, FastEncoder(tokenizer))
    return cached[1]
