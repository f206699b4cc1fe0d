"""Issue 25, class 8: a manifest or index that lies (plausible values, not garbage) is a
CacheFormatError naming the cache when it is opened, and a problem `verify_cache` lists; never
tensors of another shape or bytes of another field."""

import numpy as np
import orjson
import pytest

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.inspect import verify_cache
from fuelline.formats.target_cache import (DEEPSPEC_V2, FUELLINE, FUELLINE_INDEX, INDEX, MANIFEST, V2_INDEX,
                                           CacheFormatError, cache_format)
from fuelline.io.stage_layout import STATS_FILE

from .synthetic import write_cache

# write_cache's default cache: 12 samples in 3 shards, layers [2, 5, 9], hidden size 8.


def edit(path, file, change):
    if file == MANIFEST:
        manifest = orjson.loads((path / MANIFEST).read_bytes())
        change(manifest)
        (path / MANIFEST).write_bytes(orjson.dumps(manifest))
        return
    fuelline = cache_format(orjson.loads((path / MANIFEST).read_bytes())) == FUELLINE
    index = np.fromfile(path / INDEX, dtype=FUELLINE_INDEX if fuelline else V2_INDEX)
    change(index)
    index.tofile(path / INDEX)


def cache(tmp_path, fmt):
    write_cache(tmp_path, fmt=fmt)
    return tmp_path


def rejected(path, what):
    """Opening fails naming the cache and `what`; verify lists a problem."""
    with pytest.raises(CacheFormatError, match=what) as raised:
        CacheDataset(path)
    assert str(path) in str(raised.value)
    assert verify_cache(path), "verify_cache found nothing"


V2_LIES = [
    ("hidden_size halved", MANIFEST, lambda m: m.update(hidden_size=4), "back to back"),
    ("hidden_size + 1", MANIFEST, lambda m: m.update(hidden_size=9), "back to back"),
    ("a layer more", MANIFEST, lambda m: m.update(target_layer_ids=[2, 5, 9, 11]), "back to back"),
    ("hidden_dtype fp8", MANIFEST, lambda m: m.update(hidden_dtype="float8_e4m3fn"), "back to back"),
    ("seq_len + 1", INDEX, lambda i: i["seq_len"].__setitem__(5, i["seq_len"][5] + 1), "sample 5"),
    ("shard_id of another shard", INDEX, lambda i: i["shard_id"].__setitem__(5, 0), "shard-0000"),
    ("all offsets + 2", INDEX, lambda i: [i[f].__setitem__(5, i[f][5] + 2) for f in V2_INDEX.names[3:]],
     "shard-00001.bin"),
    ("last offset + 1", INDEX, lambda i: i["target_last_hidden_states"].__setitem__(5, i["target_last_hidden_states"]
                                                                                      [5] + 1), "sample 5"),
]


@pytest.mark.parametrize("name, file, change, what", V2_LIES, ids=[lie[0] for lie in V2_LIES])
def test_a_lying_v2_manifest_or_index_is_refused_when_opened(tmp_path, name, file, change, what):
    path = cache(tmp_path, DEEPSPEC_V2)
    CacheDataset(path)
    edit(path, file, change)
    rejected(path, what)


FUELLINE_LIES = [
    ("id_len + 1 (same aligned size)", INDEX, lambda i: i["id_len"].__setitem__(3, i["id_len"][3] + 1),
     "sample 3: index record checksum mismatch"),
    ("loss_tokens - 1", INDEX, lambda i: i["loss_tokens"].__setitem__(3, i["loss_tokens"][3] - 1),
     "sample 3: index record checksum mismatch"),
    ("another valid layer list", MANIFEST, lambda m: m.update(target_layer_ids=[2, 5, 8]),
     "not the manifest samples.idx was written with"),
    ("another target model", MANIFEST, lambda m: m.update(target_model_name_or_path="org/other"),
     "not the manifest samples.idx was written with"),
    ("a field removed", MANIFEST, lambda m: m.pop("chat_template"), "not the manifest samples.idx was written with"),
    ("version 1", MANIFEST, lambda m: m.update(version=1), "version 1, written before index and manifest checksums"),
]


@pytest.mark.parametrize("name, file, change, what", FUELLINE_LIES, ids=[lie[0] for lie in FUELLINE_LIES])
def test_a_lying_fuelline_manifest_or_index_is_refused_when_opened(tmp_path, name, file, change, what):
    path = cache(tmp_path, FUELLINE)
    record_ids = [CacheDataset(path)[i]["record_id"] for i in range(12)]
    assert record_ids[3] == "source/3·é" and len(record_ids[3].encode()) == 12  # 12 and 13 both align to 64
    edit(path, file, change)
    rejected(path, what)


@pytest.mark.parametrize("fmt", [FUELLINE, DEEPSPEC_V2])
def test_verify_and_the_reader_compare_the_manifest_with_the_builds_record(tmp_path, fmt):
    """A v2 manifest has no checksum of its own; the build's stats.json tells another valid
    layer list from the one it captured. What stats.json records beyond a v2 manifest's fields
    (token counts, fingerprints) is not asked of it."""
    path = cache(tmp_path, fmt)
    manifest = orjson.loads((path / MANIFEST).read_bytes())
    stats = {"records_out": 12, "cache": {"format": fmt, "layers": [2, 5, 9], "hidden_size": 8, "shards": 3,
                                          "hidden_dtype": "bfloat16", "tokens": 1234},
             "identity": {"model": manifest["target_model_name_or_path"], "model_fingerprint": "sha256:…"}}
    (path / STATS_FILE).write_bytes(orjson.dumps(stats))
    assert verify_cache(path) == []
    CacheDataset(path)
    edit(path, MANIFEST, lambda m: m.update(target_layer_ids=[2, 5, 8]))
    problems = verify_cache(path)
    assert any("target_layer_ids is [2, 5, 8], but stats.json records [2, 5, 9]" in p for p in problems), problems
    rejected(path, r"target_layer_ids is \[2, 5, 8\], but stats.json records \[2, 5, 9\]")


def test_the_default_read_checks_each_records_checksum(tmp_path):
    """docs/cache.md: every inconsistency is a CacheFormatError, a damaged payload included."""
    path = cache(tmp_path, FUELLINE)
    index = np.fromfile(path / INDEX, dtype=FUELLINE_INDEX)
    shard = path / "shard-00001.bin"
    data = bytearray(shard.read_bytes())
    data[int(index["offset"][6]) + int(index["nbytes"][6]) - 1 - 64] ^= 0x10  # in the record's last field
    shard.write_bytes(bytes(data))
    dataset = CacheDataset(path)
    with pytest.raises(CacheFormatError, match=r"shard-00001\.bin: sample 6: checksum mismatch"):
        dataset[6]


def test_an_index_shorter_than_one_record_is_a_problem_not_a_crash(tmp_path):
    path = cache(tmp_path, FUELLINE)
    (path / INDEX).write_bytes((path / INDEX).read_bytes()[:20])
    problems = verify_cache(path)
    assert problems and "samples.idx: size 20 is not a multiple" in problems[0]
    rejected(path, "size 20 is not a multiple")
