"""Reading and writing records: streaming readers, atomic writers, the JSONL line index."""

from fuelline.io.atomic import atomic_write, write_bytes_atomic
from fuelline.io.jsonl_index import JsonlIndex
from fuelline.io.paths import expand_inputs
from fuelline.io.readers import RecordError, iter_file_records, read_records
from fuelline.io.rejects import Rejects
from fuelline.io.streams import open_binary
from fuelline.io.writers import JsonlZstWriter, ParquetWriter, open_writer

__all__ = [
    "JsonlIndex",
    "JsonlZstWriter",
    "ParquetWriter",
    "RecordError",
    "Rejects",
    "atomic_write",
    "expand_inputs",
    "iter_file_records",
    "open_binary",
    "open_writer",
    "read_records",
    "write_bytes_atomic",
]
