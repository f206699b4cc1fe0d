"""SpecForge's records and samples from a target cache: the exported files read with SpecForge's
reader rule (tests/cache/specforge_reader.py), the zero-copy bridge `SpecForgeDataset` and
`CacheDataset` widened all give the tensors derived here from the arrays the synthetic cache was
written from (values, dtypes, shapes), for every method, both formats and both hidden dtypes."""

import pickle
import re

import numpy as np
import pytest
import torch

from fuelline.cache.dataset import CacheDataset, widen_hidden
from fuelline.cache.export_specforge import SpecForgeExportConfig, export_specforge
from fuelline.cache.specforge import METHODS, NonFiniteState, SpecForgeDataset, specforge_record
from fuelline.formats.target_cache import (BF16, DEEPSPEC_V2, FP8, FUELLINE, INDEX, CacheFormatError, checksum,
                                           layout_of, read_manifest, seal_index, shard_name)

from . import specforge_reader
from .synthetic import write_cache

KINDS = [(FUELLINE, BF16), (FUELLINE, FP8), (DEEPSPEC_V2, BF16)]
LAYERS, HIDDEN = 3, 8


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def cache(request, tmp_path_factory):
    fmt, dtype = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{dtype}")
    return path, fmt, dtype, write_cache(path, fmt=fmt, hidden_dtype=dtype, num_samples=12, num_shards=3)


def widened(written: dict, name: str, dtype: str) -> torch.Tensor:
    """A stored state field in bf16, from the written arrays: bf16 bits as they are; e4m3 values
    times the scale of their token (and layer), rounded once to bf16."""
    stored = torch.from_numpy(np.ascontiguousarray(written[name]))
    if dtype == BF16:
        return stored.view(torch.bfloat16)
    values = stored.view(torch.float8_e4m3fn).float()
    scales = torch.from_numpy(written[name.replace("states", "scales")]).reshape(values.shape[0], -1, 1)
    return (values.reshape(values.shape[0], scales.shape[1], -1) * scales).reshape(values.shape).bfloat16()


def expected_item(written: dict, method: str, dtype: str, max_len: int) -> dict:
    """SpecForge's item for one written sample, from its arrays (the table of fuelline.cache.specforge)."""
    n = min(len(written["input_ids"]), max_len)
    ids = torch.from_numpy(written["input_ids"][:n].astype(np.int64))[None]
    mask = torch.from_numpy(written["loss_mask"][:n].astype(np.int64))[None]
    aux = widened(written, "target_hidden_states", dtype)[:n][None]
    last = widened(written, "target_last_hidden_states", dtype)[:n][None]
    if method == "eagle3":
        mask[0, n - 1] = 0
        return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones(1, n, dtype=torch.int64),
                "hidden_state": aux, "target": last}
    item = {"input_ids": ids, "loss_mask": mask, "hidden_states": aux}
    return {**item, "target_last_hidden_states": last} if method == "dspark" else item


def assert_same(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.equal(got[key], value), key


def sample_of(path: str) -> int:
    return int(re.search(r"data_(\d+)\.ckpt", path).group(1))


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("method", METHODS)
def test_specforges_reader_the_bridge_and_the_dataset_agree_with_the_written_arrays(cache, method, compress,
                                                                                    tmp_path):
    path, fmt, dtype, written = cache
    export_specforge(path, tmp_path / "out", SpecForgeExportConfig(method=method, compress=compress, compression_level=1),
                     workers=2, progress=False)
    items = specforge_reader.read_all(tmp_path / "out", method)
    assert sorted(map(sample_of, items)) == list(range(len(written)))
    assert list(items)[:3] == [str(tmp_path / "out" / "rows_0-2000" / f"data_{i}.ckpt{'.gz' * compress}")
                               for i in (0, 1, 10)]  # its order: paths sorted as strings
    bridge, dataset = SpecForgeDataset(path, method), CacheDataset(path)
    for file, item in items.items():
        i = sample_of(file)
        assert_same(item, expected_item(written[i], method, dtype, 2048))
        assert_same(bridge[i], item)
        plain = widen_hidden(dataset[i])  # CacheDataset's sample, widened: the stored states themselves
        states = ("hidden_state", "target") if method == "eagle3" else ("hidden_states", "target_last_hidden_states")
        assert torch.equal(item[states[0]][0], plain["target_hidden_states"])
        if method != "dflash":
            assert torch.equal(item[states[1]][0], plain["target_last_hidden_states"])


@pytest.mark.parametrize("method", METHODS)
def test_max_len_cuts_every_field_and_eagle3_zeroes_the_last_position_of_the_cut(cache, method, tmp_path):
    path, fmt, dtype, written = cache
    max_len = 7
    export_specforge(path, tmp_path / "out", SpecForgeExportConfig(method=method), workers=1, progress=False)
    bridge = SpecForgeDataset(path, method, max_len=max_len)
    cut = 0
    for file, item in specforge_reader.read_all(tmp_path / "out", method, max_len).items():
        i = sample_of(file)
        assert_same(bridge[i], item)
        assert_same(item, expected_item(written[i], method, dtype, max_len))
        n = min(len(written[i]["input_ids"]), max_len)
        assert item["input_ids"].shape == (1, n)
        mask = written[i]["loss_mask"][:n].astype(np.int64)
        if method == "eagle3":
            cut += int(mask[-1])  # a supervised position the reader takes out
            mask[-1] = 0
        assert item["loss_mask"][0].tolist() == mask.tolist()
    assert method != "eagle3" or cut > 0  # the zeroing was seen to change something


def test_the_bridge_views_bf16_states_in_place_and_widens_only_what_max_len_keeps(cache):
    path, fmt, dtype, written = cache
    bridge = SpecForgeDataset(path, "dspark", max_len=5)
    i = 1  # the longest sample (19 tokens)
    item = bridge[i]
    states = item["hidden_states"]
    if dtype == BF16:  # a view of the cache's mapping, no copy at all
        assert states.data_ptr() == bridge.cache[i]["target_hidden_states"].data_ptr()
    else:  # widened: 5 tokens' worth of bf16, not 19
        assert states.untyped_storage().nbytes() == 5 * LAYERS * HIDDEN * 2
        assert item["target_last_hidden_states"].untyped_storage().nbytes() == 5 * HIDDEN * 2
    again = pickle.loads(pickle.dumps(bridge))  # as DataLoader workers get it
    assert len(again) == len(bridge) == len(written)
    assert_same(again[i], item)


def test_the_record_holds_fresh_int64_and_bf16_tensors_and_the_methods_keys(cache):
    path, fmt, dtype, written = cache
    sample = CacheDataset(path)[3]
    keys = {"eagle3": {"aux_hidden_state", "hidden_state"}, "dspark": {"hidden_states", "target_last_hidden_states"},
            "dflash": {"hidden_states"}}
    for method in METHODS:
        record = specforge_record(sample, method, where=(path, 3))
        assert set(record) == {"input_ids", "loss_mask"} | keys[method]
        n = len(written[3]["input_ids"])
        shapes = {"input_ids": (n,), "loss_mask": (n,), "aux_hidden_state": (1, n, LAYERS * HIDDEN),
                  "hidden_states": (1, n, LAYERS * HIDDEN), "hidden_state": (1, n, HIDDEN),
                  "target_last_hidden_states": (1, n, HIDDEN)}
        for key, value in record.items():
            assert value.shape == shapes[key]
            assert value.dtype == (torch.int64 if key in ("input_ids", "loss_mask") else torch.bfloat16)
            # storage of its own, exactly its size: torch.save writes nothing else
            assert value.untyped_storage().nbytes() == value.numel() * value.element_size()
    no_last = {k: v for k, v in sample.items() if k != "target_last_hidden_states"}
    with pytest.raises(ValueError, match="sample 3 has no target_last_hidden_states, which eagle3 trains on"):
        specforge_record(no_last, "eagle3", where=(path, 3))
    assert set(specforge_record(no_last, "dflash", where=(path, 3))) == {"input_ids", "loss_mask", "hidden_states"}
    with pytest.raises(ValueError, match="method must be one of eagle3, dspark, dflash"):
        SpecForgeDataset(path, "medusa")
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        SpecForgeDataset(path, max_len=0)


# Damaged caches: bytes changed in place (fuelline records re-checksummed and the index re-sealed
# when the change is meant to pass the checksums, as a cache built from overflowed states would).

def field_offset(path, sample: int, field: str) -> tuple[str, int]:
    """(shard file, absolute byte offset) of one field of one sample."""
    manifest = read_manifest(path)
    layout = layout_of(manifest)
    index = np.fromfile(path / INDEX, dtype=layout.index_dtype())
    record = index[sample]
    if layout.format == FUELLINE:
        offset = int(record["offset"]) + layout.relative_offsets(int(record["seq_len"]), int(record["id_len"]))[field]
    else:
        offset = int(record[field])
    return path / shard_name(int(record["shard_id"])), offset


def poke(path, sample: int, field: str, at: int, data: bytes, *, reseal: bool):
    shard, offset = field_offset(path, sample, field)
    with open(shard, "r+b") as f:
        f.seek(offset + at)
        f.write(data)
    manifest = read_manifest(path)
    if reseal and layout_of(manifest).format == FUELLINE:
        index = np.fromfile(path / INDEX, dtype=layout_of(manifest).index_dtype())
        start, length = int(index[sample]["offset"]), int(index[sample]["nbytes"])
        index[sample]["checksum"] = checksum(shard.read_bytes()[start: start + length])
        seal_index(index, manifest)
        (path / INDEX).write_bytes(index.tobytes())


def nan_bytes(dtype: str) -> bytes:
    """One NaN in the stored dtype: bf16 0x7fc0, e4m3 0x7f."""
    return np.array([0x7FC0], dtype="<u2").tobytes() if dtype == BF16 else b"\x7f"


@pytest.mark.parametrize("fmt,dtype", KINDS, ids=lambda k: str(k))
def test_a_nan_in_a_state_is_an_error_naming_cache_sample_record_and_key(fmt, dtype, tmp_path):
    written = write_cache(tmp_path, fmt=fmt, hidden_dtype=dtype, num_samples=6, num_shards=2)
    last = len(written[4]["input_ids"]) - 1
    poke(tmp_path, 4, "target_last_hidden_states", last * HIDDEN * (2 if dtype == BF16 else 1), nan_bytes(dtype),
         reseal=True)  # the last token's first value
    bridge = SpecForgeDataset(tmp_path, "eagle3")
    named = f" \\(record id '{re.escape(written[4]['record_id'])}'\\)" if fmt == FUELLINE else ""
    with pytest.raises(NonFiniteState, match=f"^{re.escape(str(tmp_path))}: sample 4{named}: hidden_state holds 1 NaN"):
        bridge[4]
    assert isinstance(NonFiniteState(tmp_path, 4, None, "k", 1), CacheFormatError)
    assert SpecForgeDataset(tmp_path, "dflash")[4]["hidden_states"].isfinite().all()  # dflash reads no last state
    if last:
        assert SpecForgeDataset(tmp_path, "eagle3", max_len=1)[4]["target"].isfinite().all()  # cut off: not read


def test_a_damaged_record_is_an_error_naming_the_sample_never_another_sample(tmp_path):
    write_cache(tmp_path, num_samples=6, num_shards=2)
    poke(tmp_path, 3, "target_hidden_states", 0, b"\x12\x34", reseal=False)
    bridge = SpecForgeDataset(tmp_path, "dspark")
    bridge[2]
    with pytest.raises(CacheFormatError, match="sample 3: checksum mismatch"):
        bridge[3]


def test_finite_states_whose_sum_overflows_are_not_taken_for_nan():
    """The NaN check sums first and counts only a non-finite sum; huge finite values overflow the sum."""
    huge = torch.full((4, 2 * 8), 3e38, dtype=torch.bfloat16)
    sample = {"input_ids": torch.arange(4, dtype=torch.int32), "loss_mask": torch.ones(4, dtype=torch.uint8),
              "target_hidden_states": huge, "target_last_hidden_states": huge[:, :8]}
    assert not torch.isfinite(huge.sum())
    record = specforge_record(sample, "eagle3", where=("cache", 0))
    assert torch.equal(record["aux_hidden_state"][0], huge)
    sample["target_hidden_states"] = huge.clone().index_fill_(1, torch.tensor([3]), float("inf"))
    with pytest.raises(NonFiniteState, match="sample 0: aux_hidden_state holds 4 NaN or Inf"):
        specforge_record(sample, "eagle3", where=("cache", 0))
