"""Byte-level BPE training on document text (never on metadata), saved for `AutoTokenizer`.

Pre-tokenization decides both training time and what the vocabulary can hold. The GPT-2
regex keeps a run of Han characters (a whole clause of a poem) as one pre-token, so the
trainer counts millions of distinct long clauses: 140 s on the poetry corpus. fuelline's
default, `han-chars`, isolates every Han character first: merges then only assemble the 3
UTF-8 bytes of a character, the trainer sees ~10k distinct pre-tokens, trains in ~16 s, and the
4,096-entry vocabulary holds the ~3,800 most frequent characters whole (rarer ones fall back to
byte pieces, so nothing is ever unknown). Multi-character words are left to the model; with a
vocabulary this small they would crowd out single characters anyway. `han-pairs` allows
two-character tokens (aligned from the start of each run), `bytelevel` is the GPT-2 behavior.
"""

from __future__ import annotations

import os
import time
import unicodedata
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson

from fuelline.fingerprints import tokenizer_fingerprint
from fuelline.records import record_kind
from fuelline.io import expand_inputs, iter_file_records
from fuelline.io.readers import RecordError
from fuelline.io.atomic import write_bytes_atomic
from fuelline.tokenizer.fast import fast_encoder

# The poetry template's markers, then ChatML's, so the same tokenizer packs poetry instruction data
# (`fuelline chat from-poetry`, `pack --template chat --chat-template chatml`) with single-id markers.
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|title|>", "<|author|>", "<|dynasty|>", "<|content|>",
                  "<|im_start|>", "<|im_end|>"]
# GPT-2's pre-tokenization pattern with Han characters carved out of \p{L} and matched first,
# as one regex: splitting Han first and then running ByteLevel's own regex on every piece gives
# the same pieces but encodes ~40% slower.
GPT2_REST = r"'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}&&[^\p{Han}]]+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 257  # the special tokens, the 256 bytes and one merge
PRETOKENIZE = {"han-chars": r"\p{Han}|" + GPT2_REST, "han-pairs": r"\p{Han}{1,2}|" + GPT2_REST, "bytelevel": None}
REPORT_SAMPLE = 50_000
# tokenizer.json and what `AutoTokenizer.from_pretrained` looks for beside it (`save_for_transformers`)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TRAINING_REPORT = "training_report.json"


def build_tokenizer(pretokenize: str = "han-chars"):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if pretokenize not in PRETOKENIZE:
        raise ValueError(f"pretokenize must be one of {', '.join(PRETOKENIZE)}, not {pretokenize!r}")
    tokenizer = Tokenizer(models.BPE())
    pattern = PRETOKENIZE[pretokenize]
    if pattern:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def document_texts(inputs, text_key: str = "text") -> Iterator[str]:
    """The non-empty texts of document records; any other record (a chat record, an eval record)
    is a RecordError naming it, since training on no text would leave a useless tokenizer."""
    for path in expand_inputs(inputs):
        for line, record in iter_file_records(path):
            text = record.get(text_key)
            if not isinstance(text, str):
                raise RecordError(path, line, f"expected a document record with a string {text_key!r}, found "
                                              f"{record_kind(record)}; tokenizer train reads document records "
                                              f"(the output of ingest or clean)")
            if text:
                yield text


def save_for_transformers(tokenizer, directory: Path, model_max_length: int = 1 << 20) -> None:
    """tokenizer.json plus the two small files `AutoTokenizer.from_pretrained` looks for."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_json, config_json, specials_json = (directory / name for name in TOKENIZER_FILES)
    write_bytes_atomic(tokenizer_json, tokenizer.to_str(pretty=False).encode())
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                "additional_special_tokens": SPECIAL_TOKENS[3:]}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False, **specials}
    write_bytes_atomic(config_json, orjson.dumps(config, option=orjson.OPT_INDENT_2))
    write_bytes_atomic(specials_json, orjson.dumps(specials, option=orjson.OPT_INDENT_2))


def is_punctuation(text: str) -> bool:
    return len(text) == 1 and unicodedata.category(text).startswith("P")


def punctuation_report(tokenizer, texts: list[str], ids: np.ndarray) -> dict:
    """How many punctuation marks (Unicode category P*) of `texts` (encoded: `ids`) are a token of their own.

    A mark inside a multi-character token (`。\n`, `，「`) is not isolated, and neither is one
    split into byte pieces; a model then has to learn each such combination separately.
    """
    alone = [i for i in range(tokenizer.get_vocab_size()) if is_punctuation(tokenizer.decode([i]))]
    marks = sum(1 for text in texts for char in text if is_punctuation(char))
    isolated = int(np.isin(ids, alone).sum())
    return {"punctuation_marks": marks, "isolated": isolated, "isolated_share": round(isolated / max(1, marks), 4)}


def train_tokenizer(inputs, output_dir: str | os.PathLike, *, vocab_size: int = 4096,
                    pretokenize: str = "han-chars", min_frequency: int = 2, text_key: str = "text") -> dict:
    """Train on the `text` of document records; write the tokenizer and `training_report.json`."""
    from tokenizers import pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (special tokens, the 256 bytes, one merge)")
    tokenizer = build_tokenizer(pretokenize)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    started = time.perf_counter()
    documents = 0

    def counted() -> Iterator[str]:
        nonlocal documents
        for text in document_texts(inputs, text_key):
            documents += 1
            yield text

    tokenizer.train_from_iterator(counted(), trainer)
    if not documents:
        raise ValueError(f"no document of {', '.join(map(str, expand_inputs(inputs)))} has any text: nothing to train "
                         f"a tokenizer on")
    seconds = time.perf_counter() - started
    output = Path(output_dir)
    save_for_transformers(tokenizer, output)
    sample = [t for _, t in zip(range(REPORT_SAMPLE), document_texts(inputs, text_key))]
    ids = fast_encoder(tokenizer).encode_batch(sample).ids
    report = {
        "documents": documents, "vocab_size": tokenizer.get_vocab_size(), "pretokenize": pretokenize,
        "train_seconds": round(seconds, 2),
        "special_tokens": {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS},
        "sample_documents": len(sample),
        "tokens_per_char": round(len(ids) / max(1, sum(map(len, sample))), 4),
        **punctuation_report(tokenizer, sample, ids),
        "fingerprint": tokenizer_fingerprint(output),
        "warnings": [f"the vocabulary has {tokenizer.get_vocab_size():,} tokens, fewer than the {vocab_size:,} asked: "
                     f"{documents:,} documents hold no more merges of frequency ≥ {min_frequency}"]
                    if tokenizer.get_vocab_size() < vocab_size else [],
    }
    write_bytes_atomic(output / TRAINING_REPORT, orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return report
