"""`fuelline.formats.hf_dataset`: the files `datasets.save_to_disk` leaves, written with pyarrow, read
back as `load_from_disk` reads them (`datasets` is not installed here: the layout is restated in
the module's docstring and checked field by field), the same bytes every time."""

import json

import pyarrow as pa
import pytest

from fuelline.formats.hf_dataset import (DATA_FILE, INFO_FILE, STATE_FILE, DatasetDirectoryError, dataset_files,
                                         read_dataset)


def table(rows: int) -> pa.Table:
    ids = [list(range(i % 5)) for i in range(rows)]
    return pa.table({"input_ids": pa.array(ids, pa.list_(pa.int64())), "seq_len": pa.array([len(x) for x in ids],
                                                                                              pa.int64())})


def write(directory, files: dict[str, bytes]):
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)


def test_the_files_round_trip_in_batches_of_1000_rows_and_are_the_same_bytes_every_time(tmp_path):
    files = dataset_files(table(2500), format_type="torch")
    assert files == dataset_files(table(2500), format_type="torch") and set(files) == {DATA_FILE, INFO_FILE, STATE_FILE}
    write(tmp_path / "d", files)
    assert read_dataset(tmp_path / "d").equals(table(2500))
    stream = pa.ipc.open_stream(pa.memory_map(str(tmp_path / "d" / DATA_FILE)))
    assert [len(batch) for batch in stream] == [1000, 1000, 500]
    metadata = json.loads(stream.schema.metadata[b"huggingface"])
    sequence = {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "Sequence"}
    assert metadata == {"info": {"features": {"input_ids": sequence, "seq_len": {"dtype": "int64", "_type": "Value"}}}}
    assert json.loads(files[INFO_FILE])["features"] == metadata["info"]["features"]
    state = json.loads(files[STATE_FILE])
    assert state["_data_files"] == [{"filename": DATA_FILE}] and state["_format_type"] == "torch"
    assert state["_split"] is None and state["_format_columns"] is None and len(state["_fingerprint"]) == 16
    assert json.loads(dataset_files(table(3))[STATE_FILE])["_fingerprint"] != state["_fingerprint"]


def test_a_directory_load_from_disk_would_refuse_is_named(tmp_path):
    files = dataset_files(table(4))
    write(tmp_path / "d", {**files, INFO_FILE: files[INFO_FILE].replace(b'"int64"', b'"int32"', 1)})
    with pytest.raises(DatasetDirectoryError, match="dataset_info.json's features"):
        read_dataset(tmp_path / "d")
    write(tmp_path / "e", {k: v for k, v in files.items() if k != STATE_FILE})
    with pytest.raises(DatasetDirectoryError, match=f"{tmp_path / 'e'}: not a datasets directory"):
        read_dataset(tmp_path / "e")
    with pytest.raises(TypeError, match="no datasets feature declared here for the Arrow type string"):
        dataset_files(pa.table({"text": ["a"]}))
