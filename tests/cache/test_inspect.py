"""verify_cache, cache_info and validate_for_draft, and how the reader and the verifier meet a
damaged cache: each kind of damage is a CacheFormatError (never another exception) naming the
file and the sample, and a problem in verify_cache's list."""

import json

import numpy as np
import orjson
import pytest

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.inspect import cache_info, format_info, validate_for_draft, verify_cache
from fuelline.formats.target_cache import (BF16, DEEPSPEC_V2, FP8, FUELLINE, FUELLINE_INDEX, INDEX, MANIFEST,
                                           V2_INDEX, CacheFormatError, Layout, shard_name)
from fuelline.formats.target_cache_checks import LIMIT

from .synthetic import TARGET_MODEL, write_cache

# 12 samples in 3 shards: samples 0-3 in shard 0, 4-7 in shard 1, 8-11 in shard 2.


def edit_index(path, fmt, change):
    dtype = FUELLINE_INDEX if fmt == FUELLINE else V2_INDEX
    index = np.fromfile(path / INDEX, dtype=dtype)
    change(index)
    index.tofile(path / INDEX)


def edit_manifest(path, change):
    manifest = orjson.loads((path / MANIFEST).read_bytes())
    change(manifest)
    (path / MANIFEST).write_bytes(orjson.dumps(manifest))


def truncate(file, nbytes):
    data = file.read_bytes()
    file.write_bytes(data[:-nbytes])


def flip_byte(path, sample, fmt):
    """Flip one byte of a sample's last hidden state (not its id or masks: only the checksum sees it)."""
    index = np.fromfile(path / INDEX, dtype=FUELLINE_INDEX if fmt == FUELLINE else V2_INDEX)
    shard = path / shard_name(int(index["shard_id"][sample]))
    data = bytearray(shard.read_bytes())
    start = int(index["offset"][sample]) + Layout(fmt, 3, 8).relative_offsets(
        int(index["seq_len"][sample]), int(index["id_len"][sample]))["target_last_hidden_states"]
    data[start] ^= 0x40
    shard.write_bytes(bytes(data))


def set_field(fmt, name, sample, value):
    return lambda path: edit_index(path, fmt, lambda index: index[name].__setitem__(sample, value))


# (name, format, damage, what verify_cache says, when the reader fails: "open" | "checksum" (only
#  when it checks record checksums, as it does by default), what its CacheFormatError says). Everything but a record's
#  payload is checked when the cache is opened.
DAMAGE = [
    ("truncated shard", FUELLINE, lambda p: truncate(p / shard_name(1), 10),
     "shard-00001.bin: ", "open", r"shard-00001\.bin: 1,654 bytes, the manifest says 1664"),
    ("truncated shard v2", DEEPSPEC_V2, lambda p: truncate(p / shard_name(1), 10),
     "shard-00001.bin: sample 7: target_last_hidden_states", "open", r"shard-00001\.bin: sample 7: .*past the end"),
    ("truncated index", FUELLINE, lambda p: truncate(p / INDEX, 10),
     "samples.idx: size", "open", r"samples\.idx: size .* not a multiple"),
    ("a record short in the index", DEEPSPEC_V2, lambda p: truncate(p / INDEX, 56),
     "holds 11 records; the manifest says 12", "open", r"samples\.idx: holds 11 records"),
    ("flipped byte", FUELLINE, lambda p: flip_byte(p, 6, FUELLINE),
     "shard-00001.bin: sample 6: checksum mismatch", "checksum", r"shard-00001\.bin: sample 6: checksum mismatch"),
    ("wrong num_samples", FUELLINE, lambda p: edit_manifest(p, lambda m: m.update(num_samples=13)),
     "the manifest says 13 samples", "open", r"samples\.idx: holds 12 records; the manifest says 13"),
    ("missing shard", DEEPSPEC_V2, lambda p: (p / shard_name(2)).unlink(),
     "shard-00002.bin: missing or not a file (shard 2, 4 samples)", "open", r"shard-00002\.bin: missing .*4 samples"),
    ("a directory for a shard", FUELLINE, lambda p: (p / shard_name(0)).unlink() or (p / shard_name(0)).mkdir(),
     "shard-00000.bin: missing or not a file", "open", r"shard-00000\.bin: missing or not a file"),
    ("bad JSON manifest", FUELLINE, lambda p: (p / MANIFEST).write_text('{"version": 1,'),
     "manifest.json: not valid JSON", "open", r"manifest\.json: not valid JSON"),
    ("offset beyond the shard", FUELLINE, set_field(FUELLINE, "offset", 9, 1 << 20),
     "shard-00002.bin: sample 9: record at byte 1,048,576", "open", r"sample 9: index record checksum mismatch"),
    ("hidden offset beyond the shard v2", DEEPSPEC_V2, set_field(DEEPSPEC_V2, "target_hidden_states", 5, 2**63),
     "sample 5: target_hidden_states at byte", "open", r"samples\.idx: sample 5: target_hidden_states at byte"),
    ("shard id beyond num_shards", FUELLINE, set_field(FUELLINE, "shard_id", 3, 7),
     "samples.idx: sample 3: shard_id 7 is beyond the 3 shards", "open", r"sample 3: index record checksum mismatch"),
    ("sample id out of place", DEEPSPEC_V2, set_field(DEEPSPEC_V2, "sample_id", 2, 5),
     "samples.idx: record 2 holds sample_id 5", "open", r"samples\.idx: record 2 holds sample_id 5"),
    ("empty sample", FUELLINE, set_field(FUELLINE, "seq_len", 10, 0),
     "samples.idx: sample 10: seq_len 0", "open", r"sample 10: index record checksum mismatch"),
    ("record length off", FUELLINE, set_field(FUELLINE, "nbytes", 1, 64),
     "samples.idx: sample 1: record length 64 does not match", "open", r"sample 1: index record checksum mismatch"),
    ("wrong loss token count", FUELLINE, set_field(FUELLINE, "loss_tokens", 0, 1),
     "sample 0: the loss mask has 0 supervised tokens, the index says 1", "open", r"sample 0: index record checksum"),
    ("overlapping samples v2", DEEPSPEC_V2,
     lambda p: edit_index(p, DEEPSPEC_V2, lambda index: index.__setitem__(
         5, (5, *[index[4][name] for name in V2_INDEX.names[1:]]))),
     "shard-00001.bin: samples 4 and 5 overlap", "open", r"shard-00001\.bin: samples 4 and 5 overlap"),
    ("v2 tensors out of order", DEEPSPEC_V2, set_field(DEEPSPEC_V2, "loss_mask", 6, 0),
     "sample 6: target_hidden_states at byte", "open", r"sample 6: loss_mask at byte 0, but attention_mask ends"),
    ("a sample moved to another shard v2", DEEPSPEC_V2, set_field(DEEPSPEC_V2, "shard_id", 9, 0),
     "shard-00002.bin: sample 10 starts at byte", "open", r"shard-00000\.bin: .*overlap|shard-00002\.bin: sample 10"),
]


def read_everything(path, io):
    dataset = CacheDataset(path, io=io)
    for i in range(len(dataset)):
        dataset[i]


@pytest.mark.parametrize("name, fmt, damage, problem, fails, error", DAMAGE, ids=[d[0] for d in DAMAGE])
@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_damage_is_found_by_verify_and_named_by_the_reader(tmp_path, io, name, fmt, damage, problem, fails, error):
    write_cache(tmp_path, fmt=fmt, num_samples=12, num_shards=3, max_len=12)
    assert verify_cache(tmp_path) == [] and read_everything(tmp_path, io) is None
    damage(tmp_path)
    problems = verify_cache(tmp_path)
    assert any(problem in p for p in problems), problems
    if fails == "open":
        with pytest.raises(CacheFormatError, match=error) as raised:
            CacheDataset(tmp_path, io=io)
        assert str(tmp_path) in str(raised.value)
    else:
        dataset = CacheDataset(tmp_path, io=io, verify_checksums=False)  # unchecked, a damaged payload reads
        assert [dataset[i] for i in range(len(dataset))]
        with pytest.raises(CacheFormatError, match=error):
            read_everything(tmp_path, io)


def test_a_whole_cache_verifies_clean_and_problems_are_capped(tmp_path):
    for fmt, dtype in [(FUELLINE, BF16), (FUELLINE, FP8), (DEEPSPEC_V2, BF16)]:
        write_cache(tmp_path / f"{fmt}-{dtype}", fmt=fmt, hidden_dtype=dtype)
        assert verify_cache(tmp_path / f"{fmt}-{dtype}") == []
    path = tmp_path / "damaged"
    write_cache(path, num_samples=LIMIT + 7, num_shards=2)
    for sample in range(LIMIT + 7):
        flip_byte(path, sample, FUELLINE)
    problems = verify_cache(path)
    assert len(problems) == LIMIT + 1
    assert all("checksum mismatch" in p for p in problems[:LIMIT])
    assert problems[-1] == "… and 7 more problems of this kind: checksums"
    with pytest.raises(CacheFormatError, match="not a directory"):
        verify_cache(path / MANIFEST)


@pytest.mark.parametrize("fmt", [FUELLINE, DEEPSPEC_V2])
def test_cache_info_counts_what_was_written(tmp_path, fmt):
    written = write_cache(tmp_path, fmt=fmt, num_samples=9, num_shards=2)
    info = cache_info(tmp_path)
    lengths = [len(s["input_ids"]) for s in written]
    assert info["format"] == fmt and info["version"] == 2
    assert info["samples"] == 9 and info["shards"] == 2 and info["tokens"] == sum(lengths)
    assert info["supervised_tokens"] == sum(int(s["loss_mask"].sum()) for s in written)
    shard_bytes = sum((tmp_path / shard_name(k)).stat().st_size for k in range(2))
    assert info["total_bytes"] == shard_bytes + (tmp_path / INDEX).stat().st_size + (tmp_path / MANIFEST).stat().st_size
    assert info["bytes_per_token"] == shard_bytes / sum(lengths)
    assert info["seq_len"] == {"min": min(lengths), "median": float(np.median(lengths)), "max": max(lengths)}
    assert info["target_layer_ids"] == [2, 5, 9] and info["hidden_size"] == 8 and info["hidden_dtype"] == BF16
    assert info["target_model"] == TARGET_MODEL
    assert ("chat_template" in info) == ("max_length" in info) == (fmt == FUELLINE)
    text = format_info(info)
    assert f"samples          {9:,}" in text and f"{sum(lengths):,}" in text and TARGET_MODEL in text
    assert ("chat template    chatml" in text) == (fmt == FUELLINE)


def test_validate_for_draft_compares_layers_hidden_size_and_target_model(tmp_path):
    write_cache(tmp_path / "cache", num_samples=2, num_shards=1)
    cache = tmp_path / "cache"
    good = tmp_path / "draft.json"
    good.write_text(json.dumps({"target_layer_ids": [2, 5, 9], "hidden_size": 8,
                                "target_model_name_or_path": TARGET_MODEL, "num_hidden_layers": 1}))
    assert validate_for_draft(cache, good) == []
    nested = tmp_path / "draft.toml"
    nested.write_text(f'[model]\ntarget_layer_ids = [2, 5, 9]\nhidden_size = 8\n'
                      f'target_model_name_or_path = "{TARGET_MODEL}"\n[train]\nlr = 1e-4\n')
    assert validate_for_draft(cache, nested) == []
    assert validate_for_draft(cache, nested, target_model=TARGET_MODEL) == []

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"model": {"target_layer_ids": [1, 5, 9], "hidden_size": 4096,
                                           "target_model_name_or_path": "other/model"}}))
    problems = validate_for_draft(cache, wrong)
    assert len(problems) == 3
    assert "[2, 5, 9]" in problems[0] and "[1, 5, 9]" in problems[0]
    assert "hidden_size" in problems[1] and "8" in problems[1] and "4096" in problems[1]
    assert TARGET_MODEL in problems[2] and "other/model" in problems[2]
    overridden = validate_for_draft(cache, wrong, target_model=TARGET_MODEL)
    assert len(overridden) == 2 and not any("target_model" in p for p in overridden)

    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 8}))
    problems = validate_for_draft(cache, partial)
    assert len(problems) == 2
    assert "no target_layer_ids" in problems[0] and "no target_model_name_or_path" in problems[1]
    assert validate_for_draft(cache, partial, target_model=TARGET_MODEL) == [
        f"{partial}: the draft config has no target_layer_ids (the cache has [2, 5, 9])"]

    broken = tmp_path / "broken.toml"
    broken.write_text("hidden_size = ")
    assert len(validate_for_draft(cache, broken)) == 1 and "cannot read the draft config" in \
        validate_for_draft(cache, broken)[0]


def test_verify_and_info_refuse_a_directory_that_is_no_cache_alike(tmp_path):
    """Issue 36, first contact: `cache verify` exited 1 (a problem of a cache) where `cache info` exits 2."""
    from click.testing import CliRunner

    from fuelline.cli import main

    (tmp_path / "notes").mkdir()
    for command in ("verify", "info"):
        result = CliRunner().invoke(main, ["cache", command, str(tmp_path / "notes")])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"{tmp_path / 'notes' / MANIFEST}: missing: not a target cache" in result.output
