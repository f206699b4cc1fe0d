"""Packing documents into the token dataset format. `packed_poems` (tests/conftest.py) is the
reference pack of the poems; tests that damage a pack copy it."""

import os
import shutil
import subprocess
import sys

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.formats.tokens import TokenFiles, TokenFormatError, verify_token_dataset
from fuelline.pack import packer
from fuelline.pack.packer import PackConfig, pack
from fuelline.pipeline.workdir import StepOutputMismatch
from fuelline.tokenizer.train import SPECIAL_TOKENS, train_tokenizer

from ..conftest import POEMS as DOCS


def packed(poems, tokenizer_dir, out, **options):
    """The poems packed as `packed_poems` is, but for `options`."""
    workers = options.pop("workers", 1)
    pack(poems[0], tokenizer_dir, out, PackConfig(**options), workers=workers, progress=False, shard_size=1_000)
    return out


@pytest.fixture(scope="module")
def plain_pack(poems, tokenizer_dir, tmp_path_factory):
    """The poems packed with the plain template (read only)."""
    return packed(poems, tokenizer_dir, tmp_path_factory.mktemp("plain") / "out", template="plain")


def test_every_poetry_document_masks_exactly_its_metadata_prefix(packed_poems):
    out = packed_poems  # metadata_dropout 0.25
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    total = dropped = 0
    for split in ("train", "val"):
        files = TokenFiles(out / split)
        for k in range(files.num_documents):
            ids, mask = files.document(k)
            content = int(np.flatnonzero(ids == vocab["<|content|>"])[0])
            assert ids[0] == vocab["<s>"] and ids[-1] == vocab["</s>"]
            assert not mask[: content + 1].any() and mask[content + 1:].all()
            assert vocab["<|content|>"] not in ids[content + 1:].tolist()
            if content == 1:  # metadata dropped: <s><|content|>POEM</s>
                dropped += 1
            else:
                assert ids[1] == vocab["<|title|>"] and vocab["<|author|>"] in ids[:content].tolist()
            total += 1
    assert total == DOCS
    assert abs(dropped / total - 0.25) < 0.02
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["splits"]["val"]["documents"] + stats["splits"]["train"]["documents"] == DOCS
    assert abs(stats["splits"]["val"]["documents"] / DOCS - 0.05) < 0.01


def test_same_seed_same_bytes_whatever_the_workers(packed_poems, poems, tokenizer_dir, tmp_path):
    one = packed_poems  # one worker
    two = packed(poems, tokenizer_dir, tmp_path / "two", workers=2)
    other = packed(poems, tokenizer_dir, tmp_path / "other", seed=7)
    for split in ("train", "val"):
        for name in ("tokens.bin", "docs.idx", "mask.bin", "manifest.json"):
            assert (one / split / name).read_bytes() == (two / split / name).read_bytes()
    assert (one / "val" / "tokens.bin").read_bytes() != (other / "val" / "tokens.bin").read_bytes()


def test_plain_template_supervises_everything_without_a_mask_file(plain_pack):
    out = plain_pack
    files = TokenFiles(out / "train")
    assert files.manifest["mask"] is None and not (out / "train" / "mask.bin").exists()
    ids, mask = files.document(0)
    assert mask is None and ids[0] == 0 and ids[-1] == 1


def test_an_interrupted_pack_resumes_without_redoing_shards(packed_poems, poems, tokenizer_dir, tmp_path,
                                                           monkeypatch):
    reference = packed_poems
    real_merge = packer.merge_splits

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while merging")

    monkeypatch.setattr(packer, "merge_splits", killed)
    with pytest.raises(KeyboardInterrupt):
        packed(poems, tokenizer_dir, tmp_path / "out")
    assert len(list((tmp_path / "out" / "_work").glob("part-*.json"))) == 6  # every shard finished
    monkeypatch.setattr(packer, "merge_splits", real_merge)

    def no_tokenizer(*args):
        raise AssertionError("a finished shard was tokenized again")

    monkeypatch.setattr(packer, "_load_tokenizer", no_tokenizer)
    packed(poems, tokenizer_dir, tmp_path / "out")
    for split in ("train", "val"):
        for name in ("tokens.bin", "docs.idx", "mask.bin"):
            assert (tmp_path / "out" / split / name).read_bytes() == (reference / split / name).read_bytes()
    assert not (tmp_path / "out" / "_work").exists()


def test_a_pack_killed_after_its_stats_leaves_no_work_or_temp_files_once_rerun(packed_poems, poems, tokenizer_dir,
                                                                               tmp_path, monkeypatch):
    reference = packed_poems
    monkeypatch.setattr(packer, "_remove_leftovers", lambda output: None)  # killed right after stats.json
    out = packed(poems, tokenizer_dir, tmp_path / "out")
    monkeypatch.undo()
    stale = [out / "train" / ".tokens.bin.tmp-1-dead", out / "val" / ".docs.idx.tmp-2-dead"]
    for path in stale:
        path.write_bytes(b"half written")
    assert (out / "_work").is_dir()
    packed(poems, tokenizer_dir, out)  # the same command again
    assert not (out / "_work").exists() and not any(path.exists() for path in stale)
    for split in ("train", "val"):
        assert (out / split / "tokens.bin").read_bytes() == (reference / split / "tokens.bin").read_bytes()


def test_resuming_with_another_tokenizer_is_refused(packed_poems, poems, tokenizer_dir, tmp_path, monkeypatch):
    few = (tmp_path / "few.jsonl", poems[1][:1_000])  # one shard is enough to leave a pack unfinished
    few[0].write_bytes(b"".join(orjson.dumps(doc) + b"\n" for doc in few[1]))
    monkeypatch.setattr(packer, "merge_splits", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        packed(few, tokenizer_dir, tmp_path / "out")
    monkeypatch.undo()
    other = tmp_path / "other-tokenizer"
    train_tokenizer(few[0], other, vocab_size=800)
    with pytest.raises(StepOutputMismatch, match="different tokenizer_fingerprint"):
        packed(few, other, tmp_path / "out")
    done = shutil.copytree(packed_poems, tmp_path / "done")
    with pytest.raises(StepOutputMismatch, match="different tokenizer_fingerprint"):
        packed(poems, other, done)


def test_a_pack_of_documents_made_before_the_chat_defaults_changed_is_found_again(packed_poems, poems,
                                                                                  tokenizer_dir, tmp_path):
    """An earlier version recorded pack's shard_size (a run option now) and, for documents too, the
    chat-encoding options with pack's old defaults; neither decides a document's bytes."""
    done = shutil.copytree(packed_poems, tmp_path / "done")
    stats = orjson.loads((done / "stats.json").read_bytes())
    assert not {"shard_size", "chat_template"} & stats["identity"]["config"].keys()
    stats["identity"]["config"].update(shard_size=1_000, chat_template="chatml", max_length=0, min_loss_tokens=1)
    (done / "stats.json").write_bytes(orjson.dumps(stats))
    assert pack(poems[0], tokenizer_dir, done, PackConfig(), workers=1, progress=False)["resumed"]


def test_uint16_overflow_is_an_error_before_anything_is_written(poems, tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(70_000)}
    big = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    big.add_special_tokens(SPECIAL_TOKENS)
    (tmp_path / "big").mkdir()
    big.save(str(tmp_path / "big" / "tokenizer.json"))
    largest = 70_000 + len(SPECIAL_TOKENS) - 1  # the special tokens follow the 70,000 entries
    with pytest.raises(ValueError, match=rf"token id {largest:,} does not fit in uint16"):
        packed(poems, tmp_path / "big", tmp_path / "out", dtype="uint16")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def damaged(packed_poems, tmp_path):
    """A copy of the reference pack's train split, for a test to damage."""
    return shutil.copytree(packed_poems / "train", tmp_path / "train")


def test_verify_finds_truncation(damaged):
    data = (damaged / "tokens.bin").read_bytes()
    (damaged / "tokens.bin").write_bytes(data[:-10])
    with pytest.raises(TokenFormatError, match="truncated"):
        verify_token_dataset(damaged)


def test_verify_finds_a_flipped_byte(damaged):
    data = bytearray((damaged / "mask.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / "mask.bin").write_bytes(bytes(data))
    with pytest.raises(TokenFormatError, match="checksum mismatch"):
        verify_token_dataset(damaged)


def test_verify_finds_ids_beyond_the_vocabulary(damaged):
    from fuelline.formats.tokens import sha256_file

    tokens = np.fromfile(damaged / "tokens.bin", dtype="<u2")
    tokens[5] = 5_000  # vocabulary has 1,024 tokens
    tokens.tofile(damaged / "tokens.bin")
    manifest = orjson.loads((damaged / "manifest.json").read_bytes())
    manifest["files"]["tokens.bin"]["sha256"] = sha256_file(damaged / "tokens.bin")
    (damaged / "manifest.json").write_bytes(orjson.dumps(manifest))
    with pytest.raises(TokenFormatError, match="token id 5000 >= vocab_size 1024"):
        verify_token_dataset(damaged)


def test_cli_pack_with_a_shard_size_then_verify_and_inspect(poems, tokenizer_dir, tmp_path):
    def run(*args):
        return CliRunner().invoke(main, [str(a) for a in args])

    out = tmp_path / "out"
    result = run("pack", "-i", poems[0], "--tokenizer", tokenizer_dir, "-o", out, "--shard-size", "500", "-q", "-w", "2")
    assert result.exit_code == 0, (result.stderr, result.exception)
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert sum(stats["encoder"].values()) == -(-DOCS // 500)  # one encoder entry per shard
    assert "shard_size" not in stats["identity"]["config"]  # a run option: how it runs, not what it writes
    assert run("verify", out).stdout.count("checksums match") == 2
    shown = run("inspect", out, "--doc", "0")
    assert "[masked ] '<s>" in shown.stdout and "[trained]" in shown.stdout
    table = run("inspect", out, "--window", "0", "--seq-len", "64").stdout
    assert "-100" in table and "predict" in table
    manifest = orjson.loads((out / "train" / "manifest.json").read_bytes())
    del manifest["tokenizer"]["fingerprint"]  # a manifest from another writer: nothing to check the tokenizer by
    (out / "train" / "manifest.json").write_bytes(orjson.dumps(manifest))
    unchecked = run("inspect", out, "--doc", "0")
    assert unchecked.exit_code == 2 and "no tokenizer fingerprint" in unchecked.stderr
    assert "Traceback" not in unchecked.stderr
    (out / "val" / "docs.idx").write_bytes(b"\0" * 8)
    broken = run("verify", out)
    assert broken.exit_code == 2 and "docs.idx" in broken.stderr and "Traceback" not in broken.stderr


def _pack_files(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "stats.json"}


def test_tiktoken_packs_the_same_bytes_as_the_tokenizers_library(packed_poems, plain_pack, poems, tokenizer_dir,
                                                                 tmp_path):
    """The fast engine is an implementation detail: the output is byte for byte the one the
    tokenizer's own encoder gives (FUELLINE_ENCODER=tokenizers, in a fresh process that packs
    the poems with each template as `packed_poems` and `plain_pack` were)."""
    fast = {"poetry": packed_poems, "plain": plain_pack}
    for out in fast.values():
        assert set(orjson.loads((out / "stats.json").read_bytes())["encoder"]) == {"tiktoken"}
    references = {template: tmp_path / template for template in fast}
    outputs = {template: str(out) for template, out in references.items()}
    code = (f"from fuelline.pack.packer import PackConfig, pack\n"
            f"for template, out in {outputs!r}.items():\n"
            f"    print(pack({str(poems[0])!r}, {str(tokenizer_dir)!r}, out, PackConfig(template=template), "
            f"workers=1, progress=False, shard_size=1_000)['encoder'])")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FUELLINE_ENCODER": "tokenizers"},
                          capture_output=True, text=True, check=True)
    assert done.stdout.count("FUELLINE_ENCODER=tokenizers") == 2, done.stdout
    for template, out in fast.items():
        assert _pack_files(out) == _pack_files(references[template]), template
