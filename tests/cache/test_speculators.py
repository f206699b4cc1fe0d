"""speculators' records and samples from a target cache: sample files and Arrow layouts made from
`speculators_record`/`speculators_arrow_tensors`, read with speculators' reader rule
(tests/cache/speculators_reader.py), and the zero-copy bridge `SpeculatorsDataset`, all give the
tensors derived here from the arrays the synthetic cache was written from, for both formats and
both hidden dtypes, through its collator's max-length cut too."""

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from safetensors.torch import save_file

from fuelline.cache.dataset import CacheDataset
from fuelline.cache.fp8 import error_bound
from fuelline.cache.speculators import (SpeculatorsDataset, speculators_arrow_row, speculators_arrow_tensors,
                                        speculators_record)
from fuelline.cache.trainer_states import NonFiniteState
from fuelline.formats.target_cache import BF16, FP8, FUELLINE

from . import speculators_reader as reader
from .synthetic import write_cache
from .test_specforge import HIDDEN, KINDS, LAYERS, cache, nan_bytes, poke, widened  # noqa: F401 (cache: the fixture)


def write_sample_files(cache, out: Path):
    """One data_{i}.pt a sample and sample_lengths.json, as speculators' generator lays them out."""
    out.mkdir()
    lengths = {}
    for i, sample in enumerate(CacheDataset(cache)):
        torch.save(speculators_record(sample, where=(cache, i)), out / f"data_{i}.pt")
        lengths[str(i)] = int(sample["input_ids"].shape[0])
    (out / "sample_lengths.json").write_text(json.dumps(lengths))


def write_arrow(cache, out: Path):
    """The Arrow layout as `datasets.save_to_disk` in torch format leaves it, with hs_{i}.safetensors."""
    (out / "hidden_states").mkdir(parents=True)
    rows = []
    for i, sample in enumerate(CacheDataset(cache)):
        rows.append(speculators_arrow_row(sample))
        save_file(speculators_arrow_tensors(sample, where=(cache, i)), out / "hidden_states" / f"hs_{i}.safetensors")
    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                        ("seq_len", pa.int64())])
    with pa.OSFile(str(out / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, schema) as stream:
        stream.write_table(pa.Table.from_pylist(rows, schema=schema))
    (out / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                "_format_type": "torch", "_format_columns": None}))


def expected_item(written: dict, dtype: str) -> dict:
    """speculators' dataset item for one written sample, from its arrays."""
    n = len(written["input_ids"])
    return {"hidden_states": widened(written, "target_hidden_states", dtype),
            "input_ids": torch.from_numpy(written["input_ids"].astype(np.int64)),
            "verifier_last_hidden_states": widened(written, "target_last_hidden_states", dtype),
            "loss_mask": torch.from_numpy(written["loss_mask"].astype(np.int64)),
            "lengths": torch.tensor([n]), "position_ids": torch.arange(n)}


def assert_same(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.equal(got[key], value), key


def index_of(path: str) -> int:
    return int(re.search(r"data_(\d+)\.pt$", path).group(1))


def test_sample_files_read_by_speculators_rule_equal_the_written_arrays_and_the_bridge(cache, tmp_path):
    path, fmt, dtype, written = cache
    write_sample_files(path, tmp_path / "out")
    files = reader.find_sample_files(tmp_path / "out")
    assert sorted(map(index_of, files)) == list(range(len(written)))  # sample_lengths.json is not a sample
    assert reader.sample_lengths(files) == [len(written[index_of(f)]["input_ids"]) for f in files]
    bridge = SpeculatorsDataset(path, max_len=2048)
    assert bridge.approx_lengths == [len(w["input_ids"]) for w in written]
    for file, item in reader.read_sample_files(tmp_path / "out").items():
        i = index_of(file)
        assert_same(item, expected_item(written[i], dtype))
        assert_same(bridge[i], item)


def test_the_arrow_layout_read_by_speculators_rule_equals_the_written_arrays_and_the_bridge(cache, tmp_path):
    path, fmt, dtype, written = cache
    write_arrow(path, tmp_path / "arrow")
    assert reader.arrow_lengths(tmp_path / "arrow") == [len(w["input_ids"]) for w in written]
    items = reader.read_arrow(tmp_path / "arrow")
    assert len(items) == len(written) and None not in items  # every file's token_ids match its row
    bridge = SpeculatorsDataset(path, max_len=2048)
    for i, item in enumerate(items):
        assert_same(item, expected_item(written[i], dtype))
        assert_same(bridge[i], item)
    stored = reader.load_arrow_sample(tmp_path / "arrow", 1, reader.arrow_rows(tmp_path / "arrow")[1])
    assert stored["input_ids"].dtype == torch.int64 and stored["hidden_states"].dtype == torch.bfloat16


def test_fp8_states_are_within_the_fp8_bound_of_what_the_target_computed(tmp_path):
    written = write_cache(tmp_path, hidden_dtype=FP8, num_samples=6, num_shards=2)
    dataset = CacheDataset(tmp_path)
    for i, w in enumerate(written):
        states = speculators_record(dataset[i], where=(tmp_path, i))["hidden_states"]
        for layer, got in enumerate(states[:-1]):
            source = torch.from_numpy(w["source_hidden"][:, layer * HIDDEN:(layer + 1) * HIDDEN])
            scales = torch.from_numpy(w["target_hidden_scales"][:, layer:layer + 1])
            # the format's bound, plus bf16's rounding of the widened value (2^-8 relative)
            assert ((got.float() - source).abs() <= error_bound(source, scales) + got.float().abs() / 256).all()
        source, scales = torch.from_numpy(w["source_last"]), torch.from_numpy(w["target_last_hidden_scales"][:, None])
        assert ((states[-1].float() - source).abs() <= error_bound(source, scales) + states[-1].float().abs() / 256).all()


@pytest.mark.parametrize("max_len", [1, 7, 19, 40])
def test_the_collators_max_length_cut_of_files_arrow_and_bridge_agree_with_the_arrays(cache, max_len, tmp_path):
    path, fmt, dtype, written = cache
    write_sample_files(path, tmp_path / "files")
    write_arrow(path, tmp_path / "arrow")
    by_index = {index_of(f): item for f, item in reader.read_sample_files(tmp_path / "files").items()}
    arrow, bridge = reader.read_arrow(tmp_path / "arrow"), SpeculatorsDataset(path, max_len=max_len)
    for batch in ([1], [3, 4, 5], list(range(len(written)))):  # 1: the 19-token sample, alone
        from_files = reader.collate([by_index[i] for i in batch], max_len)
        assert_same(reader.collate([arrow[i] for i in batch], max_len), from_files)
        assert_same(reader.collate([bridge[i] for i in batch], max_len), from_files)
    i = 1
    w, n = written[i], min(len(written[i]["input_ids"]) - 1, max_len)  # the shift drops one token
    alone = reader.collate([by_index[i]], max_len)
    assert alone["input_ids"][0, :n].tolist() == w["input_ids"][1:n + 1].tolist()
    assert alone["loss_mask"][0, :n].tolist() == w["loss_mask"][1:n + 1].tolist()
    assert torch.equal(alone["hidden_states"][0, :n], widened(w, "target_hidden_states", dtype)[:n])
    assert torch.equal(alone["verifier_last_hidden_states"][0, :n],
                       widened(w, "target_last_hidden_states", dtype)[1:n + 1])
    assert alone["document_ids"][0].tolist() == [0] * n + [-1] * (max_len - n)
    assert not alone["input_ids"][0, n:].any()  # zero padding past the sample


def test_the_record_holds_fresh_int64_and_bf16_tensors_layers_then_the_last(cache):
    path, fmt, dtype, written = cache
    sample = CacheDataset(path)[3]
    record = speculators_record(sample, where=(path, 3))
    n = len(written[3]["input_ids"])
    assert list(record) == ["input_ids", "loss_mask", "hidden_states"]
    assert record["input_ids"].dtype == record["loss_mask"].dtype == torch.int64
    assert len(record["hidden_states"]) == LAYERS + 1
    everything = torch.cat(record["hidden_states"], dim=-1)
    assert torch.equal(everything[:, :-HIDDEN], widened(written[3], "target_hidden_states", dtype))
    assert torch.equal(everything[:, -HIDDEN:], widened(written[3], "target_last_hidden_states", dtype))
    for value in (record["input_ids"], record["loss_mask"], *record["hidden_states"]):
        assert value.is_contiguous()
        # storage of its own, exactly its size: torch.save writes nothing else
        assert value.untyped_storage().nbytes() == value.numel() * value.element_size()
    assert [tuple(s.shape) for s in record["hidden_states"]] == [(n, HIDDEN)] * (LAYERS + 1)
    stacked = speculators_arrow_tensors(sample, where=(path, 3))
    assert stacked["hidden_states"].shape == (n, LAYERS + 1, HIDDEN) and stacked["hidden_states"].is_contiguous()
    assert torch.equal(stacked["hidden_states"].flatten(1), everything)
    assert speculators_arrow_row(sample) == {"input_ids": written[3]["input_ids"].tolist(),
                                             "loss_mask": written[3]["loss_mask"].tolist(), "seq_len": n}


def test_a_sample_without_its_last_hidden_state_is_refused_by_name(cache):
    path, fmt, dtype, written = cache
    sample = {k: v for k, v in CacheDataset(path)[3].items() if k != "target_last_hidden_states"}
    for make in (speculators_record, speculators_arrow_tensors):
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: sample 3 has no target_last_hidden_states, "
                                             "the last hidden state speculators trains against"):
            make(sample, where=(path, 3))


@pytest.mark.parametrize("fmt,dtype", KINDS, ids=lambda k: str(k))
def test_a_nan_in_a_state_is_an_error_naming_cache_sample_record_and_which_state(fmt, dtype, tmp_path):
    written = write_cache(tmp_path, fmt=fmt, hidden_dtype=dtype, num_samples=6, num_shards=2)
    poke(tmp_path, 4, "target_hidden_states", 0, nan_bytes(dtype), reseal=True)
    poke(tmp_path, 2, "target_last_hidden_states", 0, nan_bytes(dtype), reseal=True)
    named = f" \\(record id '{re.escape(written[4]['record_id'])}'\\)" if fmt == FUELLINE else ""
    dataset, bridge = CacheDataset(tmp_path), SpeculatorsDataset(tmp_path, max_len=8)
    with pytest.raises(NonFiniteState, match=f"^{re.escape(str(tmp_path))}: sample 4{named}: hidden_states "
                                             r"\(captured layers\) holds 1 NaN"):
        speculators_record(dataset[4], where=(tmp_path, 4))
    with pytest.raises(NonFiniteState, match=r"sample 2.*: hidden_states \(last hidden state\) holds 1 NaN"):
        speculators_arrow_tensors(dataset[2], where=(tmp_path, 2))
    with pytest.raises(NonFiniteState, match="sample 4"):
        bridge[4]
    assert bridge[3]["hidden_states"].isfinite().all()


def test_the_bridge_views_bf16_in_place_splits_like_arrow_dataset_transforms_and_pickles(cache):
    path, fmt, dtype, written = cache
    bridge = SpeculatorsDataset(path, max_len=16)
    item = bridge[1]
    if dtype == BF16:  # a view of the cache's mapping, no copy at all
        assert item["hidden_states"].data_ptr() == bridge.cache[1]["target_hidden_states"].data_ptr()
    train, val = SpeculatorsDataset(path, 16, split_ratio=0.9), SpeculatorsDataset(path, 16, split_ratio=-0.1)
    assert (len(train), len(val)) == (10, 2)  # int(12 * 0.9) and 12 - int(12 * 0.9)
    assert train.approx_lengths + val.approx_lengths == bridge.approx_lengths
    assert_same(val[0], bridge[10])
    with pytest.raises(IndexError):
        val[2]
    noisy = SpeculatorsDataset(path, 16, transform=lambda d: {**d, "hidden_states": d["hidden_states"] + 1})
    assert torch.equal(noisy[1]["hidden_states"], item["hidden_states"] + 1)
    again = pickle.loads(pickle.dumps(val))  # as its DataLoader's spawned workers get it
    assert len(again) == 2 and again.approx_lengths == val.approx_lengths
    assert_same(again[1], bridge[11])
    float32 = SpeculatorsDataset(path, 16, hidden_states_dtype=torch.float32)[1]
    assert float32["hidden_states"].dtype == float32["verifier_last_hidden_states"].dtype == torch.float32
    for bad in (0, -1.0, 1.5):
        with pytest.raises(ValueError, match="split_ratio must be in"):
            SpeculatorsDataset(path, 16, split_ratio=bad)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        SpeculatorsDataset(path, 0)
