"""The format module writes the target cache's manifest: version 2 as the reference trainer reads
it, the fuelline format with its own fields, both accepted by the format's own reader."""

import orjson
import pytest

from fuelline.formats.target_cache import (ALIGN, DEEPSPEC_V2, FUELLINE, MANIFEST, V2_REQUIRED, Layout,
                                           cache_manifest, read_manifest, write_manifest)

BUILD = {"target_model_name_or_path": "Qwen/Qwen3-4B", "chat_template": "qwen3", "max_length": 4096,
         "min_loss_tokens": 14, "num_tokens": 700, "num_loss_tokens": 300, "model_fingerprint": "ab" * 32,
         "tokenizer_fingerprint": "cd" * 32, "sources": [{"path": "a.jsonl", "size": 10, "sha256": "ef" * 32}]}


@pytest.mark.parametrize("fmt", [DEEPSPEC_V2, FUELLINE])
def test_manifest_round_trips_through_the_reader(tmp_path, fmt):
    layout = Layout(fmt, num_layers=3, hidden_size=64)
    manifest = cache_manifest(layout, [-1, 0, 2], [(1000, 4), (1200, 3)], BUILD)
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    text = (tmp_path / MANIFEST).read_bytes()
    assert text == orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    assert set(V2_REQUIRED) <= set(manifest) and manifest["num_samples"] == 7
    assert manifest["index_record_size"] == 56 and manifest["target_layer_ids"] == [-1, 0, 2]
    assert [s["file_name"] for s in manifest["shards"]] == ["shard-00000.bin", "shard-00001.bin"]


def test_version_2_carries_only_the_reference_fields_and_the_source_paths():
    manifest = cache_manifest(Layout(DEEPSPEC_V2, 1, 64), [1], [(10, 1)], BUILD)
    assert manifest["version"] == 2 and "format" not in manifest and "alignment" not in manifest
    assert manifest["source_jsonl_paths"] == ["a.jsonl"] and manifest["shards"] == [{"shard_id": 0,
                                                                                     "file_name": "shard-00000.bin"}]


def test_fuelline_names_its_alignment_checksum_and_scales():
    manifest = cache_manifest(Layout(FUELLINE, 1, 64, "float8_e4m3fn"), [1], [(640, 2)], BUILD)
    assert manifest["alignment"] == ALIGN and manifest["checksum"] == "xxh3_64"
    assert manifest["scale_dtype"] == "float32" and manifest["sources"] == BUILD["sources"]
    assert manifest["shards"] == [{"shard_id": 0, "file_name": "shard-00000.bin", "num_bytes": 640, "num_samples": 2}]
