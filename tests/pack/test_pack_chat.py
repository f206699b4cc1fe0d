"""SFT packing: chat records into the token dataset format, with exactly encode_chat's ids and mask."""

import itertools

import numpy as np
import orjson
import pytest
import torch
from click.testing import CliRunner

from fuelline.chat.encode import encode_chats
from fuelline.chat.prepare import ChatPrepareStage
from fuelline.cli import main
from fuelline.formats.tokens import TokenFiles, verify_token_dataset
from fuelline.io import read_records
from fuelline.loader.dataset import IGNORE_INDEX, TokenDataset
from fuelline.pack.packer import PackConfig, pack
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.records import unit_interval

from ..conftest import shared_file


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """The ShareGPT file and GSM8K's first 500 questions through chat-prepare (train split): long
    conversations of many exchanges, and short ones of one (the other 6,973 are more of the same)."""
    base = tmp_path_factory.mktemp("chats")
    gsm8k = base / "gsm8k.jsonl"
    gsm8k.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in
                               itertools.islice(read_records(shared_file("chat/gsm8k-train.jsonl.zst")), 500)))
    out = base / "prepared"
    run_stage(ChatPrepareStage(), [shared_file("chat/sharegpt_zh_1K.jsonl.zst"), gsm8k], out,
              RunOptions(workers=1, shard_size=3_000, progress=False))
    return out


@pytest.fixture(scope="module")
def qwen3_pack(chats, qwen_dir, tmp_path_factory):
    """The chats packed with the qwen3 template by two workers: (output directory, stats), read only."""
    out = tmp_path_factory.mktemp("sft") / "out"
    stats = pack([chats], qwen_dir, out, PackConfig(template="chat", chat_template="qwen3"), workers=2,
                 progress=False, shard_size=1_000)
    return out, stats


def documents(split_dir):
    files = TokenFiles(split_dir)
    return [files.document(k) for k in range(files.num_documents)]


def test_packed_chats_are_encode_chat_exactly(qwen3_pack, chats, qwen_dir):
    out, stats = qwen3_pack
    for split in ("train", "val"):
        verify_token_dataset(out / split)
    records = {r["id"]: r for r in read_records(chats)}
    assert stats["records_in"] == len(records) == stats["records_out"] and stats["dropped"] == {}
    val_fraction = stats["splits"]["val"]["documents"] / len(records)
    assert 0.03 < val_fraction < 0.07
    expected = encode_chats(list(records.values()), qwen_dir, "qwen3", max_length=4096)  # pack's default, the cache's
    is_val = [unit_interval(42, "split", rid) < 0.05 for rid in records]
    for split, wanted in (("train", False), ("val", True)):
        packed = documents(out / split)
        reference = [e for e, v in zip(expected, is_val) if v == wanted]  # input order is kept
        assert len(packed) == len(reference) == stats["splits"][split]["documents"]
        for (ids, mask), encoded in zip(packed, reference):
            assert np.array_equal(ids, encoded.input_ids) and np.array_equal(mask, encoded.loss_mask)
        assert sum(int(m.sum()) for _, m in packed) == stats["splits"][split]["supervised_tokens"]


def test_document_aware_batches_supervise_only_assistant_tokens(qwen3_pack):
    out, _ = qwen3_pack
    dataset = TokenDataset(out / "train", seq_len=512, document_aware=True)
    batch = dataset.__getitems__(list(range(8)))
    labels, ids = batch["labels"], batch["input_ids"]
    supervised = labels != IGNORE_INDEX
    assert torch.equal(labels[supervised], ids[supervised])  # aligned, never shifted
    im_start, im_end = 151644, 151645  # Qwen's <|im_start|> and <|im_end|>
    assert not supervised[ids == im_start].any()
    assert supervised[ids == im_end].float().mean() == pytest.approx(0.5, abs=0.1)  # ends of assistant turns only
    assert (batch["position_ids"] == 0).sum() > 8  # documents restart positions inside windows


def test_long_conversations_are_truncated_or_dropped_and_counted(chats, qwen_dir, tmp_path):
    # the first 300 chats, ShareGPT's (many of several exchanges): enough to cut some and drop some
    source = tmp_path / "sharegpt.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in itertools.islice(read_records(chats), 300)))
    stats = pack([source], qwen_dir, tmp_path / "short",
                 PackConfig(template="chat", chat_template="chatml", max_length=256), workers=1, progress=False)
    assert stats["dropped"]["too_long"] > 0 and stats["counters"]["truncated"] > 0
    assert stats["records_in"] == stats["records_out"] + sum(stats["dropped"].values())
    files = TokenFiles(tmp_path / "short" / "train")
    lengths = np.diff(files.offsets.astype(np.int64))
    assert lengths.max() <= 256


def test_from_poetry_records_pack_with_a_trained_tokenizer(poems, tokenizer_dir, tmp_path):
    from fuelline.chat.from_poetry import ChatFromPoetryStage

    run_stage(ChatFromPoetryStage(), [poems[0]], tmp_path / "sft-records", RunOptions(workers=1, progress=False))
    stats = pack([tmp_path / "sft-records"], tokenizer_dir, tmp_path / "sft",
                 PackConfig(template="chat", chat_template="chatml"), workers=1, progress=False)
    assert stats["records_out"] == 2 * len(poems[1]) and stats["splits"]["train"]["supervised_share"] > 0.3
    ids, mask = TokenFiles(tmp_path / "sft" / "train").document(0)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    answer = tokenizer.decode(ids[mask].tolist(), skip_special_tokens=False)
    assert answer.endswith("<|im_end|>") and "<|im_start|>" not in answer


def test_chat_template_needs_its_end_of_turn_token(poems, tmp_path):
    from tokenizers import Tokenizer, models

    plain = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    (tmp_path / "tok").mkdir()
    plain.save(str(tmp_path / "tok" / "tokenizer.json"))
    with pytest.raises(ValueError, match="no single-id token for '<\\|im_end\\|>'"):
        pack([poems[0]], tmp_path / "tok", tmp_path / "out", PackConfig(template="chat", chat_template="chatml"),
             workers=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_document_records_are_refused_by_the_chat_template_with_file_and_line(poems, qwen_dir, tmp_path):
    result = CliRunner().invoke(main, ["pack", "-i", str(poems[0]), "--tokenizer", str(qwen_dir), "-o",
                                       str(tmp_path / "out"), "--template", "chat", "--chat-template", "chatml",
                                       "-q", "-w", "1"])
    assert result.exit_code == 2 and f"{poems[0]}:1: expected a chat record" in result.stderr
    assert "Traceback" not in result.stderr


def test_tool_records_pack_with_their_tools_and_the_supervision_options(qwen_dir, tmp_path):
    """Records with tools and reasoning are packed whole (their `tools` reach the template), and
    `reasoning`/`train_turns` given in a pipeline file reach the mask."""
    from fuelline.pipeline.config import load_pipeline, run_pipeline

    from ..chat.tool_conversations import CONVERSATIONS, TOOLS

    records = [{"id": name, "conversations": turns, "tools": TOOLS} for name, turns in CONVERSATIONS.items()]
    source = tmp_path / "tools.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[defaults]\nworkers = 1\n[[step]]\nuse = "pack"\ntokenizer = "{qwen_dir}"\ntemplate = "chat"\n'
                        'chat_template = "qwen3"\nval_fraction = 0.0\nreasoning = "drop"\ntrain_turns = "last"\n')
    stats = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(source)], progress=False)[0]
    assert stats["records_out"] == len(records)
    packed = documents(tmp_path / "run" / "01-pack" / "train")
    expected = encode_chats(records, qwen_dir, "qwen3", reasoning="drop", train_turns="last")
    default = encode_chats(records, qwen_dir, "qwen3")
    for (ids, mask), want in zip(packed, expected, strict=True):
        assert np.array_equal(ids, want.input_ids) and np.array_equal(mask, want.loss_mask)
    from fuelline.chat.encode import load_tokenizer

    text = load_tokenizer(qwen_dir).tokenizer.decode(packed[0][0].tolist(), skip_special_tokens=False)
    assert "<tools>" in text and '"get_weather"' in text
    assert any(not np.array_equal(m, d.loss_mask) for (_, m), d in zip(packed, default))  # the options changed it


def test_tool_records_on_a_served_template_without_generation_blocks(qwen_dir, tmp_path):
    """Issue 38: tool-call records packed with the model's own template (Hermes', no generation blocks,
    `--chat-template auto`): every conversation kept, each masked as transformers masks the template's
    twin with `{% generation %}` blocks."""
    import transformers

    from ..chat.tool_conversations import CONVERSATIONS, TOOLS
    from ..chat.tool_template_families import FAMILIES, family_dirs

    hermes = family_dirs(qwen_dir, tmp_path / "families")["hermes"]
    records = [{"id": name, "conversations": turns, "tools": TOOLS} for name, turns in CONVERSATIONS.items()]
    source = tmp_path / "tools.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    result = CliRunner().invoke(main, ["pack", "-i", str(source), "--tokenizer", str(hermes), "-o", str(tmp_path / "out"),
                                       "--template", "chat", "--chat-template", "auto", "--val-fraction", "0",
                                       "--reasoning", "keep", "-q", "-w", "1"])
    assert result.exit_code == 0, result.output
    packed = documents(tmp_path / "out" / "train")
    assert len(packed) == len(records)
    hf = transformers.AutoTokenizer.from_pretrained(hermes, local_files_only=True)
    twins = {tuple(out["input_ids"]): out["assistant_masks"] for out in (
        hf.apply_chat_template(r["conversations"], tools=TOOLS, chat_template=FAMILIES["hermes"].variant,
                               tokenize=True, return_dict=True, return_assistant_tokens_mask=True) for r in records)}
    for ids, mask in packed:  # the pack's order is its own: each document is matched by its ids
        assert mask.astype(int).tolist() == twins[tuple(ids.tolist())]
    assert sum(int(m.sum()) for _, m in packed) > 0
