"""Integers beyond 64 bits survive reading and writing records (issue 36 class 1): orjson reads
123456789012345678901234567890 as 1.2345678901234568e+29 and refuses to write it."""

import orjson
import pytest

from fuelline.io import iter_file_records, json_exact
from fuelline.io.writers import JsonlZstWriter, ParquetWriter

BIG = {"n": 123456789012345678901234567890, "m": -9223372036854775809, "fits": 2**64 - 1, "f": 0.1,
       "digits in a string": "12345678901234567890123"}


def test_records_with_big_integers_are_read_and_written_exactly(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"a": 1}\n' + json_exact.dumps(BIG) + b'\n{"b": 1.5e+300}\n')
    assert [r for _, r in iter_file_records(source)] == [{"a": 1}, BIG, {"b": 1.5e300}]
    assert type(next(r for _, r in iter_file_records(source) if "n" in r)["n"]) is int
    writer = JsonlZstWriter(tmp_path / "out.jsonl.zst")
    for _, record in iter_file_records(source):
        writer.write(record)
    writer.close()
    assert [r for _, r in iter_file_records(tmp_path / "out.jsonl.zst")] == [{"a": 1}, BIG, {"b": 1.5e300}]


def test_ordinary_values_are_orjsons_own_bytes():
    value = {"s": "é\u2028\x1f", "f": [0.1, 1e-7, 3.0], "i": -(2**63), "u": 2**64 - 1, "t": True, "z": None}
    assert json_exact.dumps(value) == orjson.dumps(value) and json_exact.loads(orjson.dumps(value)) == value
    assert json_exact.dumps({"n": 10**30}) == b'{"n":1000000000000000000000000000000}'


def test_parquet_refuses_an_integer_it_cannot_store_naming_the_file(tmp_path):
    writer = ParquetWriter(tmp_path / "out.parquet")
    writer.write(BIG)
    with pytest.raises(ValueError, match="out.parquet: a record holds an integer beyond 64 bits.*jsonl.zst"):
        writer.close()
    assert not list(tmp_path.iterdir())
