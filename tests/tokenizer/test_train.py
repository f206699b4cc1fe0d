import random

import orjson
import pytest

from fuelline.tokenizer.train import SPECIAL_TOKENS, train_tokenizer

HAN = "山水风月花雪云雨春秋江湖天地日夜人心明清长远归来"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    rng = random.Random(0)
    base = tmp_path_factory.mktemp("tok")
    docs = [{"id": str(i), "text": "\n".join("".join(rng.choice(HAN) for _ in range(7)) + rng.choice("，。！？")
                                            for _ in range(4)),
             "meta": {"title": "QUUXMETAWORD " * 5}} for i in range(3_000)]
    docs.append({"id": "x", "text": "Latin text, digits 12345 and an emoji 🌸 survive byte-level BPE.", "meta": {}})
    source = base / "docs.jsonl"
    source.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    report = train_tokenizer(source, base / "tokenizer", vocab_size=512)
    return base / "tokenizer", docs, report


def test_auto_tokenizer_loads_it_with_single_id_special_tokens(trained):
    from transformers import AutoTokenizer

    directory, docs, report = trained
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert tokenizer.encode("<|title|>春<|content|>", add_special_tokens=False)[0] == 3
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert report["special_tokens"] == {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def test_no_text_is_unknown_and_everything_round_trips(trained):
    from tokenizers import Tokenizer

    directory, docs, _ = trained
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    texts = [d["text"] for d in docs]
    for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=False)):
        assert tokenizer.decode(encoding.ids) == text


def test_metadata_is_never_trained_on(trained):
    from tokenizers import Tokenizer

    directory, _, _ = trained
    vocab = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab()
    assert not any("QUUX" in token or "META" in token for token in vocab)  # 15,000 occurrences in meta


def test_report_counts_isolated_punctuation(trained):
    _, _, report = trained
    assert report["punctuation_marks"] == 3_000 * 4 + 3  # ，。！？ closing each line; "," "-" "." in the Latin one
    assert 0.0 < report["isolated_share"] <= 1.0
    assert report["tokens_per_char"] > 0


@pytest.mark.parametrize("record, found", [
    ({"id": "a", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
     "a chat record (conversations)"),
    ({"id": "a", "turns": ["hi"]}, "an eval record (turns)"),
])
def test_cli_refuses_records_that_are_not_documents(record, found, tmp_path):
    """Chat records used to train on 0 documents and exit 0, leaving a useless tokenizer."""
    from click.testing import CliRunner

    from fuelline.cli import main

    source = tmp_path / "chat.jsonl"
    source.write_bytes(orjson.dumps(record) + b"\n")
    result = CliRunner().invoke(main, ["tokenizer", "train", "-i", str(source), "-o", str(tmp_path / "tok")])
    assert result.exit_code == 2
    assert f"{source}:1: expected a document record with a string 'text', found {found}" in result.stderr
    assert not (tmp_path / "tok").exists()


def test_no_text_at_all_is_refused(tmp_path):
    source = tmp_path / "empty.jsonl"
    source.write_bytes(orjson.dumps({"id": "a", "text": ""}) + b"\n")
    with pytest.raises(ValueError, match="has any text: nothing to train"):
        train_tokenizer(source, tmp_path / "tok", vocab_size=300)
    assert not (tmp_path / "tok").exists()
