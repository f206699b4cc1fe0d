"""A Hugging Face `datasets` directory as `Dataset.save_to_disk` lays it out, written and read with
pyarrow alone (`datasets` is not a dependency of fuelline; speculators' Arrow layout is read with
its `load_from_disk`).

The directory holds three files:

    data-00000-of-00001.arrow  the table, an Arrow IPC *stream* (what `load_from_disk` memory-maps),
                               its schema's metadata {"huggingface": {"info": {"features": …}}}
    dataset_info.json          {"citation", "description", "features", "homepage", "license"}: the
                               features must match the table's types, or `load_from_disk` refuses it
    state.json                 the data files, the fingerprint (any hex string: here the xxh3 of
                               the table's bytes) and the format `load_from_disk` sets again
                               (`set_format(type="torch")` before saving leaves "torch" there:
                               speculators' preparation does, and its reader relies on it)

Features are written as `datasets` 2.x and 3.x write them (`Sequence` of `Value`), which 4.x
still reads. Only the column types the exports need are declared: int64, and lists of int64.
The table is written in record batches of 1,000 rows, as `datasets`' writer does, so that no
batch's list offsets (32-bit) overflow. Every byte depends on the table only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fuelline.formats.target_cache import checksum

DATA_FILE, INFO_FILE, STATE_FILE = "data-00000-of-00001.arrow", "dataset_info.json", "state.json"
BATCH_ROWS = 1000


class DatasetDirectoryError(ValueError):
    """A directory that `load_from_disk` would not read as we wrote it."""


def _feature(kind) -> dict:
    import pyarrow as pa

    if kind == pa.int64():
        return {"dtype": "int64", "_type": "Value"}
    if pa.types.is_list(kind) and kind.value_type == pa.int64():
        return {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "Sequence"}
    raise TypeError(f"no datasets feature declared here for the Arrow type {kind}")


def features(schema) -> dict:
    """The `datasets` features of a table's schema (column order kept)."""
    return {field.name: _feature(field.type) for field in schema}


def dataset_files(table, format_type: str | None = None) -> dict[str, bytes]:
    """The files of `table` (a pyarrow Table) as `save_to_disk` writes them: name -> bytes;
    `format_type`: the format the dataset had when saved (None, "torch", "numpy", ...)."""
    import pyarrow as pa

    feats = features(table.schema)
    schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {"features": feats}})})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in table.cast(schema).to_batches(max_chunksize=BATCH_ROWS):
            writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    info = {"citation": "", "description": "", "features": feats, "homepage": "", "license": ""}
    state = {"_data_files": [{"filename": DATA_FILE}], "_fingerprint": f"{checksum(data):016x}",
             "_format_columns": None, "_format_kwargs": {}, "_format_type": format_type, "_output_all_columns": False,
             "_split": None}
    return {DATA_FILE: data, INFO_FILE: json.dumps(info, indent=2).encode() + b"\n",
            STATE_FILE: json.dumps(state, indent=2, sort_keys=True).encode() + b"\n"}


def read_dataset(directory: str | os.PathLike):
    """The table of a `save_to_disk` directory, read as `load_from_disk` reads it: state.json's data
    files in order, each an Arrow stream, memory-mapped; the features of dataset_info.json must be
    the table's. A missing or unreadable file is a `DatasetDirectoryError` naming it."""
    import pyarrow as pa

    directory = Path(directory)
    try:
        state = json.loads((directory / STATE_FILE).read_bytes())
        info = json.loads((directory / INFO_FILE).read_bytes())
        tables = [pa.ipc.open_stream(pa.memory_map(str(directory / f["filename"]))).read_all()
                  for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as e:
        raise DatasetDirectoryError(f"{directory}: not a datasets directory as save_to_disk writes it: {e}") from None
    table = pa.concat_tables(tables)
    if info.get("features") != features(table.schema):
        raise DatasetDirectoryError(f"{directory}: {INFO_FILE}'s features {info.get('features')} are not the "
                                    f"table's {features(table.schema)}")
    return table
