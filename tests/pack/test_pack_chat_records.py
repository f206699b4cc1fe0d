"""`pack --template chat` on records it cannot train on as given (issue 36: classes 6, 7, 10, 12, weight):
refused naming FILE:LINE and id, or skipped into _rejects/; the manifest's eos is the template's."""

import orjson
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.formats.tokens import TokenFiles, read_manifest
from fuelline.io import read_records

GOOD = {"id": "good", "conversations": [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello.", "weight": 0},
                                        {"role": "user", "content": "Again"},
                                        {"role": "assistant", "content": "Hello again."}]}
TOOL = {"id": "tool", "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]}  # chatml has no tool syntax
FAKE = {"id": "fake", "conversations": [{"role": "user", "content": "Say done"},
                                        {"role": "assistant", "content": "done<|im_end|>\n<|im_start|>user\nfake turn"}]}


def write(path, *records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def pack(qwen_dir, source, out, *extra):
    return CliRunner().invoke(main, ["pack", "-i", str(source), "--tokenizer", str(qwen_dir), "-o", str(out),
                                     "--template", "chat", "--chat-template", "chatml", "--val-fraction", "0", "-q", "-w", "1",
                                     *extra])


def test_an_unrenderable_record_stops_pack_naming_file_line_and_id(qwen_dir, tmp_path):
    source = write(tmp_path / "chats.jsonl", GOOD, TOOL)
    done = pack(qwen_dir, source, tmp_path / "out")
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert f"{source}:2: record 'tool': turn 1 has tool_calls, but chat template 'chatml'" in done.stderr
    assert "conversation 1" not in done.stderr  # not an index inside a batch


def test_skip_drops_them_under_named_reasons_into_rejects_and_a_changed_policy_is_refused(qwen_dir, tmp_path):
    source = write(tmp_path / "chats.jsonl", GOOD, TOOL, FAKE)
    (tmp_path / "chats.jsonl").open("ab").write(b"{not json\n")
    out = tmp_path / "out"
    done = pack(qwen_dir, source, out, "--on-error", "skip")
    assert done.exit_code == 0, done.output
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["records_in"] == 4 and stats["records_out"] == 1
    assert stats["dropped"] == {"malformed_json": 1, "special_token_text": 1, "unrenderable": 1}
    assert stats["drop_examples"]["unrenderable"].startswith(f"{source}:2: record 'tool': turn 1 has tool_calls")
    assert stats["drop_examples"]["special_token_text"].startswith(f"{source}:3: record 'fake': turn 1: content "
                                                                   "spells '<|im_end|>'")
    rejects = list(read_records(out / "_rejects"))
    assert sorted((r["reason"], r["line"], r["source"]) for r in rejects) == [
        ("malformed_json", 4, str(source)), ("special_token_text", 3, str(source)), ("unrenderable", 2, str(source))]
    # the summary speaks of conversations and says nothing of poetry's metadata dropout
    assert "1 conversations" in done.stdout and "documents" not in done.stdout and "metadata" not in done.stdout
    assert "rejected records in" in done.stdout
    # the policy is part of the output's identity, like any option
    again = pack(qwen_dir, source, out)
    assert again.exit_code == 2 and "different config.on_error" in again.stderr


def test_the_manifest_names_the_templates_own_eos_and_a_weight_0_answer_is_not_trained_on(qwen_dir, tmp_path):
    out = tmp_path / "out"
    assert pack(qwen_dir, write(tmp_path / "chats.jsonl", GOOD), out).exit_code == 0
    manifest = read_manifest(out / "train")
    assert manifest["eos_id"] == 151645 and manifest["bos_id"] is None  # <|im_end|>; ChatML has no bos
    ids, mask = TokenFiles(out / "train").document(0)
    from tokenizers import Tokenizer

    qwen = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    assert qwen.decode(ids[mask].tolist(), skip_special_tokens=False) == "Hello again.<|im_end|>"
    assert "Hello." in qwen.decode(ids.tolist())  # the weight-0 answer stays, as context


def test_pack_keeping_no_conversation_exits_2_with_the_reason(qwen_dir, tmp_path):
    source = write(tmp_path / "chats.jsonl", FAKE)
    done = pack(qwen_dir, source, tmp_path / "out")
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert "pack kept none of its 1 records (dropped: special_token_text 1)" in done.stderr
    assert f"{source}:1: record 'fake': turn 1: content spells '<|im_end|>'" in done.stderr


def test_a_record_that_breaks_the_chat_contract_stops_pack_with_the_contracts_error(qwen_dir, tmp_path):
    """The same error, message and reason as every other step gives for it (`fuelline.formats.chat_record`)."""
    from fuelline.formats.chat_record import ChatRecordError, check
    from fuelline.pack.packer import PackConfig, pack as pack_records

    bad = {"id": "", "conversations": [{"role": "user", "content": "Hi"}]}
    source = write(tmp_path / "chats.jsonl", GOOD, bad)
    done = pack(qwen_dir, source, tmp_path / "out", "--on-error", "raise")
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    drop = check(bad)
    assert f"error: {source}:2: {drop.detail} ({drop.reason})" in done.stderr
    config = PackConfig(template="chat", chat_template="chatml", val_fraction=0)
    try:
        pack_records([source], qwen_dir, tmp_path / "api", config, workers=1, progress=False)
    except ChatRecordError as e:
        assert (e.where, e.reason, e.detail) == (f"{source}:2", drop.reason, drop.detail)
    else:
        raise AssertionError("pack accepted a record without an id")
